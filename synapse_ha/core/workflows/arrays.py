"""Job arrays (DESIGN §6, ``array:``): one submission, many tasks.

``array: "0-99%10"`` makes tasks 0..99 of one spec, at most 10 of them holding resources
at once. The text is Slurm's ``--array``: comma-separated items, each an index ``7``, a
range ``0-99`` or a range with a step ``0-98:2``, and an optional throttle ``%N`` at the
end. Indices are 0..:data:`MAX_INDEX`, at most :data:`MAX_TASKS` of them; an index named
twice is one task.

The array keeps the job id the submission was given (``job-000012``); its tasks are jobs
``job-000012_0``, ``job-000012_1``... (:func:`task_id`), each a full gang with its own
attempts, retries and logs. One replicated command creates them all. The array itself is
an :class:`ArrayJob` record: what it was submitted as, and the jobs that wait for it (a
dependency on an array is met once every task meets it, see
:func:`synapse_ha.core.machine.apply_dependencies.outcome_of`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from synapse_ha.core.reasons import Reason, ReasonCode, reason

if TYPE_CHECKING:
    from synapse_ha.core.model import ArrayJob

MAX_TASKS = 10_000
MAX_INDEX = 1_000_000
FIELD = "array"

_ITEM = re.compile(r"^([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?$")
TASK_ID = re.compile(r"^(job-[0-9]{6,12})_([0-9]{1,7})$")


@dataclass(frozen=True, slots=True)
class ArrayPlan:
    """A parsed ``array:``: the task indices in ascending order, and how many tasks may
    hold resources at once (0: no throttle)."""

    indices: tuple[int, ...]
    throttle: int = 0


class ArrayTextError(ValueError):
    """An ``array:`` text that breaks a rule (the message is the rule)."""


def parse_array(text: str) -> ArrayPlan:
    """The plan ``text`` describes, or :class:`ArrayTextError` saying which rule it breaks."""
    body, throttle = text.strip(), 0
    if "%" in body:
        body, _, limit = body.partition("%")
        if not limit.isdigit() or int(limit) < 1:
            raise ArrayTextError(f"the throttle after % must be a whole number >= 1, got {limit!r}")
        throttle = int(limit)
    if not body:
        raise ArrayTextError("names no task: give indices such as 0-99, 1,3,5 or 0-98:2")
    indices: set[int] = set()
    for item in body.split(","):
        indices.update(_item_indices(item.strip()))
        if len(indices) > MAX_TASKS:
            raise ArrayTextError(f"at most {MAX_TASKS} tasks")
    return ArrayPlan(tuple(sorted(indices)), throttle)


def _item_indices(item: str) -> range:
    match = _ITEM.match(item)
    if match is None:
        raise ArrayTextError(
            f"{item!r} is not an index, a range (0-99) or a range with a step (0-98:2)"
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    step = int(match.group(3)) if match.group(3) is not None else 1
    if last > MAX_INDEX:
        raise ArrayTextError(f"indices go up to {MAX_INDEX}, got {last}")
    if last < first:
        raise ArrayTextError(f"{item!r}: a range ends at or after its start")
    if step < 1:
        raise ArrayTextError(f"{item!r}: the step must be >= 1")
    if (last - first) // step + 1 > MAX_TASKS:
        raise ArrayTextError(f"at most {MAX_TASKS} tasks")
    return range(first, last + 1, step)


def array_problems(text: str) -> list[tuple[str, str]]:
    """``(field, rule)`` for an ``array:`` text that breaks a rule ("" is no array)."""
    if not text:
        return []
    try:
        parse_array(text)
    except ArrayTextError as exc:
        return [(FIELD, str(exc))]
    return []


def task_id(array_id: str, index: int) -> str:
    """The job id of task ``index`` of array ``array_id``."""
    return f"{array_id}_{index}"


def task_of(job_id: str) -> tuple[str, int] | None:
    """``(array id, index)`` when ``job_id`` names a task of an array, else None."""
    match = TASK_ID.match(job_id)
    return (match.group(1), int(match.group(2))) if match else None


def throttle_reason(array: ArrayJob) -> Reason:
    """Why a task of ``array`` waits for a slot of its throttle."""
    return reason(ReasonCode.ARRAY_THROTTLE, array=array.array_id, throttle=array.throttle)
