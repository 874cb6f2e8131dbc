"""Oracle advantage labels for the validity benchmark's control: label = the episode's outcome.

RECAP trained on labels that need no value model (every frame of a successful episode positive,
every frame of a failed one negative) separates two questions when RECAP loses to behaviour
cloning: if the oracle-labelled policy does not beat BC either, the conditioning path or the
setting is at fault, not the value model. The outcome comes from the Step 1 returns sidecar: an
episode's last reward is 0 when it succeeded (docs/spec.md §2), ``failure_reward`` otherwise
(``episode_success``, which Step 3's summary reads too).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from recap.core import columns as C
from recap.errors import RecapError


def episode_success(returns: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(episode ids int64[E], success bool[E])`` of a returns sidecar (any row order)."""
    episode = returns.column(C.EPISODE_INDEX).to_numpy().astype(np.int64)
    frame = returns.column(C.FRAME_INDEX).to_numpy().astype(np.int64)
    reward = returns.column(C.REWARD).to_numpy()
    order = np.lexsort((frame, episode))
    episode, reward = episode[order], reward[order]
    last = np.append(episode[1:] != episode[:-1], True)
    return episode[last], reward[last] == 0.0


def outcome_labels(advantages: pa.Table, returns: pa.Table) -> pa.Table:
    """``advantages`` with its ``advantage`` column replaced by each frame's episode outcome."""
    ids, success = episode_success(returns)
    episode = advantages.column(C.EPISODE_INDEX).to_numpy().astype(np.int64)
    at = np.minimum(np.searchsorted(ids, episode), len(ids) - 1)
    if len(ids) == 0 or not np.all(ids[at] == episode):
        missing = episode[ids[at] != episode][0] if len(ids) else episode[0]
        raise RecapError(f"returns sidecar: no rows for episode {int(missing)} of the advantages "
                         "table; recompute Step 1 for this dataset")  # fmt: skip
    column = advantages.schema.get_field_index(C.ADVANTAGE)
    return advantages.set_column(column, C.ADVANTAGE, pa.array(success[at]))
