"""Back-to-back benchmark comparison of a git revision (BASE) with this working tree (HEAD).

HEAD is the tree this script is in, uncommitted changes included, with its ``.venv``.

BASE is checked out with ``git worktree add --detach`` and gets a venv of its own
(``python -m venv``, then ``pip install -e '.[test]'``, with the interpreter HEAD's venv
was made from). Without ``--keep`` the tree lives in a temporary directory and is removed
at exit, unless a tree and venv for the same commit already wait in the cache
(``~/.cache/synapse_ha/compare/<sha>/tree``, or below ``$SYNAPSE_COMPARE_CACHE``), which
is then used as it is; ``--keep`` builds the tree in the cache and leaves it there, so that
the next comparison with the same BASE starts at once.

Each tree runs its own benchmark scripts (``bench/*.py``), with its own venv and its own
directory as the working directory. A script the BASE tree does not have, or one that
does not accept a flag the comparison passes (read from its ``--help``), or one without
the text a figure needs (``needs``: a mode its older versions would silently measure as
another), makes that benchmark *missing* for BASE rather than an error. Every run is a
subprocess in a session of its own with a timeout; a run that fails or times out is
recorded with the tail of its standard error and the comparison goes on. Each round runs
every benchmark on both trees one after the other, BASE first in odd rounds and HEAD
first in even ones, so that a drift of the machine weighs on both.

For every figure (:data:`FIGURES`: a name, the benchmark, a path into the JSON the script
prints, and whether higher or lower is better) it prints a table: BASE's and HEAD's value
in every round, the ratio HEAD/BASE of the medians and a verdict: ``worse`` when HEAD's
median is more than 10 % worse than BASE's in the figure's direction, ``better`` when
more than 10 % better, ``same`` otherwise. The JSON (``--out``, default
``bench/results/compare.json``; ``compare_smoke.json`` with ``--smoke``) holds every run
(its arguments, status, seconds, error tail and the whole report it printed), both trees'
commits (and whether HEAD's tree had uncommitted changes) and the figures with their
verdicts.

``--smoke`` runs each benchmark's tiny mode, one round. ``--only`` takes benchmark names
(``throughput-a``), groups (``throughput``, ``failover``) or figure names.

Every process a run starts is ended with it: the script makes itself the subreaper of
its descendants (the replicas the benchmarks start run in sessions of their own), and a
run that times out or is interrupted gets SIGINT (its own clean-up), then SIGKILL, and
whatever it leaves behind is ended too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(  # cached BASE trees, one per commit
    os.environ.get("SYNAPSE_COMPARE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "synapse_ha" / "compare"
)
RESULTS = ROOT / "bench" / "results" / "compare.json"
SMOKE_RESULTS = ROOT / "bench" / "results" / "compare_smoke.json"
READY = ".compare-ready"  # in a cached tree's venv once its install finished
THRESHOLD = 0.10  # a relative change beyond this is a verdict other than "same"
STOP_GRACE_S = 20.0  # from SIGINT to SIGKILL for a run that timed out or was interrupted
HIGHER, LOWER = "higher", "lower"  # which way a figure is better
BASE, HEAD = "base", "head"


@dataclass(frozen=True)
class Benchmark:
    """One run of one script. ``args`` and ``smoke`` are alternatives, preferred first:
    a tree runs the first whose flags its script accepts. ``needs``: text the script's
    source must contain. ``writes``: result files (in the tree) the script writes on its
    own; a run's own write is undone."""

    name: str
    script: str
    args: tuple[tuple[str, ...], ...]
    smoke: tuple[tuple[str, ...], ...]
    timeout_s: float
    smoke_timeout_s: float = 300.0
    needs: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Figure:
    """A number in a benchmark's JSON: ``path`` is dotted keys, ``[N]`` list indexes and
    ``[key=value,...]`` selectors (the last list element whose fields match)."""

    name: str
    benchmark: str
    path: str
    direction: str  # HIGHER or LOWER is better


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "throughput-a",
        "bench/throughput.py",
        args=(("--only", "a", "--out", os.devnull),),
        smoke=(("--smoke", "--only", "a"),),
        timeout_s=900,
    ),
    Benchmark(
        "throughput-b",
        "bench/throughput.py",
        args=(("--only", "b", "--out", os.devnull),),
        smoke=(("--smoke", "--only", "b"),),
        timeout_s=900,
    ),
    # The same two parts with the jobs sent 100 a SubmitJobs call (synctl's and the client
    # library's way for many jobs) and, in (b), heartbeats on streams as workers send them.
    Benchmark(
        "throughput-a-batch",
        "bench/throughput.py",
        args=(("--only", "a", "--batch", "100", "--window", "2", "--out", os.devnull),),
        smoke=(("--smoke", "--only", "a", "--batch", "10", "--window", "2"),),
        timeout_s=900,
        needs=('"--batch"',),
    ),
    Benchmark(
        "throughput-b-batch",
        "bench/throughput.py",
        args=(
            (
                "--only",
                "b",
                "--batch",
                "100",
                "--window",
                "2",
                "--heartbeats",
                "stream",
                "--out",
                os.devnull,
            ),
        ),
        smoke=(("--smoke", "--only", "b", "--batch", "10", "--window", "2"),),
        timeout_s=900,
        needs=('"--batch"',),
    ),
    Benchmark(
        "fanin-stream",
        "bench/heartbeat_fanin.py",
        args=(("--sizes", "3000", "--modes", "stream"),),
        smoke=(("--smoke", "--modes", "stream"),),
        timeout_s=600,
        writes=("bench/results/heartbeat_fanin.json",),
    ),
    Benchmark(
        "fanin-relay",
        "bench/heartbeat_fanin.py",
        args=(("--sizes", "3000", "--modes", "relay"),),
        smoke=(("--smoke", "--modes", "relay"),),
        timeout_s=600,
        needs=('"relay"',),  # before relaying, any mode but "stream" ran as unary calls
        writes=("bench/results/heartbeat_fanin.json",),
    ),
    Benchmark(
        "read-storm",
        "bench/read_storm.py",
        args=(("--seconds", "25"),),
        smoke=(("--smoke",),),
        timeout_s=900,
    ),
    Benchmark(
        # The leader serving the ListJobs storm: the case that weighs most on its heartbeats.
        "read-storm-leader",
        "bench/read_storm.py",
        args=(("--seconds", "25", "--lists-on", "leader"),),
        smoke=(("--smoke", "--lists-on", "leader"),),
        timeout_s=900,
    ),
    Benchmark(
        "incremental", "bench/incremental.py", args=((),), smoke=(("--smoke",),), timeout_s=900
    ),
    Benchmark(
        "failover-kill",
        "bench/failover.py",
        # Before --fault there were only kills, counted by --kills.
        args=(
            ("--fault", "kill", "--faults", "5", "--quiet-s", "10"),
            ("--kills", "5", "--quiet-s", "10"),
        ),
        smoke=(("--smoke", "--fault", "kill"), ("--smoke",)),
        timeout_s=900,
    ),
    Benchmark(
        "failover-freeze",
        "bench/failover.py",
        args=(("--fault", "freeze", "--faults", "5", "--quiet-s", "10"),),
        smoke=(("--smoke", "--fault", "freeze"),),
        timeout_s=900,
    ),
)

