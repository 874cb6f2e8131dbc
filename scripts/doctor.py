"""Checkout shim for ``recap.commands.doctor`` (console script ``recap-doctor``)."""

from recap.commands.doctor import main

if __name__ == "__main__":
    raise SystemExit(main())
