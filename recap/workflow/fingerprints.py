"""Stage fingerprints over the resolved config of a step and the version of its code.

A stage's fingerprint hashes, in canonical JSON (sorted keys, floats as ``repr``, tuples as
lists, paths as strings):

* its **resolved config**: every parameter of every configurable its step reads, with its bound
  value when bound and its signature default when not. The configurables read are those the
  step's modules register (``configurables`` of its step in ``code_versions.json``: the
  ``recap.registry`` names whose module the step runs, written by
  ``python -m recap.workflow.lock --update``), every configurable
  bound in the parsed config (in its scope) and every one a bound value references. A scoped
  entry (``value/train``) that resolves exactly as its parent scope says nothing and is left
  out. A parameter without a default (one a caller passes, or a ``config_fields`` field of a
  model factory, whose unbound value is the checkpoint's) counts only when bound. Macros count
  through the values that use them; ``Tracker`` (where a run is logged, not what it computes)
  never counts. So binding a parameter to its default changes nothing, and changing a default
  changes the fingerprint of every step that reads it;
* the **code version** of its step: ``STEP_VERSION`` of the module defining its entry (a test
  fails when that step's sources change without the lock being updated, see
  ``recap.workflow.code_versions``);
* its name, and the fingerprints of the stages it needs (by the caller).

The resolving reads gin, so it lives at the edge (``recap.config_resolve``); this module hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from recap.config_resolve import canonical_json, resolved_config
from recap.workflow import code_versions


def stage_fingerprint(name: str, entry: str, text: str, needs: Iterable[str]) -> str:
    """sha256 of the stage ``name`` (running configurable ``entry``) over its resolved config
    (``config_str()`` text ``text``), its step's code version, and ``needs`` (the fingerprints
    of the stages it needs, in order)."""
    module = code_versions.step_module(entry)
    stale = f"; if a step no longer reads it, run `{code_versions.UPDATE}`"
    config = resolved_config(text, code_versions.reads(module, name), name, stale)
    code = {module: code_versions.step_version(module)}
    record = {"stage": name, "config": config, "code": code}
    digest = hashlib.sha256(canonical_json(record).encode())
    for need in needs:
        digest.update(need.encode())
    return digest.hexdigest()
