"""How a stage hands a result (a run directory, a sidecar tag, a dataset list) to the step that
reads it: a ``Binding`` of one parameter of a declared configurable to a value. Stages return
these; the launcher writes each as one ``--gin_param`` line only where it crosses into the
step's process (``line()``), and checks first that the configurable takes that parameter, so a
renamed parameter is one line at plan time, not a step that silently ignores its input.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from recap.configurable import DECLARED
from recap.errors import RecapError
from recap.registry import CONFIGURABLES, literal


@dataclass(frozen=True)
class Binding:
    """``configurable.param = value`` (``scope/`` in front with ``scope``)."""

    configurable: str  # a name of ``recap.registry.CONFIGURABLES``
    param: str
    value: object
    scope: str = ""

    def check(self) -> None:
        """One-line ``RecapError`` unless ``configurable`` is recap's and, once its module is
        imported, takes ``param``."""
        if self.configurable not in CONFIGURABLES:
            raise RecapError(f"binding {self.key}: {self.configurable!r} is not one of recap's "
                             f"configurables ({', '.join(CONFIGURABLES)})")  # fmt: skip
        target = DECLARED.get(self.configurable)
        if target is None:
            return
        params = inspect.signature(target).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if self.param not in params and not takes_any:
            raise RecapError(f"binding {self.key}: {self.configurable} "
                             f"({CONFIGURABLES[self.configurable]}) takes no parameter "
                             f"{self.param!r}; rename it where a stage hands it")  # fmt: skip

    @property
    def key(self) -> str:
        name = f"{self.configurable}.{self.param}"
        return f"{self.scope}/{name}" if self.scope else name

    def line(self) -> str:
        """The binding as one gin line (checked first)."""
        self.check()
        return f"{self.key} = {literal(self.value)}"


def lines(bindings: list[Binding]) -> list[str]:
    """Each binding's ``line()``."""
    return [b.line() for b in bindings]
