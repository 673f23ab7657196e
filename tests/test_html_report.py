"""report/index.html: self-contained (figures embedded, no external URL), opened in headless Chromium at
desktop and phone width (every image decoded, every table with rows, a screenshot that is not blank),
with the provenance section; and linvit.report.provenance on its own.

The browser is Debian's chromium with its chromedriver, driven by selenium (nothing downloaded at run
time). Without them the browser test skips locally and fails under CI=true.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import yaml

from linvit.figure_registry import figure_names
from linvit.report import ResultsError, write_report
from linvit.report import provenance
from conftest import patient
from test_report import CONFIG, build_results

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Without the background-networking flags Chromium stalls on a closed network; a fresh profile per run.
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")
WIDTHS = {"desktop": 1280, "phone": 390}
# Two measurements with a target and one without (which the "n of m meet" count leaves out).
BENCH = pd.DataFrame({"benchmark": ["plan", "plan", "plan"], "metric": ["dry_run_s", "jobs", "cpu_s"],
                      "value": [1.8123456789, 63, 2.5], "unit": ["s", "jobs", "s"], "target": [5.0, 63, None],
                      "meets": [True, True, None], "machine": ["ci-box"] * 3})


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of test_report's results tree (small real result files) with a harness benchmark CSV."""
    root = tmp_path_factory.mktemp("html")
    results, report = root / "results", root / "report"
    build_results(results)
    (results / "bench").mkdir()
    BENCH.to_csv(results / "bench" / "ci-box.csv", index=False)
    written = write_report(CONFIG, results, report)
    return report, written


class _Elements(HTMLParser):
    """Every start tag's (tag, attributes) of a page."""

    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_index_html_is_self_contained_and_mirrors_the_readme(report):
    report_dir, written = report
    assert report_dir / "index.html" in written and report_dir / "harness_benchmarks.csv" in written
    html = (report_dir / "index.html").read_text()
    parser = _Elements()
    parser.feed(html)
    images = [attrs["src"] for tag, attrs in parser.tags if tag == "img"]
    assert len(images) == len(figure_names()) and all(src.startswith("data:image/png;base64,") for src in images)
    # No external URL at all: no scheme-qualified or protocol-relative src/href, no stylesheet or script file.
    for tag, attrs in parser.tags:
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            assert not re.match(r"^(?:[a-z][a-z0-9+.-]*:)?//", value, re.I), (tag, key, value)
        assert tag not in ("script", "link", "iframe")
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    # The same sections as README.md, its tables as HTML tables in scrolling wrappers.
    readme = (report_dir / "README.md").read_text()
    for heading in re.findall(r"^## (.+)$", readme, re.M):
        assert f"<h2>{heading}</h2>" in html
    tables = html.count("<table>")
    assert tables == len(re.findall(r"^\|[ :]*-", readme, re.M)) and tables >= 5  # one per separator row
    assert html.count('<div class="table-wrap"><table>') == tables
    # Harness benchmarks and provenance, the config collapsible.
    assert "<h2>Harness benchmarks</h2>" in html and "dry_run_s" in html and "2 of 2 measurements with a target meet it" in readme
    assert "| 1.812 " in readme and "1.8123" not in readme  # four significant digits; the CSV keeps them all
    assert "1.8123456789" in (report_dir / "harness_benchmarks.csv").read_text()
    assert readme.rstrip().endswith("</details>") and "## Provenance" in readme
    assert re.search(r"<details>\s*<summary>The grid's config \(YAML\)</summary>\s*<pre><code class=\"language-yaml\">",
                     html)
    config = html.split('<code class="language-yaml">')[1].split("</code>")[0]
    assert yaml.safe_load(config.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                          .replace("&gt;", ">")) == CONFIG


def test_report_without_harness_csvs_has_no_harness_section_and_bad_csv_names_the_file(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0]}
    written = write_report(config, tmp_path / "results", tmp_path / "report")
    assert not (tmp_path / "report" / "harness_benchmarks.csv").exists()
    assert tmp_path / "report" / "index.html" in written
    assert "Harness benchmarks" not in (tmp_path / "report" / "README.md").read_text()
    bad = tmp_path / "results" / "bench" / "box.csv"
    bad.parent.mkdir(parents=True)
    BENCH.drop(columns=["meets"]).to_csv(bad, index=False)
    with pytest.raises(ResultsError, match=rf"^{re.escape(str(bad))}: missing column\(s\) meets$"):
        write_report(config, tmp_path / "results", tmp_path / "report")


