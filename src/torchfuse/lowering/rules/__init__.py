"""Importing this package registers every lowering rule."""
from torchfuse.lowering import extern  # noqa: F401
from torchfuse.lowering.rules import elementwise, reductions, views  # noqa: F401

try:  # rules for indexing and tensor creation live in their own modules
    from torchfuse.lowering.rules import creation, indexing, pooling, scatter  # noqa: F401
except ImportError as error:  # pragma: no cover - only while those modules are being written
    if "creation" not in str(error) and "indexing" not in str(error):
        raise
