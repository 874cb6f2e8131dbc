"""Checkout shim for ``recap.commands.iterate`` (console script ``recap-iterate``)."""

from recap.commands.iterate import main

if __name__ == "__main__":
    raise SystemExit(main())
