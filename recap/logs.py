"""recap's messages through the standard ``logging`` module, shown on rank 0 only.

Modules log to ``logging.getLogger(__name__)`` (children of the ``recap`` logger, ``get``).
Importing this module gives the ``recap`` logger, once, a handler that writes each message as is
(no level or name prefix: the lines read as the ``print`` calls they replaced did) to the
``sys.stdout`` of the moment (so pytest's capture and redirections see it) at level INFO, with a
filter (``RankZeroFilter``) that drops records on ranks other than 0 unless they are logged with
``extra=ALL_RANKS``. The logger does not propagate: an application's root handlers never print a
line twice; attach a handler to ``logging.getLogger("recap")`` to route them elsewhere. Progress
bars stay ``tqdm`` (stderr, rank 0). What goes through it: the progress and status lines of the
library (the steps, the engine, ``recap.workflow.pipeline``'s and ``recap.workflow.iterate``'s
stage lines and summary tables, ``evaluate_policy``'s rates). What stays ``print``: errors and
warnings a command writes to stderr (``error: ...``), result lines a script's caller parses
(``RESULT: ...``), and a command's own report on stdout (``--dry_run`` plans, ``recap-doctor``,
``recap-plan-memory``, ``recap-collect``'s and ``recap-demo-data``'s summaries, ``recap-standins``'
bindings).

``rank()`` is the process's rank without ``recap.engine``: ``torch.distributed``'s when a process
group is up, else the launcher's ``RANK`` (0 when unset) -- what ``recap.engine.distributed.rank``
returns, for code below the engine (``recap.data``) that writes a file on rank 0 only.
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "recap"
ALL_RANKS = {"all_ranks": True}  # ``log.info(msg, extra=ALL_RANKS)``: every rank shows it


def rank() -> int:
    """This process's rank: the process group's, else ``$RANK``, else 0 (imports no torch)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


class RankZeroFilter(logging.Filter):
    """Keeps a record on rank 0, or on any rank when it carries ``all_ranks`` (``ALL_RANKS``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return bool(getattr(record, "all_ranks", False)) or is_main()


class StdoutHandler(logging.StreamHandler):
    """A ``StreamHandler`` on whatever ``sys.stdout`` is when a record is emitted."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ / setStream: always sys.stdout
        pass


def setup(level: int = logging.INFO) -> logging.Logger:
    """The ``recap`` logger with its handler (module docstring); idempotent."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, StdoutHandler) for h in logger.handlers):
        handler = StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(RankZeroFilter())
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger


def get(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` for a module of recap (``name``: its ``__name__``)."""
    if name != ROOT and not name.startswith(ROOT + "."):
        raise ValueError(f"recap.logs.get: {name!r} is not a recap module's logger")
    return logging.getLogger(name)


setup()
