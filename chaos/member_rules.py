"""The checker's rules about members as processes on hosts, pure functions of a
:class:`~chaos.history.History` (the rules are described in :mod:`chaos.checker`).

A member is (job, fencing token, rank, generation): a rank placed again
(``on_node_failure: replace``) is a member of its own, so two generations of one rank
are two members here, as two attempts are.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.history import History, Violation
from chaos.replace_rules import Member

# A member's process: (job, token, rank, generation, PID namespace, start ticks, pid).
Life = tuple[str, int, int, int, int, int, int]


def check_gpu_reuse(history: History) -> list[Violation]:
    """``gpu-reuse``: on each (node, GPU), members of different attempts (or generations)
    never run at the same time; a member runs from its ``start`` record to its last
    record."""
    # A member is (job, token, rank, generation): a rank placed again is a member of its own;
    # and each process of it (a rank of an elastic gang given back and grown again) is a
    # life of its own.
    lives: dict[Life, list[int]] = {}  # member process -> [start, last]
    where: dict[Life, tuple[str, tuple[int, ...]]] = {}
    preempted: set[Life] = set()
    for r in history.members:
        key = (*r.member, r.pid_ns, r.start_ticks, r.pid)
        if r.type == "start":
            where[key] = (r.node, r.gpus)
            life = lives.setdefault(key, [r.mono_ns, r.mono_ns])
            life[0] = min(life[0], r.mono_ns)
        elif r.type == "preempted":
            preempted.add(key)
        life = lives.setdefault(key, [r.mono_ns, r.mono_ns])
        life[1] = max(life[1], r.mono_ns)
    holders: dict[tuple[str, int], list[Life]] = defaultdict(list)
    for key, (node, gpus) in where.items():
        for gpu in gpus:
            holders[(node, gpu)].append(key)
    out: list[Violation] = []
    reported: set[tuple[Life, Life]] = set()
    for (node, gpu), keys in sorted(holders.items()):
        keys.sort(key=lambda k: lives[k][0])
        for i, older in enumerate(keys):
            for newer in keys[i + 1 :]:
                first_two = older[:2] == newer[:2] and older[3] == newer[3] == 0
                if first_two or (older, newer) in reported:
                    continue
                started = lives[newer][0]
                last = lives[older][1]
                if last <= started:
                    continue
                reported.add((older, newer))
                what = "a preempted member" if older in preempted else "a member"
                gen = f" generation {older[3]}" if older[3] or newer[3] else ""
                out.append(
                    Violation(
                        "gpu-reuse",
                        older[0],
                        f"GPU {gpu} of {node}: {what} (rank {older[2]}, token {older[1]}{gen}) "
                        f"wrote a record {(last - started) / 1e6:.0f} ms after rank "
                        f"{newer[2]} of {newer[0]} (token {newer[1]}) started on it",
                    )
                )
    return out


def check_duplicate_members(history: History) -> list[Violation]:
    """``duplicate-member``: one member (job, token, rank, generation) of a fixed gang
    started by two processes."""
    # A process is its pid in its PID namespace, started when it started: members of a
    # worker that gives each one a namespace of its own all have pid 2, and a namespace's
    # number is used again once it is gone.
    pids: dict[Member, set[tuple[int, int, int]]] = defaultdict(set)
    for r in history.members:
        # A rank of an elastic gang given back and grown again is a second process by
        # design; two of them at once are rank-twice (chaos/elastic_rules.py).
        if r.type == "start" and not r.elastic:
            pids[r.member].add((r.pid_ns, r.start_ticks, r.pid))
    return [
        Violation(
            "duplicate-member",
            job,
            f"rank {rank} of token {token}"
            + (f" generation {gen}" if gen else "")
            + f" started by pids {sorted(pid for *_, pid in p)} "
            f"(PID namespaces {sorted({ns for ns, *_ in p})})",
        )
        for (job, token, rank, gen), p in sorted(pids.items())
        if len(p) > 1
    ]
