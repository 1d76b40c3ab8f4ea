"""What the observer knows of each member from the ledger as it is written: where it runs,
its GPUs, whether its gang asked for member replacement, is elastic or paced, its process,
and which ranks were placed again (a newer generation started). The replacement, elastic
and slow-node kinds aim with it (:mod:`chaos.replacefaults`, :mod:`chaos.elasticfaults`,
:mod:`chaos.slowfaults`), and a freeze waits with it for a frozen rank's replacement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Member = tuple[str, int, int, int]  # (job, fencing token, rank, generation)
# The records of a member that is done with its work or stopped.
ENDING = ("effect", "end", "term", "preempted")


@dataclass(slots=True)
class SeenMember:
    """A member as its ledger records show it."""

    node: str  # the worker's name
    last_ns: int  # its newest record
    gpus: frozenset[int] = frozenset()
    replace: bool = False  # its gang asked for member replacement
    ended: bool = False  # it committed its effect or was stopped (effect, end, term)
    until_ns: int = 0  # when it planned to end its work, as its start record said
    elastic: str = ""  # its gang's "<min>:<max>" when elastic (chaos/elasticfaults.py)
    paced: bool = False  # it reports its pace (chaos/slowfaults.py)
    started_ns: int = 0  # its start record's time
    process: tuple[int, int, int] = (0, 0, 0)  # its pid, PID namespace and start ticks


@dataclass(slots=True)
class SeenMembers:
    members: dict[Member, SeenMember] = field(default_factory=dict)
    # (job, token, rank) -> the newest generation with a start record
    newest_generation: dict[tuple[str, int, int], int] = field(default_factory=dict)

    def saw(self, record: dict[str, object], node: str, at: int) -> None:
        """Note a member record (``job``, ``token``, ``rank``, ``generation``) written on
        worker ``node`` at ``at``."""
        job, token = str(record["job"]), int(str(record["token"]))
        rank, gen = int(str(record["rank"])), int(str(record.get("generation", 0)))
        seen = self.members.setdefault((job, token, rank, gen), SeenMember(node, at))
        seen.last_ns = max(seen.last_ns, at)
        seen.ended = seen.ended or record.get("type") in ENDING
        if record.get("type") == "start":
            gpus = str(record.get("gpus", "")).split(",")
            seen.gpus = frozenset(int(g) for g in gpus if g.strip().isdigit())
            seen.replace = bool(record.get("replace"))
            seen.until_ns = int(str(record.get("until_ns", 0)))
            seen.elastic = str(record.get("elastic", ""))
            seen.paced = bool(record.get("paced"))
            seen.started_ns = at
            seen.process = (
                int(str(record.get("pid", 0))),
                int(str(record.get("pid_ns", 0))),
                int(str(record.get("start_ticks", 0))),
            )
            key = (job, token, rank)
            self.newest_generation[key] = max(self.newest_generation.get(key, 0), gen)

    def newer_generation(self, member: Member) -> bool:
        """Whether a newer generation of the member's rank has started."""
        job, token, rank, gen = member
        return self.newest_generation.get((job, token, rank), 0) > gen

    def on(self, worker: str, since_ns: int) -> dict[Member, SeenMember]:
        """The members with a record on ``worker`` at or after ``since_ns``."""
        return {k: m for k, m in self.members.items() if m.node == worker and m.last_ns >= since_ns}

    def replace_members(
        self, worker: str, since_ns: int, lasting_ns: int = 0
    ) -> list[tuple[Member, SeenMember]]:
        """Members on ``worker`` with a record since ``since_ns`` and still at work, of
        gangs with member replacement, each the newest generation of its rank, whose gang
        also has a member at work on another worker that plans to work on until
        ``lasting_ns`` at least (losing ``worker`` leaves the gang running until its lost
        ranks can be placed again; a gang whose members left all ran there, or all ended
        meanwhile, is requeued whole)."""
        live = {k: m for k, m in self.members.items() if m.last_ns >= since_ns and not m.ended}
        return [
            (key, m)
            for key, m in sorted(live.items())
            if m.node == worker
            and m.replace
            and not self.newer_generation(key)
            and any(
                k[:2] == key[:2] and o.node != worker and o.until_ns >= lasting_ns
                for k, o in live.items()
            )
        ]