FIGURES: tuple[Figure, ...] = (
    Figure("submissions/s", "throughput-a", "submit.submissions_per_s", HIGHER),
    Figure(
        "leader CPU us/submission", "throughput-a", "submit.leader_cpu_us_per_submission", LOWER
    ),
    Figure(
        "followers CPU us/submission",
        "throughput-a",
        "submit.cpu_us_per_submission.followers",
        LOWER,
    ),
    Figure("submit elections", "throughput-a", "submit.elections_during_run", LOWER),
    Figure("members bound/s", "throughput-b", "bind.members_bound_per_s", HIGHER),
    Figure("leader CPU us/member", "throughput-b", "bind.leader_cpu_us_per_member", LOWER),
    Figure("bind elections", "throughput-b", "bind.elections_during_run", LOWER),
    Figure("bind gang requeues", "throughput-b", "bind.gang_requeues", LOWER),
    Figure("100 a call: submissions/s", "throughput-a-batch", "submit.submissions_per_s", HIGHER),
    Figure(
        "100 a call: leader CPU us/submission",
        "throughput-a-batch",
        "submit.leader_cpu_us_per_submission",
        LOWER,
    ),
    Figure(
        "100 a call: followers CPU us/submission",
        "throughput-a-batch",
        "submit.cpu_us_per_submission.followers",
        LOWER,
    ),
    Figure("100 a call: members bound/s", "throughput-b-batch", "bind.members_bound_per_s", HIGHER),
    Figure("100 a call: bind elections", "throughput-b-batch", "bind.elections_during_run", LOWER),
    Figure(
        "stream: leader CPU us/heartbeat",
        "fanin-stream",
        "runs[mode=stream].leader_cpu_us_per_heartbeat",
        LOWER,
    ),
    Figure("stream: heartbeats/s", "fanin-stream", "runs[mode=stream].heartbeats_per_s", HIGHER),
    Figure(
        "relay: leader CPU us/heartbeat",
        "fanin-relay",
        "runs[mode=relay].leader_cpu_us_per_heartbeat",
        LOWER,
    ),
    Figure("relay: heartbeats/s", "fanin-relay", "runs[mode=relay].heartbeats_per_s", HIGHER),
    Figure("ExplainJob calls", "read-storm", "read_calls.ExplainJob", HIGHER),
    Figure("heartbeat p99 ms in storm", "read-storm", "heartbeat_rtt_during_storm.p99_ms", LOWER),
    Figure("leader kept its term", "read-storm", "leader_kept_its_term", HIGHER),
    Figure("leader lists: ExplainJob calls", "read-storm-leader", "read_calls.ExplainJob", HIGHER),
    Figure(
        "leader lists: heartbeat p99 ms",
        "read-storm-leader",
        "heartbeat_rtt_during_storm.p99_ms",
        LOWER,
    ),
    Figure(
        "leader lists: nodes past lease_ttl", "read-storm-leader", "nodes_past_lease_ttl", LOWER
    ),
    Figure("cold pass s", "incremental", "cold_pass_s", LOWER),
    Figure("unchanged pass ms", "incremental", "unchanged_ms", LOWER),
    Figure("one-submission pass ms", "incremental", "one_submission_ms", LOWER),
    Figure("kill: next bind p50 s", "failover-kill", "failover_to_next_bind_s_p50", LOWER),
    Figure("kill: first write p50 s", "failover-kill", "failover_to_first_write_s_p50", LOWER),
    Figure("kill-free elections", "failover-kill", "kill_free_elections", LOWER),
    Figure(
        "freeze: next bind p50 s",
        "failover-freeze",
        "faults.freeze.failover_to_next_bind_s_p50",
        LOWER,
    ),
    Figure(
        "freeze: first write p50 s",
        "failover-freeze",
        "faults.freeze.failover_to_first_write_s_p50",
        LOWER,
    ),
)


