"""Slurm batch scripts as job specs: ``synctl sbatch script.sh`` (docs/slurm.md).

:func:`translate` reads a script's ``#SBATCH`` lines (those before its first command, as
sbatch does) and the same options given on the command line (which win, as with
sbatch), and builds the job spec document ``synctl submit`` reads from a file. The
common subset of options is translated; every other option is refused with its line and
"not supported" (:class:`SbatchError`), never ignored. Options that have no meaning here
but do no harm (``-o``/``-e``: a member's output lives with it on its node) are accepted
with a note (:attr:`Translation.notes`).

The job is an allocation (docs/slurm.md, "The allocation model"): one member per node,
each running the step daemon (:mod:`synapse_ha.slurm.stepd`) with the worker's
interpreter. The first node's runs the script once, under the interpreter its ``#!``
line names (``/bin/sh`` without one), with the batch step's ``SLURM_*`` variables and
``srun``/``scontrol`` on its ``PATH``; ``srun`` starts job steps on the allocation's
nodes. ``--ntasks``, ``--ntasks-per-node``, ``--cpus-per-task`` and ``--gpus-per-task``
size each node's member for its share of the tasks.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import os
import re
import secrets
import shlex
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SbatchError", "Translation", "script_position", "split_options", "translate"]

from synapse_ha.client.sbatch_nodes import GPUS_PER_NODE, gpu_type
from synapse_ha.client.sbatch_nodes import HANDLERS as NODE_HANDLERS
from synapse_ha.client.sbatch_options import SbatchError, script_position, split_options
from synapse_ha.client.slurm_times import begin_text, time_seconds
from synapse_ha.core.spec.document import DEFAULT_CPU, DEFAULT_MEMORY
from synapse_ha.core.workflows.arrays import array_problems

# Every member runs the step daemon, with the interpreter of the worker that starts it.
STEPD = 'exec "${SYNAPSE_PYTHON:-python3}" -m synapse_ha.slurm.stepd "$@"'
NAME_ENV = "SYNAPSE_SBATCH_NAME"
CPUS_ENV = "SYNAPSE_SBATCH_CPUS"
SUBMIT_DIR_ENV = "SYNAPSE_SBATCH_SUBMIT_DIR"
SECRET_ENV = "SYNAPSE_STEP_SECRET"  # proves a step daemon or srun belongs to the job
_DIRECTIVE = re.compile(r"^#SBATCH\s+(.*)$")
_INVALID_NAME = re.compile(r"[^a-z0-9-]+")
_PARTITION_CHARS = re.compile(r"[_.]")
_MEMORY = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)
_DEPENDENCY_KINDS = {"afterok": "afterok", "afterany": "afterany", "afternotok": "afternotok",
                     "after": "after"}  # fmt: skip


@dataclass
class Translation:
    """The job spec document built from a script, and notes for the user."""

    spec: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    wait: bool = False  # -W/--wait: sbatch returns once the job has ended, with its status


# Options kept with the job, in its environment, and shown by scontrol show job.
RECORDED = {
    "comment": ("SYNAPSE_SBATCH_COMMENT", "Comment"),
    "mail-type": ("SYNAPSE_SBATCH_MAIL_TYPE", "MailType"),
    "mail-user": ("SYNAPSE_SBATCH_MAIL_USER", "MailUser"),
}
_NOTED = {
    "requeue": "gangs are always requeued after a disruption (a node's death); nothing to do",
    "wait-all-nodes": "a gang's members always start together; nothing to do",
    "mail-type": "recorded, but no mail is sent (synctl status --wait, or the dashboard)",
    "mail-user": "recorded, but no mail is sent (synctl status --wait, or the dashboard)",
    "hint": "members are placed by what they ask for; ignored",
    "parsable": "give it on synctl sbatch's command line; ignored here",
    "wckey": "no workload keys here; ignored",
    "time-min": "the job keeps its --time; ignored",
    "prefer": "a soft constraint: members go where they fit (--constraint holds); ignored",
    # How Slurm binds or clocks what a job has: a member has its GPUs and CPU limit.
    **dict.fromkeys(
        ("gpu-bind", "mem-bind", "distribution", "cpu-freq", "gpu-freq", "spread-job",
         "use-min-nodes", "ntasks-per-core", "ntasks-per-socket"),
        "binding and frequencies are the node's; ignored",
    ),
    **dict.fromkeys(
        ("acctg-freq", "profile", "propagate", "get-user-env"),
        "accounting, profiling and limits are the cluster's; ignored",
    ),
    "quiet": "ignored",
    "verbose": "ignored",
}  # fmt: skip


_UNEXPANDED = (
    "#SBATCH lines are not read by a shell (as with sbatch): write the value, or give the "
    "option on the command line, where your shell expands it"
)

# Options refused, with why (every other one: "not supported").
_NOT_HONOURED = {
    "no-requeue": "a gang is always requeued after a disruption it did not cause (a node's "
    "death), without using a retry",
    "hold": "no holds here: submit it when it may run, or give --begin",
    "reservation": "no advance reservations here: nodes are not set aside by name",
    "licenses": "no licenses are counted here",
    "nodefile": "name the nodes with -w",
    "clusters": "one cluster: synctl --cluster chooses it",
}


def directives(script: str) -> list[tuple[int, list[str]]]:
    """``(line number, words)`` of each ``#SBATCH`` line before the first command."""
    out = []
    for number, line in enumerate(script.splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        match = _DIRECTIVE.match(stripped)
        if match:
            out.append((number, shlex.split(match.group(1), comments=True)))
        elif stripped and not stripped.startswith("#"):
            break  # sbatch stops reading directives at the first command
    return out


def translate(
    script: str,
    script_name: str,
    command_line: Sequence[str] = (),
    args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    submit_dir: str | None = None,
    node_shape: Callable[[Mapping[str, Any]], NodeShape] | None = None,
) -> Translation:
    """The job spec document for ``script`` (its options, then ``command_line``'s, which
    win), run with ``args``; a relative ``--chdir`` is ``submit_dir``'s (default: this
    process's directory). ``node_shape``: the shape of the cluster's nodes that the job's
    ``nodes`` selector (given) allows (:func:`whole_node_shape`), asked only for
    ``--exclusive`` or ``--mem=0`` (whole nodes; raises ValueError when there is none).
    Raises :class:`SbatchError` naming the line and option."""
    env = os.environ if environ is None else environ
    options = _options(script, script_name, command_line)
    out = Translation(spec={})
    spec = out.spec
    submitted_in = os.getcwd() if submit_dir is None else submit_dir
    handlers = {**_HANDLERS, "chdir": _chdir(submitted_in)}
    spec["name"] = _name(os.path.basename(script_name))
    spec["replicas"] = 1
    # A job spec's own defaults (none reserved), written out for --dry-run.
    resources: dict[str, Any] = {"gpu": 0, "cpu": DEFAULT_CPU, "memory": DEFAULT_MEMORY}
    env_vars: dict[str, str] = {}
    # Read against the node count, once every other option is.
    counted = {name: options.pop(name) for name in list(options) if name in _COUNTED}
    whole = {name: options.pop(name) for name in list(options) if _whole(name, options[name][0])}
    files = _output_files({name: options.pop(name) for name in list(options) if name in _FILES})
    for name, (value, written, where) in options.items():
        handler = handlers.get(name)
        if _kept_or_noted(name, value, written, where, out, env_vars):
            continue
        if handler is None:
            why = _NOT_HONOURED.get(name, "not supported")
            raise SbatchError(where, written, f"{why} (see docs/slurm.md)")
        try:
            handler(value or "", spec, resources, env_vars, env)
        except ValueError as exc:
            raise SbatchError(where, written, str(exc)) from None
    tasks = _tasks(counted, spec["replicas"], resources, spec)
    _whole_nodes(whole, out, resources, node_shape)
    spec["resources"] = resources
    env_vars[NAME_ENV] = spec["name"]
    env_vars[CPUS_ENV] = str(cpus_per_task(options))
    env_vars[SUBMIT_DIR_ENV] = submitted_in
    env_vars[SECRET_ENV] = secrets.token_hex(32)
    spec["env"] = env_vars
    spec.setdefault("workdir", submitted_in)  # sbatch runs the script where it was run
    limit = []  # the --signal's clock
    if "--signal" in files and "time_limit" in spec:
        limit = [f"--time-limit={spec['time_limit'][:-1]}"]
    spec["command"] = _command(script, script_name, args, [*tasks.stepd_args(), *files, *limit])
    return out


def _options(
    script: str, script_name: str, command_line: Sequence[str]
) -> dict[str, tuple[str | None, str, str]]:
    """Every option by its full name: ``(value, as written, where)``, the script's
    ``#SBATCH`` lines' first, then the command line's, which win."""
    options: dict[str, tuple[str | None, str, str]] = {}
    for number, words in directives(script):
        where = f"{script_name}:{number}"
        for name, value, written in split_options(words, where):
            if "$" in (value or ""):
                raise SbatchError(where, written, _UNEXPANDED)
            options[name] = (value, written, where)
    for name, value, written in split_options(list(command_line), "command line"):
        options[name] = (value, written, "command line")
    return options


def _kept_or_noted(
    name: str,
    value: str | None,
    written: str,
    where: str,
    out: Translation,
    env_vars: dict[str, str],
) -> bool:
    """Whether option ``name`` is taken care of without a handler: ``--wait`` and
    ``--wrap`` (synctl sbatch's), kept with the job (:data:`RECORDED`), or accepted with a
    note. Raises for ``--kill-on-invalid-dep=no``."""
    if name == "wait":
        out.wait = True
        return True
    if name == "wrap" or (name == "kill-on-invalid-dep" and (value or "").lower() == "yes"):
        return True  # the script itself; what a dependency never met does here
    if name == "kill-on-invalid-dep":
        raise SbatchError(
            where, written, "a job whose dependency can never be met is always cancelled here (yes)"
        )
    if name in RECORDED:
        env_vars[RECORDED[name][0]] = value or ""
    if name in _NOTED:
        out.notes.append(f"{where}: {written}: {_NOTED[name]}")
    return name in RECORDED or name in _NOTED


_FILES = frozenset({"output", "error", "open-mode", "signal"})
_SIGNAL = re.compile(r"^(B:)?([A-Z0-9]+)(?:@(\d+))?$")


def _signal_number(name: str) -> int:
    """A signal's number from Slurm's forms (``USR1``, ``SIGUSR1``, ``10``); 0 if none."""
    if name.isdigit():
        return int(name) if 0 < int(name) < signal.NSIG else 0
    name = name if name.startswith("SIG") else f"SIG{name}"
    member = getattr(signal.Signals, name, None)
    return int(member) if member is not None else 0


def _output_files(given: Mapping[str, tuple[str | None, str, str]]) -> list[str]:
    """The step daemon's options for the batch script's output files (``-o``/``-e``
    patterns as given: stepd expands them on the first node, ``--open-mode``) and its
    ``--signal`` (as ``[B:]NUMBER@SECONDS``)."""
    out = []
    for name in ("output", "error"):
        if name in given:
            value, written, where = given[name]
            if not value:
                raise SbatchError(where, written, "give a file name pattern")
            out += [f"--{name}", value]
    if "signal" in given:
        value, written, where = given["signal"]
        match = _SIGNAL.match((value or "").upper())
        if not match or not _signal_number(match.group(2)):
            raise SbatchError(where, written, "give [B:]SIGNAL[@SECONDS], e.g. B:USR1@90")
        batch, name, seconds = match.groups()
        out += ["--signal", f"{batch or ''}{_signal_number(match.group(2))}@{seconds or 60}"]
    if "open-mode" in given:
        value, written, where = given["open-mode"]
        if value not in ("append", "truncate"):
            raise SbatchError(where, written, "give append or truncate")
        out += ["--open-mode", value]
    return out


@dataclass(frozen=True, slots=True)
class NodeShape:
    """What a node holds (``--exclusive`` asks for all of it); ``others``: the live nodes
    of other shapes, which a job taking whole nodes of this one leaves out."""

    gpu: int
    cpu_milli: int
    memory_mib: int
    others: tuple[str, ...] = ()


def whole_node_shape(nodes: Sequence[tuple[str, NodeShape]]) -> NodeShape:
    """The shape whole-node jobs take among ``nodes`` (node id, shape): their one shape,
    or, when they differ, the most common (then the most GPUs, CPUs, memory), with the
    nodes of the others in ``others``. ValueError when there is no node."""
    if not nodes:
        raise ValueError("the cluster has no live node yet to take whole")
    counts = collections.Counter(shape for _, shape in nodes)
    best = max(counts, key=lambda s: (counts[s], s.gpu, s.cpu_milli, s.memory_mib))
    return dataclasses.replace(best, others=tuple(sorted(n for n, s in nodes if s != best)))


def _whole(name: str, value: str | None) -> bool:
    """``--exclusive`` (whole nodes: ``user`` and ``mcs`` change nothing here), or
    ``--mem=0`` (all of a node's memory)."""
    return name == "exclusive" or (name == "mem" and (value or "").rstrip("KMGTkmgtBb") == "0")


def _whole_nodes(
    whole: Mapping[str, tuple[str | None, str, str]],
    out: Translation,
    resources: dict[str, Any],
    node_shape: Callable[[Mapping[str, Any]], NodeShape] | None,
) -> None:
    """Each member takes its node whole (``--exclusive``: every GPU, CPU and byte, so
    nothing else fits beside it) or its memory (``--mem=0``): the node shape of the
    cluster, or of the most common one when its nodes differ (the others excluded)."""
    if not whole:
        return
    name = "exclusive" if "exclusive" in whole else "mem"
    _value, written, where = whole[name]
    try:
        if node_shape is None:
            raise ValueError("needs the cluster's node shape (synctl sbatch asks the cluster)")
        shape = node_shape(out.spec.get("nodes", {}))
    except ValueError as exc:
        raise SbatchError(where, written, str(exc)) from None
    if shape.others:
        nodes = out.spec.setdefault("nodes", {})
        nodes["exclude"] = sorted({*nodes.get("exclude", ()), *shape.others})
        out.notes.append(
            f"{where}: {written}: the nodes are of several shapes; whole nodes of the most "
            f"common one ({shape.gpu} GPU, {shape.cpu_milli / 1000:g} CPU, "
            f"{shape.memory_mib} MiB), the {len(shape.others)} other(s) excluded"
        )
    resources["memory"] = f"{shape.memory_mib}Mi"
    if name == "exclusive":
        resources["gpu"] = shape.gpu
        resources["cpu"] = f"{shape.cpu_milli}m"


@dataclass(frozen=True, slots=True)
class Tasks:
    """The allocation's tasks: in all, and the most on one node."""

    total: int
    per_node: int

    def stepd_args(self) -> list[str]:
        return ["--ntasks", str(self.total), "--tasks-per-node", str(self.per_node)]


def _tasks(
    counted: Mapping[str, tuple[str | None, str, str]],
    nodes: int,
    resources: dict[str, Any],
    spec: dict[str, Any],
) -> Tasks:
    """Slurm's task counts read against the node count; each node's member is sized
    for its share: ``--cpus-per-task`` and ``--gpus-per-task`` times its tasks, and
    ``--mem-per-gpu``/``--mem-per-cpu`` times its GPUs or CPUs. A GPU type
    (``--gpus=a100:16``) goes to ``spec``'s ``nodes.gpu_model``."""

    def number(name: str) -> int | None:
        if name not in counted:
            return None
        value, written, where = counted[name]
        if not (value or "").isdigit() or int(value or "0") < 1:
            raise SbatchError(where, written, "give a whole number of 1 or more")
        return int(value or "0")

    def refuse(name: str, rule: str) -> SbatchError:
        _value, written, where = counted[name]
        return SbatchError(where, written, rule)

    total, per_node = number("ntasks"), number("ntasks-per-node")
    if total is not None and total < nodes:
        raise refuse("ntasks", f"fewer tasks than nodes ({nodes})")
    if total is not None and per_node is not None and total > per_node * nodes:
        raise refuse("ntasks", f"more than --ntasks-per-node {per_node} on {nodes} node(s)")
    if per_node is None:
        per_node = -(-total // nodes) if total is not None else 1
    if total is None:
        total = per_node * nodes
    if "overcommit" in counted:  # one CPU per node, whatever the tasks ask (as Slurm)
        resources["cpu"] = 1
    elif resources["cpu"] != DEFAULT_CPU:
        resources["cpu"] = int(resources["cpu"]) * per_node
    for name in ("gpus-per-task", "gpus"):
        if name not in counted:
            continue
        value, written, where = counted[name]
        match = GPUS_PER_NODE.match(value or "")
        if not match:
            raise SbatchError(where, written, "give N or TYPE:N")
        gpu_type(match.group(1), spec)
        gpus = int(match.group(2))
        if name == "gpus-per-task":
            resources["gpu"] = gpus * per_node
        elif gpus % nodes:
            raise SbatchError(
                where,
                written,
                f"a multiple of the node count ({nodes}): each node gets an equal share",
            )
        else:
            resources["gpu"] = gpus // nodes
    for name, per in (("mem-per-gpu", resources["gpu"]), ("mem-per-cpu", resources["cpu"])):
        if name not in counted:
            continue
        value, written, where = counted[name]
        match = _MEMORY.match(value or "")
        if not match or not int(match.group(1)) or not per:
            what = "GPUs" if name == "mem-per-gpu" else "CPUs (--cpus-per-task)"
            raise SbatchError(
                where, written, f"give a size such as 16G, with {what} asked for each node"
            )
        unit = (match.group(2) or "M").upper()
        resources["memory"] = f"{int(match.group(1)) * int(per)}{unit}i"
    return Tasks(total, per_node)


def cpus_per_task(options: Mapping[str, tuple[str | None, str, str]]) -> int:
    value = (options.get("cpus-per-task") or ("0",))[0] or "0"
    return int(value) if value.isdigit() else 0


def _command(script: str, script_name: str, args: Sequence[str], stepd: Sequence[str]) -> list[str]:
    """The step daemon on every member; on the first node it runs the script under the
    interpreter of its ``#!`` line (``/bin/sh`` without one), with the script's name as
    ``$0`` and ``args`` after it."""
    first = script.split("\n", 1)[0]
    interpreter = shlex.split(first[2:]) if first.startswith("#!") else ["/bin/sh"]
    if not interpreter:
        interpreter = ["/bin/sh"]
    batch = [*interpreter, "-c", script, os.path.basename(script_name), *args]
    return ["/bin/sh", "-c", STEPD, "stepd", *stepd, "--", *batch]


def _name(text: str) -> str:
    """A job name from Slurm's (any text): lower case, runs of other characters as '-'."""
    name = _INVALID_NAME.sub("-", text.lower()).strip("-")[:63].strip("-")
    return name or "sbatch"


Handler = Callable[[str, dict[str, Any], dict[str, Any], dict[str, str], Mapping[str, str]], None]


def _job_name(value: str, spec: dict[str, Any], *_: Any) -> None:
    spec["name"] = _name(value)


def _cpus(value: str, spec: dict[str, Any], resources: dict[str, Any], *_: Any) -> None:
    if not value.isdigit() or int(value) < 1:
        raise ValueError("give a whole number of CPUs")
    resources["cpu"] = int(value)


def _memory(value: str, spec: dict[str, Any], resources: dict[str, Any], *_: Any) -> None:
    match = _MEMORY.match(value)
    if not match or int(match.group(1)) == 0:
        raise ValueError("give a size such as 64G or 4096 (MB); 0 (all of a node) is not supported")
    unit = (match.group(2) or "M").upper()
    resources["memory"] = f"{match.group(1)}{unit}i"


def _time(value: str, spec: dict[str, Any], *_: Any) -> None:
    spec["time_limit"] = f"{time_seconds(value)}s"


def _dependency(value: str, spec: dict[str, Any], *_: Any) -> None:
    if "?" in value:
        raise ValueError("'?' (any of) is not supported: dependencies are all required")
    deps: dict[str, Any] = {}
    for part in value.split(","):
        kind, _sep, ids = part.partition(":")
        if part == "singleton":
            deps["singleton"] = True
            continue
        if kind not in _DEPENDENCY_KINDS or not ids:
            raise ValueError(
                f"{part!r}: supported are afterok, afterany, afternotok and after, each "
                "with job ids (afterok:job-000012:job-000013), and singleton"
            )
        for job_id in ids.split(":"):
            deps.setdefault(_DEPENDENCY_KINDS[kind], []).append(
                f"job-{int(job_id):06d}" if job_id.isdigit() else job_id
            )
    spec["dependencies"] = deps


def _array(value: str, spec: dict[str, Any], *_: Any) -> None:
    for _field, rule in array_problems(value.strip() or " "):
        raise ValueError(rule)
    spec["array"] = value.strip()


def _begin(value: str, spec: dict[str, Any], *_: Any) -> None:
    spec["begin"] = begin_text(value, datetime.datetime.now().astimezone())


def _account(value: str, spec: dict[str, Any], *_: Any) -> None:
    spec["account"] = value


def _partition(value: str, spec: dict[str, Any], *_: Any) -> None:
    """The queue of the partition's name: Slurm's names may hold capitals, ``_`` and
    ``.``, a queue's are lowercase with ``-`` (``gpu_long`` is queue ``gpu-long``)."""
    if "," in value:
        raise ValueError("one partition: a job here waits in one queue")
    spec["queue"] = _PARTITION_CHARS.sub("-", value.lower())


def _qos(value: str, spec: dict[str, Any], *_: Any) -> None:
    if isinstance(spec.get("priority"), int):
        raise ValueError("with --nice: a job has one priority, a class's or a number")
    spec["priority"] = value


def _nice(value: str, spec: dict[str, Any], *_: Any) -> None:
    """``--nice[=N]``: the priority lowered by N (Slurm's default 100); a negative N
    raises it, within what the submitter's credential allows."""
    if isinstance(spec.get("priority"), str):
        raise ValueError("with --qos: a job has one priority, a class's or a number")
    try:
        spec["priority"] = -int(value) if value else -100
    except ValueError:
        raise ValueError("give a whole number (--nice=10)") from None


def _deadline(value: str, spec: dict[str, Any], *_: Any) -> None:
    spec["deadline"] = begin_text(value, datetime.datetime.now().astimezone())


def _chdir(submit_dir: str) -> Handler:
    """``--chdir``: a relative directory is the submission directory's (as sbatch reads
    it)."""

    def handle(value: str, spec: dict[str, Any], *_: Any) -> None:
        spec["workdir"] = os.path.normpath(os.path.join(submit_dir, value))

    return handle


def _export(
    value: str,
    spec: dict[str, Any],
    resources: dict[str, Any],
    env_vars: dict[str, str],
    environ: Mapping[str, str],
) -> None:
    """``NONE``, ``ALL`` or a list of ``VAR`` (taken from here) and ``VAR=value``. ``ALL``
    (sbatch's default) passes only the variables named with it: copying this shell's
    whole environment to every member would carry its secrets and paths along."""
    for item in value.split(","):
        name, eq, given = item.partition("=")
        if name in ("ALL", "NONE") and not eq:
            continue
        if eq:
            env_vars[name] = given
        elif name in environ:
            env_vars[name] = environ[name]
        else:
            raise ValueError(f"{name} is not set here")


# Read against the node count, once every other option is (:func:`_tasks`).
_COUNTED = frozenset(
    {
        "ntasks",
        "ntasks-per-node",
        "gpus-per-task",
        "gpus",
        "mem-per-gpu",
        "mem-per-cpu",
        "overcommit",
    }
)

_HANDLERS: dict[str, Handler] = {
    "job-name": _job_name,
    **NODE_HANDLERS,
    "cpus-per-task": _cpus,
    "mem": _memory,
    "time": _time,
    "dependency": _dependency,
    "partition": _partition,
    "account": _account,
    "qos": _qos,
    "export": _export,
    "array": _array,
    "begin": _begin,
    "deadline": _deadline,
    "nice": _nice,
    "wait-for-nodes": lambda _value, spec, *_: spec.update(wait_for_nodes=True),
}
