"""Checkout shim for ``recap.commands.pipeline`` (console script ``recap-pipeline``)."""

from recap.commands.pipeline import main

if __name__ == "__main__":
    raise SystemExit(main())