# ------------------------------------------------------------------------ pure parts


_STEP = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")


def path_steps(path: str) -> list[str | int | dict[str, str]]:
    """``a.b[2][mode=relay,nodes=3000].c`` -> ``["a", "b", 2, {...}, "c"]``."""
    steps: list[str | int | dict[str, str]] = []
    for match in _STEP.finditer(path):
        bracket, key = match.group(1), match.group(2)
        if key is not None:
            steps.append(key)
        elif "=" in bracket:
            pairs = (part.split("=", 1) for part in bracket.split(","))
            steps.append({k.strip(): v.strip() for k, v in pairs})
        else:
            steps.append(int(bracket))
    return steps


def _matches(item: Any, where: dict[str, str]) -> bool:
    if not isinstance(item, dict):
        return False
    for key, want in where.items():
        if key not in item:
            return False
        got = item[key]
        text = json.dumps(got) if isinstance(got, bool) else str(got)
        if text != want:
            return False
    return True


def extract(report: Any, path: str) -> float | None:
    """The number at ``path`` in ``report`` (a boolean counts 1 or 0), or None when the
    path leads nowhere or to something else than a number."""
    node = report
    for step in path_steps(path):
        if isinstance(step, str):
            if not isinstance(node, dict) or step not in node:
                return None
            node = node[step]
        elif isinstance(step, int):
            if not isinstance(node, list) or not -len(node) <= step < len(node):
                return None
            node = node[step]
        else:
            if not isinstance(node, list):
                return None
            found = [item for item in node if _matches(item, step)]
            if not found:
                return None
            node = found[-1]
    if isinstance(node, bool):
        return float(node)
    if isinstance(node, int | float):
        return float(node)
    return None


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values present, None when there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(base: float | None, head: float | None) -> float | None:
    """HEAD/BASE, None when either is missing or BASE is 0."""
    if base is None or head is None or base == 0:
        return None
    return head / base


