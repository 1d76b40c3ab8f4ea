"""Snapshot decode benchmark: what a catching-up replica spends loading its snapshot.

Builds, in process with ``apply``, the state ``bench/catchup.py`` leaves behind:
``--jobs`` one-member jobs submitted by one user, pending (no nodes) with the reason a
scheduling pass gave them, in the compact layout. Writes it as a snapshot file
(:mod:`synapse_ha.raft.snapshot_file`) and reports, best of ``--repeat`` in process CPU
seconds with the collector paused as the codec pauses it:

- ``read_snapshot_file_s``: reading the file as a replica does (msgspec's parser, the
  core's decoding);
- ``decode_state_stdlib_s``: :func:`synapse_ha.core.codec.versioned.decode_state` with the standard
  library's parser alone (the reference);
- where the time goes: parsing with each parser (``parse_s``), and rebuilding the records
  from the parsed values (``from_plain_s``).

Prints one JSON object (``--out`` also writes it to a file); ``--smoke`` runs a small
version in seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import emit
from synapse_ha.core import commands as c
from synapse_ha.core.codec.from_plain import from_plain
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, Resources
from synapse_ha.core.scheduler import schedule
from synapse_ha.raft.snapshot_file import read_snapshot_file, write_snapshot

MIB = 2**20
_START_MS = 1_700_000_000_000


def build_state(jobs: int) -> ClusterState:
    """``jobs`` pending one-member jobs with their first pass's reason, compact."""
    state = ClusterState()
    state.config = replace(state.config, compact_state=True)
    for i in range(jobs):
        spec = JobSpec(name=f"f{i}", replicas=1, resources=Resources(10, 16), command=("true",))
        apply(state, c.SubmitJob(spec, f"admin/f{i}", _START_MS + i, "admin"))
    now = _START_MS + jobs + 1_000
    command = schedule(state, now).command(now)
    if command is not None:
        apply(state, command)
    return state


def best_cpu_s(run: Callable[[], Any], repeat: int) -> float:
    """The least process CPU time of ``repeat`` runs, each with the collector paused and
    its result freed outside the measurement."""
    times = []
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            started = time.process_time()
            result = run()
            times.append(time.process_time() - started)
            del result
        finally:
            gc.enable()
    return round(min(times), 3)


def parsers() -> dict[str, Callable[[bytes], Any]]:
    found: dict[str, Callable[[bytes], Any]] = {
        "stdlib": json.loads,
        "msgspec": msgspec.json.Decoder().decode,
    }
    try:
        import orjson  # not a dependency: compared when installed

        found["orjson"] = orjson.loads
    except ImportError:
        pass
    return found


def run(jobs: int, repeat: int) -> dict[str, Any]:
    started = time.monotonic()
    state = build_state(jobs)
    built_s = time.monotonic() - started
    body = encode_state(state)
    plain = json.loads(body)["state"]
    with tempfile.TemporaryDirectory(prefix="synapse-decode-") as tmp:
        path = str(Path(tmp) / "raft.dump")
        write_snapshot(path, state, ((b"newest", 2, 1), (b"older", 1, 1)))
        assert read_snapshot_file(path).state == state
        read_s = best_cpu_s(lambda: read_snapshot_file(path), repeat)
    return {
        "jobs": jobs,
        "build_s": round(built_s, 1),
        "encoded_state_mb": round(len(body) / MIB, 2),
        "repeat": repeat,
        "read_snapshot_file_s": read_s,
        "decode_state_stdlib_s": best_cpu_s(lambda: decode_state(body), repeat),
        "parse_s": {name: best_cpu_s(lambda p=p: p(body), repeat) for name, p in parsers().items()},
        "from_plain_s": best_cpu_s(lambda: from_plain(ClusterState, plain, "state"), repeat),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a small run that takes seconds")
    parser.add_argument("--jobs", type=int, default=134_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, the best kept")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    jobs = 2_000 if args.smoke else args.jobs
    emit({"smoke": args.smoke, **run(jobs, args.repeat)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
