"""linvit: turn pretrained softmax Vision Transformers into linear-attention ViTs, and measure how.

Importing the package is cheap (no torch, no timm): the Snakefile imports linvit.grid and
linvit.config on every parse. `import linvit.models` registers the `linvit_<size>_<variant>`
models with timm.
"""

__version__ = "0.1.0"
