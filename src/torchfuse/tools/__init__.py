"""Tools on top of the public API (``api.py``): ``explain``, ``warmup`` and ``torchfuse doctor``.

They drive compiles and read the report; nothing below them imports them (docs/architecture.md,
"Layers").
"""
