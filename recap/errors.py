"""Errors a user can act on.

Every error raised for bad input is a ``RecapError`` whose message is one line naming the file,
the field and the fix, e.g. ``"/data/ds/meta/info.json: codebase_version 'v9.9' is not supported;
use a LeRobot dataset of version v2.0, v2.1 or v3.0"``. Scripts print the message and exit 2.
"""

from __future__ import annotations


class RecapError(ValueError):
    """Bad input or configuration, reported as one line."""

    def __init__(self, message: str):
        self.message = " ".join(str(message).split())
        super().__init__(self.message)


def one_line(exc: BaseException) -> str:
    """The one-line message of an error; gin appends "In call to configurable ..." lines to
    errors raised inside configurables, and those are dropped here."""
    message = getattr(exc, "message", None)
    return message if isinstance(message, str) else str(exc).strip().splitlines()[0]


class DatasetError(RecapError):
    """A dataset on disk is missing something or is inconsistent."""


def located(path: object, message: str) -> str:
    """Prefix ``message`` with the file it is about: ``"{path}: {message}"``."""
    return f"{path}: {message}"
