"""Checkout shim for ``recap.commands.make_demo_data`` (console script ``recap-demo-data``)."""

from recap.commands.make_demo_data import main

if __name__ == "__main__":
    raise SystemExit(main())
