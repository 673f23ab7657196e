"""linvit: turn pretrained softmax Vision Transformers into linear-attention ViTs, and measure how."""

__version__ = "0.1.0"