def gain(direction: str, base: float, head: float) -> float:
    """How much better HEAD is than BASE in the figure's direction, as a fraction of
    BASE (negative: worse); from a BASE of 0, any change is infinitely large."""
    change = head - base if direction == HIGHER else base - head
    if base == 0:
        return 0.0 if change == 0 else (float("inf") if change > 0 else float("-inf"))
    return change / abs(base)


def verdict(
    direction: str, base: float | None, head: float | None, threshold: float = THRESHOLD
) -> str:
    """``better``, ``worse`` or ``same`` for two medians, or which side is missing."""
    if base is None and head is None:
        return "missing"
    if base is None:
        return "missing on BASE"
    if head is None:
        return "missing on HEAD"
    g = gain(direction, base, head)
    if g > threshold:
        return "better"
    if g < -threshold:
        return "worse"
    return "same"


def round_order(round_index: int) -> tuple[str, str]:
    """Which tree runs first in a round (0-based): BASE in even ones, HEAD in odd ones."""
    return (BASE, HEAD) if round_index % 2 == 0 else (HEAD, BASE)


_OPTION_LINE = re.compile(r"^ {2}(-\S.*)$")


def help_flags(help_text: str) -> set[str]:
    """The long options an argparse ``--help`` text lists."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        match = _OPTION_LINE.match(line)
        if match:
            invocation = re.split(r"\s{2,}", match.group(1))[0]
            flags.update(re.findall(r"--[A-Za-z0-9][\w-]*", invocation))
    return flags


def argv_flags(argv: Sequence[str]) -> set[str]:
    """The long options in an argument list (``--a=b`` counts as ``--a``)."""
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def pick_variant(variants: Sequence[tuple[str, ...]], accepted: set[str]) -> tuple[str, ...] | None:
    """The first argument list whose options are all ``accepted``, or None."""
    for argv in variants:
        if argv_flags(argv) <= accepted:
            return argv
    return None


def select(only: str | None) -> list[Benchmark]:
    """The benchmarks ``--only`` names (benchmark names, the part before a ``-`` in one,
    figure names), in the order of :data:`BENCHMARKS`; every one without ``only``."""
    if not only:
        return list(BENCHMARKS)
    wanted: set[str] = set()
    for token in (t.strip() for t in only.split(",")):
        if not token:
            continue
        hits = {b.name for b in BENCHMARKS if b.name == token or b.name.startswith(token + "-")}
        hits |= {f.benchmark for f in FIGURES if f.name == token}
        if not hits:
            known = ", ".join(b.name for b in BENCHMARKS)
            raise ValueError(f"no benchmark or figure {token!r} (benchmarks: {known})")
        wanted |= hits
    return [b for b in BENCHMARKS if b.name in wanted]


@dataclass
class Options:
    base: str
    rounds: int
    benchmarks: list[Benchmark]
    out: Path
    smoke: bool
    keep: bool


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="compare.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("base", metavar="BASE", help="a git revision: a sha, a branch, HEAD~3")
    parser.add_argument(
        "--rounds", type=int, help="rounds of every benchmark (default 3, 1 with --smoke)"
    )
    names = ", ".join(b.name for b in BENCHMARKS)
    parser.add_argument("--only", help=f"comma-separated benchmarks, groups or figures: {names}")
    parser.add_argument("--out", type=Path, help=f"the JSON (default {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--smoke", action="store_true", help="each benchmark's tiny mode")
    parser.add_argument(
        "--keep", action="store_true", help="build BASE's tree and venv in the cache and keep them"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.smoke else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        benchmarks = select(args.only)
    except ValueError as exc:
        parser.error(str(exc))
    if not benchmarks:
        parser.error("--only named no benchmark")
    out = args.out or (SMOKE_RESULTS if args.smoke else RESULTS)
    return Options(args.base, rounds, benchmarks, out, args.smoke, args.keep)


def summarise(figures: Sequence[Figure], runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per figure: each tree's value in every round (None where the run failed or the
    figure is absent), the medians, the ratio and the verdict. ``runs``: records with
    ``benchmark``, ``tree``, ``round``, ``status`` and ``report``."""
    rounds = sorted({r["round"] for r in runs})
    out = []
    for figure in figures:
        row: dict[str, Any] = {
            "name": figure.name,
            "benchmark": figure.benchmark,
            "path": figure.path,
            "direction": figure.direction,
        }
        mine = [r for r in runs if r["benchmark"] == figure.benchmark]
        if not mine:
            continue
        for tree in (BASE, HEAD):
            by_round = {r["round"]: r for r in mine if r["tree"] == tree}
            values = [
                extract(by_round[n].get("report"), figure.path) if n in by_round else None
                for n in rounds
            ]
            row[tree] = values
            row[f"{tree}_median"] = median(values)
            statuses = [by_round[n]["status"] for n in rounds if n in by_round]
            row[f"{tree}_status"] = statuses
        row["ratio"] = ratio(row["base_median"], row["head_median"])
        row["verdict"] = verdict(figure.direction, row["base_median"], row["head_median"])
        out.append(row)
    return out


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _cell(values: Sequence[float | None], statuses: Sequence[str]) -> str:
    if any(v is not None for v in values):
        return ", ".join(fmt(v) for v in values)
    problems = [s for s in statuses if s != "ok"]
    return problems[0] if problems else "absent"


