"""index.html: the report's README.md as one self-contained page (python-markdown), its figures embedded
as data URIs and its tables scrolling sideways on a narrow screen; no external URL, script or stylesheet.
"""

from __future__ import annotations

import base64
import xml.etree.ElementTree as etree
from pathlib import Path

import markdown

# The page's own style, inline: no external stylesheet, font or script. Tables scroll sideways in their
# wrapper on a narrow screen instead of widening the page; figures shrink to the screen's width.
HTML_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; line-height: 1.45; margin: 0 auto;
       max-width: 70rem; padding: 0.75rem; color: #1b1b1b; background: #fff; }
h1, h2, h3 { line-height: 1.2; }
img { max-width: 100%; height: auto; display: block; margin: 0.5rem 0; }
.table-wrap { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: 0.75rem 0; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.45rem; text-align: left; white-space: nowrap; }
th { background: #f0f0f0; position: sticky; top: 0; }
tr:nth-child(even) td { background: #fafafa; }
pre { overflow-x: auto; background: #f6f6f6; padding: 0.5rem; font-size: 0.8rem; }
code { font-size: 0.9em; overflow-wrap: anywhere; }
p, li { overflow-wrap: anywhere; }
details summary { cursor: pointer; font-weight: 600; }
"""


class _SelfContained(markdown.treeprocessors.Treeprocessor):
    """Embeds every local PNG/SVG image as a data URI (the page opens alone, offline) and wraps every
    table in a horizontally scrolling block (readable at phone width)."""

    def __init__(self, md, base: Path):
        super().__init__(md)
        self.base = base

    def run(self, root):
        for img in root.iter("img"):
            src = img.get("src", "")
            kind = {".png": "image/png", ".svg": "image/svg+xml"}.get(Path(src).suffix.lower())
            if kind is None or "://" in src:
                raise ValueError(f"index.html: image {src!r} is not a local PNG or SVG of the report")
            data = base64.b64encode((self.base / src).read_bytes()).decode("ascii")
            img.set("src", f"data:{kind};base64,{data}")
        for parent in list(root.iter()):
            for i, child in enumerate(list(parent)):
                if child.tag == "table":
                    wrap = etree.Element("div", {"class": "table-wrap"})
                    parent.remove(child)
                    wrap.append(child)
                    parent.insert(i, wrap)


class _SelfContainedExtension(markdown.Extension):
    def __init__(self, base: Path):
        super().__init__()
        self.base = base

    def extendMarkdown(self, md):
        md.treeprocessors.register(_SelfContained(md, self.base), "linvit_self_contained", 0)


def render_html(readme: str, report_dir: str | Path) -> str:
    """README.md's text as one self-contained HTML page (python-markdown with its tables, fenced code
    and md_in_html extensions), its figures read from `report_dir` and embedded."""
    body = markdown.markdown(readme, extensions=["tables", "fenced_code", "md_in_html",
                                                 _SelfContainedExtension(Path(report_dir))])
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>linvit report</title>\n<style>{HTML_STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")
