"""The encoded ``SubmitJob`` commands of unfinished jobs, within a budget of bytes.

A finished job's history row stores the spec as the bytes of the command that submitted
it (:mod:`synapse_ha.history.store`), so the replica need not encode the spec again. The
:class:`Submissions` keep those bytes from a job's submission until its row is made,
oldest first, within :data:`DEFAULT_BUDGET_BYTES` per replica: when more are kept, the
oldest are dropped, and those jobs' specs are encoded when their rows are written (a job
that waits long pays that once, late; one that finishes soon after its submission, the
case that makes history rows at a high rate, never does). The tasks of an array share
one value, counted once.

Used on the thread that applies commands only: not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_BUDGET_BYTES = 8 * 1024 * 1024
ENTRY_BYTES = 64  # about what keeping one job's entry costs besides the bytes themselves


class Submissions:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[str, tuple[bytes, int]] = OrderedDict()
        self._bytes = 0
        self.dropped = 0  # kept, then dropped for the budget

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def keep(self, job_ids: list[str], encoded: bytes) -> None:
        """``job_ids`` were created by the command ``encoded`` (an array's tasks)."""
        for n, job_id in enumerate(job_ids):
            cost = ENTRY_BYTES + (len(encoded) if n == 0 else 0)
            self._kept[job_id] = (encoded, cost)
            self._bytes += cost
        while self._bytes > self.budget_bytes and self._kept:
            _, (_, cost) = self._kept.popitem(last=False)
            self._bytes -= cost
            self.dropped += 1

    def take(self, job_id: str) -> bytes:
        """The command that submitted ``job_id``, no longer kept; b"" if not kept."""
        kept = self._kept.pop(job_id, None)
        if kept is None:
            return b""
        self._bytes -= kept[1]
        return kept[0]

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0