def table_rows(summary: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            row["name"],
            "higher" if row["direction"] == HIGHER else "lower",
            _cell(row["base"], row["base_status"]),
            _cell(row["head"], row["head_status"]),
            "-" if row["ratio"] is None else f"{row['ratio']:.2f}",
            row["verdict"],
        ]
        for row in summary
    ]


HEADERS = ["figure", "better", "BASE", "HEAD", "HEAD/BASE", "verdict"]


def render_table(summary: Sequence[dict[str, Any]], use_tabulate: bool | None = None) -> str:
    """The figures as a text table, with ``tabulate`` when it is installed (or when
    ``use_tabulate`` says so)."""
    rows = table_rows(summary)
    if use_tabulate is None:
        use_tabulate = importlib.util.find_spec("tabulate") is not None
    if use_tabulate:
        tabulate = importlib.import_module("tabulate").tabulate
        return str(tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True))
    widths = [max(len(str(c)) for c in column) for column in zip(HEADERS, *rows, strict=False)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [HEADERS, ["-" * w for w in widths], *rows]
    ]
    return "\n".join(lines)


def last_json(text: str) -> Any:
    """The JSON object a benchmark printed: the whole output, or the last object that
    starts at the beginning of a line."""
    with contextlib.suppress(ValueError):
        return json.loads(text)
    starts = [m.start() for m in re.finditer(r"^\{", text, re.MULTILINE)]
    decoder = json.JSONDecoder()
    for start in reversed(starts):
        with contextlib.suppress(ValueError):
            return decoder.raw_decode(text, start)[0]
    return None


# ------------------------------------------------------------------------ processes


def _become_subreaper() -> None:
    """Orphaned descendants (the replicas run in sessions of their own) become this
    process's children, so that they can be found and ended."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def descendants(root: int | None = None) -> set[int]:
    """Every live process below ``root`` (this process by default), from /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _reap(pids: set[int]) -> None:
    """Collect those of ``pids`` that are exited children of this process (orphans
    handed to this subreaper among them)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def end_descendants(
    spare: AbstractSet[int] = frozenset(), settle_s: float = 0.0, grace_s: float = 3.0
) -> int:
    """End every descendant but those in ``spare`` (there before a run): those still
    there after ``settle_s`` get SIGTERM, those still there ``grace_s`` later SIGKILL.
    How many got SIGTERM."""
    deadline = time.monotonic() + settle_s
    pids = descendants() - spare
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        _reap(pids)
        pids = descendants() - spare
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        _reap(pids)
        if not descendants() - spare:
            break
        time.sleep(0.1)
    left = descendants() - spare
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.1 if left else 0)
    _reap(pids | left)
    return len(pids)


def stop(proc: subprocess.Popen[bytes], spare: AbstractSet[int]) -> None:
    """SIGINT to the run's process group (its ``finally`` blocks close its clusters),
    SIGKILL to the group after :data:`STOP_GRACE_S`, then an end to every descendant
    left but ``spare``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    end_descendants(spare, grace_s=1.0)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# ----------------------------------------------------------------------------- trees


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.rstrip()  # porcelain lines start with a space


