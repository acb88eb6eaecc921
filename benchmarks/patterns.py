"""Moved to `torchfuse.bench.patterns` (the benchmark CLI ships with the package); kept for old imports."""
from torchfuse.bench.patterns import *  # noqa: F401,F403
from torchfuse.bench.patterns import BY_NAME, PATTERNS, to_reference  # noqa: F401
