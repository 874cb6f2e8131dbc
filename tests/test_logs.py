"""recap.logs: plain lines on the stdout of the moment, rank 0 only unless marked all-ranks."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from recap import logs

log = logs.get("recap.tests_logs")


def test_a_message_is_the_plain_line_on_stdout(capsys):
    log.info("tag 'a': global return range [-3, 0] over 2 datasets")
    log.warning("warning: 50% done")  # no %-formatting without arguments
    captured = capsys.readouterr()
    assert (
        captured.out == "tag 'a': global return range [-3, 0] over 2 datasets\nwarning: 50% done\n"
    )
    assert captured.err == ""


def test_other_ranks_are_silent_unless_all_ranks(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert logs.rank() == 1 and not logs.is_main()
    log.info("rank 0 only")
    log.info("every rank", extra=logs.ALL_RANKS)
    assert capsys.readouterr().out == "every rank\n"
    monkeypatch.setenv("RANK", "0")
    log.info("rank 0 only")
    assert capsys.readouterr().out == "rank 0 only\n"


def test_debug_is_below_the_level_and_nothing_propagates(capsys):
    root = logging.getLogger("recap")
    assert root.level == logging.INFO and root.propagate is False
    log.debug("hidden")
    assert capsys.readouterr().out == ""


def test_setup_is_idempotent():
    logs.setup()
    logs.setup()
    handlers = [h for h in logging.getLogger("recap").handlers if isinstance(h, logs.StdoutHandler)]
    assert len(handlers) == 1


def test_only_recap_loggers():
    with pytest.raises(ValueError, match="not a recap module's logger"):
        logs.get("numpy")


def test_a_step_line_reaches_a_subprocess_stdout_in_order():
    code = (
        "from recap import logs\n"
        "print('before', flush=True)\n"
        "logs.get('recap.steps.x').info('tag: step 3; weights in /w')\n"
        "print('after')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == "before\ntag: step 3; weights in /w\nafter\n"
    assert proc.stderr == ""