def _tail(text: str, chars: int = 3000) -> str:
    return text[-chars:]


def error_tail(stderr: str, chars: int = 3000) -> str:
    """The end of a failed run's standard error, with the start of its last traceback
    when one is there (a benchmark prints its cluster's logs after it)."""
    start = stderr.rfind("Traceback (most recent call last):")
    if start < 0 or len(stderr) - start <= chars:
        return _tail(stderr, chars)
    return stderr[start : start + chars // 2] + "\n[...]\n" + _tail(stderr, chars // 2)


def base_interpreter() -> str:
    """The interpreter HEAD's venv was made from (same version for both trees)."""
    cfg = ROOT / ".venv" / "pyvenv.cfg"
    with contextlib.suppress(OSError):
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "executable" and Path(value.strip()).exists():
                return value.strip()
    return shutil.which("python3") or sys.executable


@dataclass
class Tree:
    label: str
    path: Path
    sha: str
    cached: bool = False
    flags: dict[str, set[str] | str] = field(default_factory=dict)  # script -> flags or error

    @property
    def python(self) -> Path:
        return self.path / ".venv" / "bin" / "python"


def cache_problem(tree: Path, sha: str) -> str | None:
    """Why the cached ``tree`` cannot stand for ``sha`` (None: it can). Result files a
    benchmark rewrote (``bench/results/``) do not count."""
    if not (tree / ".venv" / READY).exists() or not (tree / ".venv" / "bin" / "python").exists():
        return "its venv is not complete"
    try:
        if git("rev-parse", "HEAD", cwd=tree) != sha:
            return "it is at another commit"
        changed = git("status", "--porcelain", "--untracked-files=no", cwd=tree).splitlines()
    except subprocess.CalledProcessError:
        return "it is not a git worktree"
    sources = [c for c in changed if not c[3:].startswith("bench/results/")]
    return f"it has local changes: {', '.join(c[3:] for c in sources)}" if sources else None


def _remove_worktree(path: Path) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        git("worktree", "remove", "--force", str(path))
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(subprocess.CalledProcessError):
        git("worktree", "prune")


def _build(path: Path, sha: str) -> None:
    """A detached worktree at ``sha`` with a venv holding it (editable) and its test
    extra."""
    print(f"compare: checking out {sha[:12]} in {path}", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    git("worktree", "add", "--detach", str(path), sha)
    print("compare: creating its venv (pip install -e '.[test]')", file=sys.stderr)
    started = time.monotonic()
    steps = [
        [base_interpreter(), "-m", "venv", str(path / ".venv")],
        [str(path / ".venv" / "bin" / "python"), "-m", "pip", "install", "-q", "-e", ".[test]"],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, cwd=path, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{' '.join(step)} took over {exc.timeout:.0f} s") from exc
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step)} failed:\n{_tail(done.stdout + done.stderr)}")
    (path / ".venv" / READY).write_text(sha + "\n")
    print(f"compare: venv ready in {time.monotonic() - started:.0f} s", file=sys.stderr)


@contextlib.contextmanager
def base_tree(revision: str, keep: bool) -> Iterator[Tree]:
    """BASE's tree and venv: the cached one if it is ready, else a new one, in the cache
    with ``keep`` (when nothing is there yet), else in a temporary directory removed on
    exit."""
    sha = git("rev-parse", "--verify", f"{revision}^{{commit}}")
    cached = CACHE / sha / "tree"
    if cached.exists():
        problem = cache_problem(cached, sha)
        if problem is None:
            print(f"compare: BASE {sha[:12]} from the cache {cached}", file=sys.stderr)
            yield Tree(BASE, cached, sha, cached=True)
            return
        # Left as it is: another comparison may be building or using it.
        print(
            f"compare: not using {cached} ({problem}); to rebuild it: "
            f"git worktree remove --force {cached}",
            file=sys.stderr,
        )
    elif keep:
        try:
            _build(cached, sha)
        except BaseException:
            _remove_worktree(cached)
            raise
        yield Tree(BASE, cached, sha, cached=True)
        return
    temporary = Path(tempfile.mkdtemp(prefix="synapse-compare-"))
    path = temporary / "tree"
    try:
        _build(path, sha)
        yield Tree(BASE, path, sha)
    finally:
        _remove_worktree(path)
        shutil.rmtree(temporary, ignore_errors=True)


def head_tree() -> Tree:
    if not (ROOT / ".venv" / "bin" / "python").exists():
        raise SystemExit(f"compare: HEAD's venv {ROOT / '.venv'} is missing (make venv)")
    return Tree(HEAD, ROOT, git("rev-parse", "HEAD"))


def _environment(tree: Tree) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(tree.path / ".venv")
    env["PATH"] = f"{tree.path / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def execute(
    argv: Sequence[str], tree: Tree, timeout_s: float, stdout: IO[bytes], stderr: IO[bytes]
) -> tuple[int, bool, int]:
    """Run ``argv`` in ``tree`` (its venv, its directory), in a session of its own; end
    it when ``timeout_s`` passes, and every process it left behind in any case. Its exit
    status, whether it timed out, and how many processes it left behind."""
    spare = descendants()  # not this run's
    proc = subprocess.Popen(
        list(argv),
        cwd=tree.path,
        env=_environment(tree),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc, spare)
        timed_out = True
    except BaseException:
        stop(proc, spare)
        raise
    finally:
        leftover = end_descendants(spare, settle_s=2.0)
    return proc.returncode, timed_out, leftover


