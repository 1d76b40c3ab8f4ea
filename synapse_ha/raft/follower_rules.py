"""The follower's rules that pysyncobj 0.3.17 bends or lacks, as pure functions over
its log and messages (used by :class:`synapse_ha.raft.adapter.SafeSyncObj`).

**Raft's AppendEntries rules on the follower side**, which pysyncobj 0.3.17 bends.

A follower that receives ``append_entries`` (previous index ``P``, entries ``E``) must,
by the Raft paper (Figure 2, receiver rules 3-5):

* delete its own entries only from the first one that *conflicts* with ``E`` (same index,
  different term), and append the entries of ``E`` it does not have;
* set its commit index to ``min(leaderCommit, index of the last new entry)``.

pysyncobj instead deletes every entry after ``P`` whenever its log is longer, conflict or
not (its commit rule, capped by the end of the log, is right only because of that). A
leader whose ``next_node_idx`` for a follower is lowered by a late reply re-sends from
there, and a message limited by the batch size can cover less than the follower already
acknowledged: the follower drops the rest. The leader still counts the acknowledgement
(its match index never goes down) and commits an entry that only it holds. When the
leader is then paused or killed, the follower that dropped the entry and the third
replica elect a leader without it: a command a client was told is committed is lost, and
the old leader, which applied it, logs "truncating already-applied log entries" when it
rejoins (seen in the chaos suite after a paused leader).

:class:`~synapse_ha.raft.adapter.SafeSyncObj` corrects the message (:func:`conflict_free`)
before pysyncobj's handler sees it, so the handler's own steps produce what the rules
demand:

* the leading entries of ``E`` that the log already holds (same index and term) are
  dropped from the message and ``P`` moves past them: the handler deletes from the first
  conflicting or missing entry only;
* when the log holds all of ``E`` (a re-send), the message becomes a heartbeat at the end
  of the log: nothing is deleted and appended again; its commit index is capped at
  ``P + len(E)`` (entries beyond may be of an older term the leader does not have), and
  the acknowledgement sent back is capped at ``P + len(E) + 1``: the follower vouches only
  for what the leader sent.

A large entry arrives in chunks (``transmission``); :class:`SafeSyncObj` joins the chunks
once the last one arrives so the same rules apply. pysyncobj marks a chunk as the last by
comparing the offset with the command's length rather than the pickled entry's, so a
chunk before the real last one can carry the mark: such a chunk does not decode and is
kept as a middle chunk.

**Leader loss**: see :mod:`synapse_ha.raft.adapter` (:func:`leader_loss_delay` orders the
survivors).
"""

from __future__ import annotations

from typing import Any


def leader_loss_delay(self_address: str, members: list[str], lost: str, stagger_s: float) -> float:
    """Seconds until the member ``self_address`` stands for election after losing its
    connection to the leader ``lost``: the other ``members`` take turns in address order,
    ``stagger_s`` apart, the first at once."""
    survivors = sorted({m for m in members if m != lost})
    return survivors.index(self_address) * stagger_s


def conflict_free(log: Any, message: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """``message`` rewritten so that pysyncobj's handler applies the Raft rules to ``log``
    (a sequence of ``(command, index, term)``), and the cap on the acknowledgement (None:
    no cap). A message whose previous entry the log does not hold is left alone: the
    handler rejects it."""
    if message.get("transmission") is not None:
        return message, None  # a first or middle chunk: nothing to apply yet
    prev = int(message["prevLogIdx"])
    entries = list(message.get("entries") or [])
    if len(log) == 0:
        return message, None
    first = int(log[0][1])
    last = int(log[-1][1])
    if prev < first or prev > last or int(log[prev - first][2]) != message["prevLogTerm"]:
        return message, None
    held = 0
    for entry in entries:
        index, term = int(entry[1]), int(entry[2])
        if index > last or int(log[index - first][2]) != term:
            break
        held += 1
    if held < len(entries):
        if held == 0:
            return message, None
        kept = entries[held - 1]
        return {
            **message,
            "prevLogIdx": int(kept[1]),
            "prevLogTerm": int(kept[2]),
            "entries": entries[held:],
        }, None
    end = prev + len(entries)
    if last == end and not entries:
        return message, None  # a heartbeat at the end of the log
    return {
        **message,
        "prevLogIdx": last,
        "prevLogTerm": int(log[-1][2]),
        "entries": [],
        "commit_index": min(int(message["commit_index"]), end),
    }, end + 1
