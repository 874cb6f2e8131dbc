"""Checkout shim for ``recap.commands.compute_advantages`` (console script ``recap-advantages``)."""

from recap.commands.compute_advantages import main

if __name__ == "__main__":
    raise SystemExit(main())