def accepted_flags(tree: Tree, script: str) -> set[str] | str:
    """The options ``script`` of ``tree`` accepts (from its ``--help``), or why they
    are unknown."""
    if script not in tree.flags:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            code, timed_out, _ = execute([str(tree.python), script, "--help"], tree, 60, out, err)
            out.seek(0)
            err.seek(0)
            text, error = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        tree.flags[script] = (
            help_flags(text)
            if code == 0 and not timed_out
            else f"{script} --help {'timed out' if timed_out else f'exited {code}'}: "
            + _tail(error, 500)
        )
    return tree.flags[script]


@dataclass(frozen=True)
class Refusal:
    """Why a tree does not run a benchmark: ``status`` ``missing`` or ``failed``."""

    status: str
    why: str


def choose(tree: Tree, bench: Benchmark, smoke: bool) -> tuple[str, ...] | Refusal:
    """The arguments ``tree`` runs ``bench`` with, or why it does not run it."""
    if not (tree.path / bench.script).exists():
        return Refusal("missing", f"no {bench.script}")
    source = (tree.path / bench.script).read_text(errors="replace")
    absent = [text for text in bench.needs if text not in source]
    if absent:
        return Refusal("missing", f"{bench.script} lacks {absent}")
    variants = bench.smoke if smoke else bench.args
    if not argv_flags(variants[0]):
        return variants[0]  # no options to check
    accepted = accepted_flags(tree, bench.script)
    if isinstance(accepted, str):
        return Refusal("failed", accepted)
    argv = pick_variant(variants, accepted)
    if argv is None:
        wanted = sorted(set().union(*(argv_flags(v) for v in variants)) - accepted)
        return Refusal("missing", f"{bench.script} has no {', '.join(wanted)}")
    return argv


