"""Checkout shim for ``recap.commands.plan_memory`` (console script ``recap-plan-memory``)."""

from recap.commands.plan_memory import main

if __name__ == "__main__":
    raise SystemExit(main())