def _browser():
    """A headless Chromium driven by selenium with Debian's chromedriver; skip (fail under CI) without."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.exists(p) and os.access(p, os.X_OK))]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    if missing:
        why = f"missing {', '.join(missing)} (apt-get install -y chromium chromium-driver)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the browser test, but: {why}")
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="linvit-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTHS['desktop']},900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(patient(60))
    return driver, profile


@pytest.fixture(scope="module")
def browser():
    driver, profile = _browser()
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _not_blank(png: bytes) -> int:
    """The number of distinct colours of a screenshot (1: blank)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return len(image.getcolors(maxcolors=1 << 24) or [])


@pytest.mark.parametrize("width", list(WIDTHS), ids=list(WIDTHS))
def test_index_html_renders_in_chromium(report, browser, width):
    report_dir, _ = report
    pixels = WIDTHS[width]
    # Device metrics, not the window: headless Chromium's window is at least 500 px wide.
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": pixels, "height": 844, "deviceScaleFactor": 1, "mobile": width == "phone"})
    browser.get((report_dir / "index.html").as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    # Every figure decoded, with its pixel size, and shown no wider than the screen.
    images = browser.execute_script(
        "return [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight,"
        " i.getBoundingClientRect().width])")
    assert len(images) == len(figure_names())
    for complete, natural_w, natural_h, shown in images:
        assert complete and natural_w > 0 and natural_h > 0 and 0 < shown <= pixels
    svgs = browser.execute_script("return [...document.querySelectorAll('svg')].map(s => s.getBBox().width)")
    assert all(w > 0 for w in svgs)
    # Every table has a header and body rows, and is laid out (visible, non-zero size).
    tables = browser.execute_script(
        "return [...document.querySelectorAll('table')].map(t => [t.rows.length, t.tBodies.length ? "
        "t.tBodies[0].rows.length : 0, t.getBoundingClientRect().height])")
    assert len(tables) >= 5 and all(rows >= 2 and body >= 1 and height > 0 for rows, body, height in tables)
    # The page never scrolls sideways: wide tables scroll inside their wrapper instead.
    page_width, client, viewport = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth, window.innerWidth]")
    assert viewport == pixels and page_width <= client  # client: the viewport less a vertical scrollbar
    # Nothing was fetched from anywhere but the file itself and its data: URIs.
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(name.startswith(("data:", "file:")) for name in fetched), fetched
    # Screenshots: the top of the page and the first figure are not one colour.
    assert _not_blank(browser.get_screenshot_as_png()) > 10
    figure = browser.find_element("css selector", "img")
    browser.execute_script("arguments[0].scrollIntoView()", figure)
    assert _not_blank(figure.screenshot_as_png) > 10


# -- provenance ----------------------------------------------------------------------------------------

def test_provenance_fields_and_compute_counts_each_distillation_once(tmp_path):
    runs = pd.DataFrame({"dataset": ["d"] * 4, "size": ["s"] * 4, "variant": ["v"] * 4,
                         "init": ["random", "recipe", "recipe", "random"], "design": ["none", "x", "x", "none"],
                         "seed": [0, 0, 0, 0], "budget": [100, 100, 400, 400], "status": ["ok", "ok", "ok", "missing"],
                         "train_time_s": [1.0, 2.0, 8.0, None], "distill_time_s": [0.0, 5.0, 5.0, None],
                         "throughput_device": ["cpu", "cpu", "cpu", None]})
    record = provenance.collect({"seeds": [0]}, runs)
    assert record["compute"] == {"training runs": 3, "train seconds": 11.0, "distillations": 1,
                                 "distill seconds": 5.0, "total seconds": 16.0}
    assert set(record["versions"]) == {"python", *provenance.PACKAGES}
    assert record["machine"]["run devices"] == "cpu" and int(record["machine"]["cores"]) >= 1
    import torch

    kernels = torch.backends.cpu.get_cpu_capability()
    assert record["machine"]["cpu kernels"] == kernels
    text = provenance.markdown(record)
    assert f"{record['machine']['cpu generation']}, {kernels} kernels)" in text
    assert "Total compute: 16.0 s" in text and "jobs: 4" in text and "seeds:\n- 0\n" in text


def test_git_state_outside_a_checkout_is_unknown_and_inside_says_dirty(tmp_path):
    assert provenance.git_state(tmp_path) == {"revision": "unknown", "dirty": "unknown"}
    if shutil.which("git") is None:
        pytest.skip("no git")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f").write_text("a")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "f"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert provenance.git_state(tmp_path) == {"revision": head, "dirty": "no"}
    (tmp_path / "f").write_text("b")
    assert provenance.git_state(tmp_path) == {"revision": head, "dirty": "yes"}