def run_one(tree: Tree, bench: Benchmark, smoke: bool, round_index: int) -> dict[str, Any]:
    """One run of ``bench`` on ``tree``: its record (status ``ok``, ``missing``,
    ``failed`` or ``timeout``)."""
    record: dict[str, Any] = {
        "round": round_index + 1,
        "benchmark": bench.name,
        "tree": tree.label,
        "script": bench.script,
        "argv": None,
        "status": "ok",
        "started": _now(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "report": None,
    }
    argv = choose(tree, bench, smoke)
    if isinstance(argv, Refusal):
        return {**record, "status": argv.status, "error": argv.why}
    record["argv"] = [bench.script, *argv]
    before = {w: _read_bytes(tree.path / w) for w in bench.writes}
    timeout = bench.smoke_timeout_s if smoke else bench.timeout_s
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        code, timed_out, leftover = execute(
            [str(tree.python), bench.script, *argv], tree, timeout, out, err
        )
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    record.update(
        seconds=round(time.monotonic() - started, 1), returncode=code, leftover_processes=leftover
    )
    report = last_json(stdout)
    _undo_writes(tree, before, report)
    if timed_out:
        record["status"] = "timeout"
    elif code != 0:
        record["status"] = "failed"
    elif not isinstance(report, dict):
        record["status"] = "failed"
        record["error"] = "printed no JSON object: " + _tail(stdout, 1000)
    if record["status"] != "ok":
        record.setdefault("error", error_tail(stderr))
    record["report"] = report if isinstance(report, dict) else None
    return record


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _undo_writes(tree: Tree, before: dict[str, bytes | None], report: Any) -> None:
    """Put back each result file the run overwrote with its own report (a file changed
    by anything else is left alone)."""
    for name, old in before.items():
        path = tree.path / name
        new = _read_bytes(path)
        if new == old or new is None or report is None:
            continue
        try:
            ours = json.loads(new) == report
        except ValueError:
            ours = False
        if not ours:
            continue
        if old is None:
            path.unlink()
        else:
            path.write_bytes(old)


# ------------------------------------------------------------------------------ main


def describe(tree: Tree) -> dict[str, Any]:
    info: dict[str, Any] = {"sha": tree.sha, "tree": str(tree.path)}
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        info["python"] = subprocess.run(
            [str(tree.python), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return info


def notes(runs: Sequence[dict[str, Any]]) -> list[str]:
    """One line per run that did not give a report."""
    lines = []
    for r in runs:
        if r["status"] != "ok":
            error = (r.get("error") or "").strip().splitlines()
            last = error[-1] if error else ""
            lines.append(
                f"round {r['round']} {r['benchmark']} on {r['tree'].upper()}: {r['status']}"
                + (f" ({last[:200]})" if last else "")
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    _become_subreaper()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    head = head_tree()
    changes = git("status", "--porcelain").splitlines()
    result: dict[str, Any] = {
        "base_revision": options.base,
        "smoke": options.smoke,
        "rounds": options.rounds,
        "benchmarks": [b.name for b in options.benchmarks],
        "threshold": THRESHOLD,
        "cpus": os.cpu_count(),
        "started": _now(),
    }
    runs: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None  # the run under way
    interrupted = False
    try:
        with base_tree(options.base, options.keep) as base:
            local = git("status", "--porcelain", "--untracked-files=no", cwd=base.path)
            result["base"] = {
                **describe(base),
                "cached": base.cached,
                "changes": local.splitlines(),
            }
            result["head"] = {**describe(head), "dirty": bool(changes), "changes": changes[:100]}
            trees = {BASE: base, HEAD: head}
            total = options.rounds * len(options.benchmarks) * 2
            for n in range(options.rounds):
                for bench in options.benchmarks:
                    for label in round_order(n):
                        current = {"round": n + 1, "benchmark": bench.name, "tree": label}
                        record = run_one(trees[label], bench, options.smoke, n)
                        runs.append(record)
                        current = None
                        print(
                            f"compare: [{len(runs)}/{total}] round {n + 1} {bench.name} "
                            f"{label.upper()}: {record['status']}"
                            + (f" in {record['seconds']} s" if "seconds" in record else ""),
                            file=sys.stderr,
                        )
    except KeyboardInterrupt:
        interrupted = True
        if current is not None:
            runs.append({**current, "status": "interrupted", "report": None})
        print("compare: interrupted; writing what was measured", file=sys.stderr)
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
        print(f"compare: BASE {options.base!r}: {exc}\n{detail or ''}".rstrip(), file=sys.stderr)
        return 2
    finally:
        end_descendants()
    figures = [f for f in FIGURES if f.benchmark in {b.name for b in options.benchmarks}]
    summary = summarise(figures, runs)
    result.update(
        {
            "finished": _now(),
            "interrupted": interrupted,
            "figures": summary,
            "verdicts": {row["name"]: row["verdict"] for row in summary},
            "runs": runs,
        }
    )
    base_sha = result.get("base", {}).get("sha", "?")[:12]
    dirty = " + uncommitted changes" if changes else ""
    print(f"BASE {options.base} ({base_sha})  vs  HEAD {head.sha[:12]}{dirty}  ", end="")
    print(f"({options.rounds} round{'s' if options.rounds > 1 else ''}, values per round)")
    print(render_table(summary))
    for line in notes(runs):
        print(line)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"JSON: {options.out}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
