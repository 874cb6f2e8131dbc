"""Checkout shim for ``recap.commands.relabel`` (console script ``recap-relabel``)."""

from recap.commands.relabel import main

if __name__ == "__main__":
    raise SystemExit(main())
