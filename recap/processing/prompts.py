"""The π0.5 prompt, written once: task text, advantage label, binned state, in a named style.

Prompts (docs/spec.md §6): conditional ``"{task}\\nAdvantage: positive"`` (or
``negative``), unconditional = the plain task. π0.5 writes the task (``clean_prompt``: stripped,
``_`` and newlines to spaces, as openpi, so RLinf's ``"{task}\\nAdvantage: positive"`` reads
``"{task} Advantage: positive"``) and, with a state, its 256 bins (``discretize_state``) into one
text, in a named style (``pi05_prompt``):

- ``openpi`` (``PaligemmaTokenizer``): with state ``"Task: {cleaned}, State: {bins};\\nAction: "``
  tokenized with BOS; without state (``discrete_state_input=False``, pi05_libero) the cleaned task
  with BOS, then ``"\\n"`` tokenized on its own.
- ``lerobot`` (``Pi05PrepareStateTokenizerProcessorStep``): ``"Task: {cleaned}, State:
  {bins};\\nAction: "`` or ``"Task: {cleaned};\\nAction: "``, with BOS.

A prompt is a tuple of segments: its ids are BOS followed by each segment's ids, every segment
encoded on its own (``transforms.tokenize_prompts``). ``conditioned_prompt`` places the label at
``label_position``. The conditioning modes (``CONDITIONING``) are named here too: which prompts a
policy was trained on decides which it can be guided with (``recap.processing.pi05``).
"""

from __future__ import annotations

import numpy as np

from recap.errors import RecapError

POSITIVE_TEXT = "Advantage: positive"
NEGATIVE_TEXT = "Advantage: negative"
PAPER = "paper"
POSITIVE_ONLY = "positive_only_conditional"
MODES = (PAPER, POSITIVE_ONLY)  # conditioned training: the label's text in the prompt
NONE = "none"  # behaviour cloning (the baseline): the plain prompt only
FILTERED = "filtered"  # filtered behaviour cloning: the positive frames only, plain prompts
CONDITIONING = (*MODES, NONE, FILTERED)
PLAIN = (NONE, FILTERED)  # modes that train on the plain prompt only (one branch, beta 1)
DEFAULT_PROB = {PAPER: 0.3, POSITIVE_ONLY: 0.1}
STATE_BINS = 256
OPENPI, LEROBOT = "openpi", "lerobot"
PROMPT_STYLES = (OPENPI, LEROBOT)
# Where the advantage text goes: in the task text (RLinf and openpi: before the state when the
# state is in the prompt) or right before the final "Action: " (after the state).
LABEL_IN_TASK, LABEL_BEFORE_ACTION = "task", "action"
LABEL_POSITIONS = (LABEL_IN_TASK, LABEL_BEFORE_ACTION)
ACTION_CUE = "Action: "
Prompt = tuple[str, ...]  # segments, each tokenized on its own after one BOS


def advantage_prompt(task: str, label: bool | None) -> str:
    """``"{task}\\nAdvantage: positive"`` (True), ``...negative`` (False), ``task`` (None)."""
    if label is None:
        return task
    return f"{task}\n{POSITIVE_TEXT if label else NEGATIVE_TEXT}"


def discretize_state(state: np.ndarray) -> np.ndarray:
    """int64[..., D] bin of each normalized state value: digitize over linspace(-1, 1, 257)[:-1]
    minus 1, i.e. 0..255 on [-1, 1] (openpi)."""
    bins = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1]
    return np.digitize(np.asarray(state, dtype=np.float64), bins).astype(np.int64) - 1


def clean_prompt(task: str) -> str:
    """openpi's (and LeRobot's) cleaning: stripped, ``_`` and newlines to spaces."""
    return task.strip().replace("_", " ").replace("\n", " ")


def check_style(style: str) -> str:
    if style not in PROMPT_STYLES:
        raise RecapError(f"policy_data.prompt_style: {style!r} is not one of {list(PROMPT_STYLES)}")
    return style


def pi05_prompt(task: str, state: np.ndarray | None = None, style: str = OPENPI) -> Prompt:
    """The π0.5 prompt segments of ``task`` (``state`` float[D] normalized, or None): with state
    ``("Task: {cleaned}, State: {bins};\\nAction: ",)`` in both styles; without, openpi
    ``(cleaned, "\\n")`` and lerobot ``("Task: {cleaned};\\nAction: ",)``."""
    check_style(style)
    cleaned = clean_prompt(task)
    if state is not None:
        digits = " ".join(str(int(s)) for s in discretize_state(state))
        return (f"Task: {cleaned}, State: {digits};\nAction: ",)
    if style == OPENPI:
        return (cleaned, "\n")
    return (f"Task: {cleaned};\nAction: ",)


def check_label_position(position: str) -> str:
    if position not in LABEL_POSITIONS:
        raise RecapError(f"policy_data.label_position: {position!r} is not one of "
                         f"{list(LABEL_POSITIONS)}")  # fmt: skip
    return position


def conditioned_prompt(
    task: str,
    label: bool | None,
    state: np.ndarray | None = None,
    style: str = OPENPI,
    position: str = LABEL_IN_TASK,
) -> Prompt:
    """The π0.5 prompt of ``task`` with ``label``'s advantage text (None: the plain prompt).
    ``position="task"``: ``pi05_prompt(advantage_prompt(task, label), state, style)``, as RLinf
    and openpi build it (with the state in the prompt the label precedes the state);
    ``"action"``: the plain prompt with ``"Advantage: positive\n"`` inserted before its final
    ``"Action: "`` (after the state); a prompt without that cue (openpi style without state,
    whose task text already ends the prompt) takes the label in the task text as ``"task"``."""
    check_label_position(position)
    if label is None:
        return pi05_prompt(task, state, style)
    plain = pi05_prompt(task, state, style)
    if position == LABEL_IN_TASK or not plain[-1].endswith(ACTION_CUE):
        return pi05_prompt(advantage_prompt(task, label), state, style)
    text = POSITIVE_TEXT if label else NEGATIVE_TEXT
    return (*plain[:-1], plain[-1][: -len(ACTION_CUE)] + f"{text}\n{ACTION_CUE}")
