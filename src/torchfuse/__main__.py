"""`python -m torchfuse ...`: the same as the `torchfuse` console script."""

from torchfuse.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
