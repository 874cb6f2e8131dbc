"""Checkout shim for ``recap.commands.evaluate_policy`` (console script ``recap-evaluate``)."""

from recap.commands.evaluate_policy import main

if __name__ == "__main__":
    raise SystemExit(main())
