"""Checkout shim for ``recap.commands.sweep`` (console script ``recap-sweep``)."""

from recap.commands.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
