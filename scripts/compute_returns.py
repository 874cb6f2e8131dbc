"""Checkout shim for ``recap.commands.compute_returns`` (console script ``recap-returns``)."""

from recap.commands.compute_returns import main

if __name__ == "__main__":
    raise SystemExit(main())
