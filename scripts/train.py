"""Checkout shim for ``recap.commands.train`` (console script ``recap-train``)."""

from recap.commands.train import main

if __name__ == "__main__":
    raise SystemExit(main())
