"""The submitter: ``python -m chaos.workload CONFIG_JSON``, run in the client namespace.

It submits gang jobs through :class:`synapse_ha.client.cluster.ClusterClient` (leader
discovery, redirects, idempotent retries by request id) until the stop file appears, and
records every submission in ``submissions.jsonl``: ``begin`` before the call, then

* ``ok`` with the job id when a replica acknowledged it;
* ``failed`` when a replica refused it with a definitive status (nothing was created);
* ``unknown`` when no answer came in time: the job may or may not exist.

The submitter calls as the cluster's admin over mutual TLS (the ``tls_*`` files of its
config); with none given it speaks plaintext to an ``--insecure`` cluster.

Unknown submissions are not retried, so the checker can verify "at most once" for them.

With ``queue_gpus`` set (the cluster's GPUs), the submitter first creates the cohort
``chaos`` with fair-sharing preemption on and three queues in it that share those GPUs
(:func:`queue_nominals`): ``team-a`` (3/8), ``team-b`` (1/4) and ``team-c`` (the rest),
and submits to the first two. team-c submits nothing: its idle quota is what the others
borrow. team-b (most jobs, class ``low``) borrows far beyond its small nominal; team-a's
jobs reclaim what team-b borrows while team-a is below its nominal, and once team-a is at
or above it they preempt team-b's gangs by fair share (team-b's share, held over nominal,
stays the higher); a quarter of team-a's jobs are of class ``high``, which preempts
team-a's own ``low`` gangs. So every kind of preemption happens while the faults run.
Jobs are drawn from a seeded random generator: gangs of 2-3 members of 1-2 mock GPUs each
(configurable), each member running :mod:`chaos.member` for a drawn number of
milliseconds. With ``array_share`` set, that share of the submissions are job arrays
(``array: "0-4%2"``) of 3-6 tasks, each task a gang of the smallest size and GPU count
running for a duration from the lower half of the range; about half of them are
throttled to 1 or 2 tasks at once. An array's records carry its text and throttle, and
its acknowledged ``job_id`` is the array's id (its tasks are ``<id>_<index>``).

With ``sbatch_share`` set, that share of the submissions are Slurm batch scripts
(:func:`batch_script`) translated as ``synctl sbatch`` does
(:func:`synapse_ha.client.sbatch.translate`): two-node allocations whose script starts
three job steps in the background with ``srun ... &`` and ``wait``s for them: two of
tasks of :mod:`chaos.steptask` recording themselves in ``steps.jsonl``, and the commit,
one :mod:`chaos.member` task per node, so exactly-once holds for these jobs as for gangs.
An sbatch job takes the submission slots of ``SBATCH_SLOTS`` gangs (the wait after it is
that many intervals). An sbatch job's records carry ``sbatch: true``.

With ``replace_share`` set, that share of the single gangs (not arrays, not sbatch jobs)
ask for member replacement (``on_node_failure: replace``, a ``replace_timeout`` of
:data:`REPLACE_TIMEOUT_MS` and ``SIGUSR1`` as the membership signal): a member lost to its
node or a GPU fault is placed again while the rest of the gang runs on. Their members get
``CHAOS_REPLACE=1`` (so their records say so), ask ``replace_cpu_milli`` of a node's CPUs
(more than half a worker's, so that no two of their members share a node and a node lost
costs such a gang one member), are of the smallest gang size of two or more and the
fewest GPUs (so that they are placed about as easily as other gangs, and a node is left to
place a lost rank on), run :data:`REPLACE_EXTRA_MS` longer (so that the
rest of the gang still runs once a lost rank may be placed again) and take the submission
slots of :data:`REPLACE_SLOTS` gangs, and their submission records carry
``replace: true``.

With ``elastic_share`` set, that share of the other single gangs are elastic
(``replicas: {min, max}``, core/elastic.py): at most :data:`ELASTIC_MAX` members of one
GPU each and at least one fewer (``ELASTIC_MIN``), of class ``low`` in their queue, and
``SIGUSR1`` as the membership signal. Each member asks ``elastic_memory_mib`` of a node's
memory (more than half a worker's, so that no two share a node and the node of a rank
above ``min`` has room for a gang that needs it only once that rank is given back,
chaos/elasticfaults.py); they run :data:`ELASTIC_EXTRA_MS` longer (long
enough to be resized and resized back) and take :data:`ELASTIC_SLOTS` submission slots.
Their members get ``CHAOS_ELASTIC=<min>:<max>`` (so their records say so, and the
elastic kinds aim with it, chaos/elasticfaults.py) and commit with a world of ``min``:
the output of an elastic gang is whole once ranks ``0..min-1`` of one attempt committed,
whatever it grew to. Their submission records carry ``elastic: [min, max]``.

With ``paced_share`` set, that share of the remaining single gangs are paced
(:func:`paced_spec`): :data:`PACED_SIZE` members of one GPU each, each asking
``replace_cpu_milli`` of a node's CPUs (so that they run on different nodes), running for
:data:`PACED_MS` and reporting their pace (``CHAOS_PACE=1``, chaos/member.py): the
``slow-node`` kind throttles one of them (chaos/slowfaults.py), and the others are the
healthy nodes no slow-node mark may name. They take :data:`PACED_SLOTS` submission slots.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from chaos.ledger import Appender, now_ns
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable, new_request_id
from synapse_ha.client.sbatch import translate
from synapse_ha.core.spec.document import parse_job_spec
from synapse_ha.core.workflows.arrays import parse_array
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import spec_to_proto
from synapse_ha.security.tls import TlsFiles, Transport

# Statuses by which a replica refused a submission outright (nothing was committed).
DEFINITIVE = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    seed: int
    replicas: list[str]  # gRPC addresses
    submissions: str  # path of submissions.jsonl
    ledger: str  # path of ledger.jsonl (for the members)
    sink: str  # HOST:PORT of the sink
    stop_file: str
    python: str
    pythonpath: str
    interval_s: float = 1.2
    member_ms: tuple[int, int] = (1500, 5000)
    gang_sizes: tuple[int, ...] = (2, 3)
    gpus_per_member: tuple[int, ...] = (1, 2)
    submit_timeout_s: float = 5.0
    # The caller's TLS files (CA bundle, certificate, key); empty: plaintext.
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # Queues and preemption: the GPUs the cohort's queues share (queue_nominals; 0: no
    # queues, every job in the default queue).
    queue_gpus: int = 0
    # The share of jobs that wait (afterok) for the newest job acknowledged before them,
    # so that dependency chains run through the faults (0: none).
    dependency_share: float = 0.0
    # The share of submissions that are job arrays (0: none; nothing else is drawn then,
    # so a seed makes the same jobs as without the field). A job that waits for the newest
    # acknowledged submission may thus wait for an array.
    array_share: float = 0.0
    # The share of submissions that are sbatch jobs with background steps (0: none; as
    # for arrays, nothing else is drawn then).
    sbatch_share: float = 0.0
    steps: str = ""  # path of steps.jsonl (for the steps' tasks and the batch scripts)
    # The share of single gangs submitted with on_node_failure: replace (0: none; as for
    # arrays, nothing is drawn then).
    replace_share: float = 0.0
    # What each member of those gangs asks of a node's CPUs (0: as every member): the
    # cluster asks for more than half a worker's, so that they never share a node.
    replace_cpu_milli: int = 0
    # The share of the other single gangs (not replace gangs) submitted elastic (0: none;
    # as for arrays, nothing is drawn then).
    elastic_share: float = 0.0
    # What each member of those gangs asks of a node's memory (0: as every member): the
    # cluster asks for more than half a worker's, so that no two share a node.
    elastic_memory_mib: int = 0
    # The share of the other single gangs (not replace, not elastic) that are paced (0:
    # none; as for arrays, nothing is drawn then).
    paced_share: float = 0.0

    def transport(self) -> Transport:
        if not (self.tls_ca and self.tls_cert and self.tls_key):
            return Transport.insecure()
        return Transport(
            TlsFiles(ca=Path(self.tls_ca), cert=Path(self.tls_cert), key=Path(self.tls_key))
        )


QUEUES = ("team-a", "team-b", "team-c")
COHORT = "chaos"
# Each queue's nominal, in eighths of the cohort's GPUs (team-c: the rest). team-b's is the
# smallest, so that its share (what it holds over its nominal) stays above team-a's while
# it borrows: team-a, at or above its nominal, may then take team-b's borrowed gangs by
# fair share (the preemption must leave team-b at or above team-a's share).
NOMINAL_EIGHTHS = {"team-a": 3, "team-b": 2}


def queue_nominals(gpus: int) -> dict[str, int]:
    """Each queue's nominal GPUs of the cohort's ``gpus``; they add up to ``gpus``."""
    out = {name: gpus * eighths // 8 for name, eighths in NOMINAL_EIGHTHS.items()}
    return {**out, "team-c": gpus - sum(out.values())}


def queue_and_class(cfg: WorkloadConfig, rng: random.Random) -> tuple[str, str]:
    if not cfg.queue_gpus:
        return "", ""
    if rng.random() < 0.6:
        return "team-b", "low"
    return "team-a", "high" if rng.random() < 0.25 else "low"


def set_up_queues(client: ClusterClient, cfg: WorkloadConfig, stop: Path) -> None:
    """Create the cohort with fair-sharing preemption on and its queues (idempotent),
    retrying each until the cluster takes it."""
    cohort = pb.Cohort(name=COHORT, fair_sharing_preemption=True)
    calls: list[tuple[str, object]] = [("SetCohort", pb.SetCohortRequest(cohort=cohort))]
    for name, nominal in queue_nominals(cfg.queue_gpus).items():
        # A class that preempts must be listed by the queue (DESIGN §8): team-a's "high"
        # gangs preempt within it.
        queue = pb.Queue(
            name=name, gpu=nominal, cohort=COHORT, priority_classes=["low", "normal", "high"]
        )
        calls.append(("SetQueue", pb.SetQueueRequest(queue=queue)))
    for method, request in calls:
        while not stop.exists():
            try:
                client.ask(method, request)
                break
            except (ClusterUnavailable, grpc.RpcError):
                time.sleep(0.2)


ARRAY_TASKS = (3, 6)  # the fewest and most tasks of an array
ARRAY_THROTTLES = (1, 2)  # the throttles a throttled array is drawn with
ARRAY_THROTTLED_SHARE = 0.5


def array_text(cfg: WorkloadConfig, rng: random.Random) -> str:
    """``array:`` for the next submission, or "" for a single job (drawn at
    ``array_share``; nothing is drawn when it is 0)."""
    if not cfg.array_share or rng.random() >= cfg.array_share:
        return ""
    last = rng.randint(*ARRAY_TASKS) - 1
    throttled = rng.random() < ARRAY_THROTTLED_SHARE
    return f"0-{last}%{rng.choice(ARRAY_THROTTLES)}" if throttled else f"0-{last}"


# How long a lost member may wait to be placed again before its gang is requeued whole:
# past the dead timeout and a pass or two, short enough that a gang waiting for room
# never holds its other members' GPUs for long.
REPLACE_TIMEOUT_MS = 10_000
REPLACE_SIGNAL = "SIGUSR1"
# How much longer than other gangs' the members of replace gangs run: a node is declared
# dead only after the dead timeout, and a member lost then is placed again only while
# another member of its gang still runs (a gang with none left is requeued whole).
REPLACE_EXTRA_MS = 4_000
# A replace gang takes the submission slots of this many gangs (the wait after it is that
# many intervals): its members run longer and never share a node, and the load a run
# offers sets how long its cluster takes to drain after the heal.
REPLACE_SLOTS = 2


def replace_policy(cfg: WorkloadConfig, rng: random.Random) -> pb.ReplacePolicy | None:
    """``on_node_failure: replace`` for the next single gang, at ``replace_share``
    (nothing is drawn when it is 0)."""
    if not cfg.replace_share or rng.random() >= cfg.replace_share:
        return None
    return pb.ReplacePolicy(timeout_ms=REPLACE_TIMEOUT_MS, signal=REPLACE_SIGNAL)


# An elastic gang's most members (drawn) and its fewest (drawn below the most): small
# enough that its growth and its shrink fit the chaos cluster's four workers of four GPUs.
ELASTIC_MAX = (2, 3)
ELASTIC_MIN = (1, 2)
ELASTIC_SIGNAL = "SIGUSR1"
ELASTIC_ENV = "CHAOS_ELASTIC"  # <min>:<max>, for the members' records (chaos/member.py)
# How much longer than other gangs' the members of elastic gangs run, and how many
# submission slots such a gang takes (as replace gangs do): a resize takes a leader
# period (1 s), the stop of the ranks given back or the start of the new ones and the
# heartbeat that tells the rest, so a gang must run long enough to be resized and
# resized back; two slots keep the load a run offers about the same.
ELASTIC_EXTRA_MS = 4_000
ELASTIC_SLOTS = 2


def elastic_policy(cfg: WorkloadConfig, rng: random.Random) -> tuple[int, int] | None:
    """``(min, max)`` for the next single gang when it is elastic, at ``elastic_share``
    (nothing is drawn when it is 0)."""
    if not cfg.elastic_share or rng.random() >= cfg.elastic_share:
        return None
    most = rng.choice(ELASTIC_MAX)
    return rng.choice([m for m in ELASTIC_MIN if m < most]), most


# The share of the other single gangs the chaos cluster's workload paces.
PACED_SHARE = 0.1
# A paced gang: its members run on different nodes and long enough for the leader to
# weigh three windows of their pace (the chaos cluster's are a few seconds, see
# chaos.nemesis.SLOW_NODE_WINDOW_S) and mark the node of a throttled one.
PACED_SIZE = 2
PACED_MS = 14_000
PACED_SLOTS = 3
PACE_ENV = "CHAOS_PACE"  # chaos/member.py


def paced_spec(
    name: str, python: str, pythonpath: str, ledger: str, sink: str, cpu_milli: int
) -> pb.JobSpec:
    """A paced gang (see the module docstring), of the default queue and class."""
    member = [python, "-m", "chaos.member", ledger, sink, str(PACED_MS)]
    return pb.JobSpec(
        name=name,
        replicas=PACED_SIZE,
        resources=pb.Resources(cpu_milli=cpu_milli or 500, memory_mib=256, gpu=1),
        argv=pb.CommandArgs(args=member),
        env=[pb.EnvVar(name="PYTHONPATH", value=pythonpath), pb.EnvVar(name=PACE_ENV, value="1")],
        retries=pb.RetryPolicy(max=100, backoff_ms=200, max_backoff_ms=1000),
    )


def is_paced(cfg: WorkloadConfig, rng: random.Random) -> bool:
    """Whether the next single gang is paced (drawn at ``paced_share``; nothing is drawn
    when it is 0)."""
    return bool(cfg.paced_share) and rng.random() < cfg.paced_share


def job_spec(cfg: WorkloadConfig, rng: random.Random, index: int, after: str = "") -> pb.JobSpec:
    """The ``index``-th job (or array, see :func:`array_text`); with ``after`` (a job or
    array id), one that waits for it (afterok) at ``dependency_share``; a single gang asks
    for member replacement at ``replace_share``, or else is elastic at ``elastic_share``."""
    array = array_text(cfg, rng)
    low, high = cfg.member_ms
    duration = rng.randint(low, (low + high) // 2) if array else rng.randint(low, high)
    queue, priority_class = queue_and_class(cfg, rng)
    waits = after and rng.random() < cfg.dependency_share
    replicas = min(cfg.gang_sizes) if array else rng.choice(cfg.gang_sizes)
    gpu = min(cfg.gpus_per_member) if array else rng.choice(cfg.gpus_per_member)
    replacing = None if array or replicas < 2 else replace_policy(cfg, rng)
    if replacing is not None:
        # The smallest gang of two or more, of the fewest GPUs: its members need nodes of
        # their own (replace_cpu_milli), so it is the hardest gang to place, and a gang
        # waiting for room holds back those behind it; and a node lost must leave a node
        # free to place the rank on.
        replicas = min(n for n in cfg.gang_sizes if n >= 2)
        gpu = min(cfg.gpus_per_member)
        duration += REPLACE_EXTRA_MS
    sizes = None if array or replacing is not None else elastic_policy(cfg, rng)
    env = [pb.EnvVar(name="PYTHONPATH", value=cfg.pythonpath)]
    if replacing is not None:
        env.append(pb.EnvVar(name="CHAOS_REPLACE", value="1"))
    if sizes is not None:
        # Of the lowest class, so that any gang waiting for room may take its members
        # above min back (a shrink gives only to a gang of the same or a higher priority).
        replicas, gpu = sizes[1], 1
        priority_class = "low" if priority_class else ""
        duration += ELASTIC_EXTRA_MS
        env.append(pb.EnvVar(name=ELASTIC_ENV, value=f"{sizes[0]}:{sizes[1]}"))
    return pb.JobSpec(
        dependencies=pb.Dependencies(after_ok=[after]) if waits else None,
        queue=queue,
        priority_class=priority_class,
        name=f"chaos-{cfg.seed}-{index}",
        replicas=replicas,
        resources=pb.Resources(
            cpu_milli=cfg.replace_cpu_milli if replacing and cfg.replace_cpu_milli else 500,
            memory_mib=cfg.elastic_memory_mib if sizes and cfg.elastic_memory_mib else 256,
            gpu=gpu,
        ),
        argv=pb.CommandArgs(
            args=[cfg.python, "-m", "chaos.member", cfg.ledger, cfg.sink, str(duration)]
        ),
        env=env,
        retries=pb.RetryPolicy(max=100, backoff_ms=200, max_backoff_ms=1000),
        array=array,
        replace=replacing,
        elastic=(pb.ElasticPolicy(min_replicas=sizes[0], signal=ELASTIC_SIGNAL) if sizes else None),
    )


SBATCH_NODES = 2
# An sbatch job takes the submission slots of this many gangs: its step daemons, sruns and
# tasks cost the suite's two cores about as much CPU as two gangs' members, and the load a
# run offers sets how long its cluster takes to drain after the heal.
SBATCH_SLOTS = 2
RETRIES = {"max": 100, "backoff": "200ms", "max_backoff": "1s"}


def batch_script(
    cfg: WorkloadConfig, name: str, queue: str, priority_class: str, ms: tuple[int, int, int]
) -> str:
    """A chaos sbatch job's script: three job steps in the background, ``wait``ed for:
    4 tasks and 2 tasks recording themselves for ``ms[0]`` and ``ms[1]`` milliseconds, and
    the commit step (one :mod:`chaos.member` per node for ``ms[2]`` ms), whose status is
    the script's. At once rather than one after the other, so that an sbatch job pays
    ``srun``'s start-up once and lasts about as long as a gang."""
    directives = [
        f"--job-name={name}",
        f"--nodes={SBATCH_NODES}",
        "--gpus-per-node=1",
        f"--export=PYTHONPATH={cfg.pythonpath}",
        *([f"--partition={queue}"] if queue else []),
        *([f"--qos={priority_class}"] if priority_class else []),
    ]
    member = f'"$py" -m chaos.member {cfg.ledger} {cfg.sink} {ms[2]}'
    lines = [
        "#!/bin/sh",
        *(f"#SBATCH {d}" for d in directives),
        f"py={cfg.python}",
        f"steps={cfg.steps}",
        f"task={cfg.pythonpath}/chaos/steptask.py",
        '"$py" -P "$task" batch start "$steps"',
        f'srun --nodes=2 --ntasks-per-node=2 "$py" -P "$task" task "$steps" {ms[0]} &',
        "first=$!",
        f'srun --nodes=2 --ntasks-per-node=1 "$py" -P "$task" task "$steps" {ms[1]} &',
        "second=$!",
        f"srun --nodes={SBATCH_NODES} --ntasks-per-node=1 {member} &",
        "commit=$!",
        'wait "$first"; a=$?',
        'wait "$second"; b=$?',
        'wait "$commit"; status=$?',
        '"$py" -P "$task" batch end "$steps" "$a" "$b" "$status"',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def sbatch_spec(cfg: WorkloadConfig, rng: random.Random, index: int) -> pb.JobSpec:
    """The ``index``-th job as an sbatch job: :func:`batch_script` translated as
    ``synctl sbatch`` translates it, with the workload's retries. Its steps run for
    durations from the lower half of the member range, the commit as long as the longer."""
    low, high = cfg.member_ms
    half = (low + high) // 2
    first, second = rng.randint(low, half), rng.randint(low, half)
    ms = (first, second, max(first, second))
    queue, priority_class = queue_and_class(cfg, rng)
    name = f"chaos-{cfg.seed}-{index}"
    script = batch_script(cfg, name, queue, priority_class, ms)
    run_dir = str(Path(cfg.submissions).parent)
    document = translate(script, f"{name}.sh", environ={}, submit_dir=run_dir).spec
    document["retries"] = RETRIES
    return spec_to_proto(parse_job_spec(document, topology_levels=None).spec)


def is_sbatch(cfg: WorkloadConfig, rng: random.Random) -> bool:
    """Whether the next submission is an sbatch job (drawn at ``sbatch_share``; nothing is
    drawn when it is 0)."""
    return bool(cfg.sbatch_share) and rng.random() < cfg.sbatch_share


def submit_one(
    client: ClusterClient, spec: pb.JobSpec, out: Appender, timeout_s: float, sbatch: bool = False
) -> tuple[str, str]:
    """The outcome (ok, failed or unknown) and, when ok, the job id (an array's id for an
    array)."""
    request_id = new_request_id()
    base: dict[str, object] = {"request_id": request_id, "name": spec.name}
    if sbatch:
        base["sbatch"] = True
    if spec.array:
        base.update(array=spec.array, throttle=parse_array(spec.array).throttle)
    if spec.HasField("replace"):
        base["replace"] = True
    if spec.HasField("elastic"):
        base["elastic"] = [spec.elastic.min_replicas, spec.replicas]
    if any(e.name == PACE_ENV and e.value == "1" for e in spec.env):
        base["paced"] = True
    out.append({"type": "begin", **base, "mono_ns": now_ns()})
    try:
        answer = client.submit_job(spec, request_id=request_id, timeout_s=timeout_s)
    except ClusterUnavailable as exc:
        out.append({"type": "unknown", **base, "detail": str(exc)[:500], "mono_ns": now_ns()})
        return "unknown", ""
    except grpc.RpcError as exc:
        code = exc.code()
        kind = "failed" if code in DEFINITIVE else "unknown"
        detail = f"{code.name if code else 'UNKNOWN'}: {exc.details()}"
        out.append({"type": kind, **base, "detail": detail[:500], "mono_ns": now_ns()})
        return kind, ""
    out.append({"type": "ok", **base, "job_id": answer.job_id, "mono_ns": now_ns()})
    return "ok", answer.job_id


def run(cfg: WorkloadConfig) -> int:
    rng = random.Random(f"workload-{cfg.seed}")
    stop = Path(cfg.stop_file)
    counts: dict[str, int] = {}
    with (
        Appender(Path(cfg.submissions)) as out,
        ClusterClient(
            cfg.replicas,
            timeout_s=cfg.submit_timeout_s,
            per_try_timeout_s=1.0,
            channel_factory=cfg.transport().channel,
        ) as client,
    ):
        if cfg.queue_gpus:
            set_up_queues(client, cfg, stop)
        index = 0
        newest = ""  # the newest job acknowledged
        while not stop.exists():
            sbatch = is_sbatch(cfg, rng)
            paced = not sbatch and is_paced(cfg, rng)
            if paced:
                name = f"chaos-{cfg.seed}-{index}"
                args = (cfg.python, cfg.pythonpath, cfg.ledger, cfg.sink, cfg.replace_cpu_milli)
                spec = paced_spec(name, *args)
            elif sbatch:
                spec = sbatch_spec(cfg, rng, index)
            else:
                spec = job_spec(cfg, rng, index, newest)
            outcome, job_id = submit_one(client, spec, out, cfg.submit_timeout_s, sbatch)
            newest = job_id or newest
            counts[outcome] = counts.get(outcome, 0) + 1
            index += 1
            slots = (
                PACED_SLOTS
                if paced
                else SBATCH_SLOTS
                if sbatch
                else REPLACE_SLOTS
                if spec.HasField("replace")
                else ELASTIC_SLOTS
                if spec.HasField("elastic")
                else 1
            )
            deadline = time.monotonic() + cfg.interval_s * rng.uniform(0.5, 1.5) * slots
            while time.monotonic() < deadline and not stop.exists():
                time.sleep(0.05)
    print(json.dumps({"submissions": counts}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m chaos.workload CONFIG_JSON", file=sys.stderr)
        return 2
    doc = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    for key in ("member_ms", "gang_sizes", "gpus_per_member"):
        doc[key] = tuple(doc[key])
    return run(WorkloadConfig(**doc))


def write_config(cfg: WorkloadConfig, path: Path) -> None:
    path.write_text(json.dumps(asdict(cfg), indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
