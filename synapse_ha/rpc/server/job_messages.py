"""A replica's jobs as API messages, each converted once while it stays the same.

Reads are served from snapshots, and a record a snapshot holds is never changed
afterwards (:mod:`synapse_ha.core.snapshot`: a command that changes a job replaces the
live record by a private copy first). So a :class:`~synapse_ha.core.model.Job` object seen
in a snapshot stands for one version of that job for as long as it exists, and its
message (:func:`~synapse_ha.rpc.to_proto.job_to_proto`) can be kept with it: a listing of
2,000 jobs of which a few changed since the last one converts those few and copies the
rest (a message copy in C, about a tenth of a conversion).

The messages are keyed by the record's identity and hold the record itself, so a key is
never reused while its entry lives. Two generations bound the memory: a message found in
the older one moves to the newer; once the newer holds :data:`GENERATION` messages it
becomes the older and the oldest are dropped. A message handed out is shared: callers
copy it into their answer (a ``repeated`` field or a message field copies) and never
change it.

:class:`JobOrder` keeps the order a listing pages through: a snapshot's jobs in submission
order, sorted once per snapshot (a replica hands out the same snapshot until a command
changes its state), so each page of a listing starts with a binary search, not a sort of
every job and a walk to the page's start.
"""

from __future__ import annotations

from operator import attrgetter

from synapse_ha.core.model import ClusterState, Job
from synapse_ha.rpc import to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

# Messages per generation: a listing of this many jobs is served from the cache in full.
GENERATION = 8_192


class JobMessages:
    """Each job version's message, per redaction (see the module docstring). Safe to
    use from many threads: each dictionary operation is atomic, and two threads that
    convert the same job at once store equal messages."""

    def __init__(self, generation: int = GENERATION) -> None:
        if generation < 1:
            raise ValueError(f"generation: at least 1, got {generation}")
        self.generation = generation
        self._new: dict[tuple[int, bool], tuple[Job, pb.Job]] = {}
        self._old: dict[tuple[int, bool], tuple[Job, pb.Job]] = {}

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def of(self, job: Job, redacted: bool) -> pb.Job:
        """The message of ``job`` as :func:`~synapse_ha.rpc.to_proto.job_to_proto` makes
        it; shared, never to be changed."""
        key = (id(job), redacted)
        entry = self._new.get(key)
        if entry is None or entry[0] is not job:
            entry = self._old.get(key)
            if entry is None or entry[0] is not job:
                entry = (job, to_proto.job_to_proto(job, redacted))
            self._keep(key, entry)
        return entry[1]

    def _keep(self, key: tuple[int, bool], entry: tuple[Job, pb.Job]) -> None:
        if len(self._new) >= self.generation:
            self._old, self._new = self._new, {}
        self._new[key] = entry


# A listing's order: submission order, the tasks of an array by index.
SUBMISSION_ORDER = attrgetter("seq", "array_index")


class JobOrder:
    """The jobs of the newest snapshot listed, in :data:`SUBMISSION_ORDER`. Safe to use
    from many threads: the pair is replaced whole, and a snapshot is never changed."""

    def __init__(self) -> None:
        self._last: tuple[ClusterState, list[Job]] | None = None

    def of(self, state: ClusterState) -> list[Job]:
        """``state``'s jobs in submission order; shared, never to be changed."""
        last = self._last
        if last is not None and last[0] is state:
            return last[1]
        ordered = sorted(state.jobs.values(), key=SUBMISSION_ORDER)
        self._last = (state, ordered)
        return ordered
