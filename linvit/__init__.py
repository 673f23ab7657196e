"""linvit: turn pretrained softmax Vision Transformers into linear-attention ViTs, and measure how."""

__version__ = "0.1.0"

from . import models  # noqa: E402,F401  (registers linvit_<size>_<variant> with timm.create_model)
