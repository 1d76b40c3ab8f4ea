"""``synctl sinfo``: the cluster's nodes in Slurm's words and formats (docs/slurm.md).

A partition is a queue (``default`` is Slurm's default partition, marked ``*``); queues
hold quotas, not nodes, so every partition lists every node. A node's state is Slurm's:
``idle``, ``mix`` (some of it allocated), ``alloc`` (all of its GPUs, or of its CPUs for
a node without GPUs), ``drng``/``drain`` (cordoned or draining, with or without members
still on it), ``down`` (dead), ``resv`` (kept idle as a hot spare, for member replacements:
counted idle by ``%F``, as Slurm counts an idle node of a reservation).
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from synapse_ha.cli.app import Settings, with_settings
from synapse_ha.cli.slurm import render_format, split_ids
from synapse_ha.core.cluster_config import DEFAULT_QUEUE
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.slurm.hostlist import compress

SINFO_FORMAT = "%9P %.5a %.10l %.6D %.6t %N"
NODE_FORMAT = "%N %.6D %9P %.6t"
SUMMARY_FORMAT = "%9P %.5a %.10l %.16F %N"
_LETTERS = {
    "P": "partition", "R": "partitionname", "a": "avail", "l": "timelimit", "D": "nodes",
    "t": "statecompact", "T": "state", "N": "nodelist", "n": "hostnames", "c": "cpus",
    "m": "memory", "G": "gres", "F": "nodes_aiot", "f": "features",
}  # fmt: skip
_HEADERS = {
    "partition": "PARTITION", "partitionname": "PARTITION", "avail": "AVAIL",
    "timelimit": "TIMELIMIT", "nodes": "NODES", "statecompact": "STATE", "state": "STATE",
    "nodelist": "NODELIST", "hostnames": "HOSTNAMES", "cpus": "CPUS", "memory": "MEMORY",
    "gres": "GRES", "nodes_aiot": "NODES(A/I/O/T)", "features": "AVAIL_FEATURES",
}  # fmt: skip
_LONG = {"idle": "idle", "mix": "mixed", "alloc": "allocated", "drng": "draining",
         "drain": "drained", "down": "down", "resv": "reserved"}  # fmt: skip


def node_state(node: pb.Node) -> str:
    """The node's state in Slurm's compact words."""
    status = states.node_status(node)
    used = node.allocated.gpu or node.allocated.cpu_milli
    if status is NodeStatus.DEAD:
        return "down"
    if status is not NodeStatus.READY:
        return "drng" if used else "drain"
    if not used:
        return "resv" if node.spare else "idle"
    full = (
        node.allocated.gpu >= node.capacity.gpu
        if node.capacity.gpu
        else node.allocated.cpu_milli >= node.capacity.cpu_milli
    )
    return "alloc" if full else "mix"


def _spread(values: Sequence[int]) -> str:
    """One number, or the least with ``+`` when they differ (as sinfo)."""
    return str(min(values)) + ("+" if len(set(values)) > 1 else "")


def row(partition: str, nodes: Sequence[pb.Node], name: str) -> str:
    """Field ``name`` of a group of ``nodes`` of ``partition``."""
    compact = {node_state(n) for n in nodes}
    values = {
        "partition": partition + ("*" if partition == DEFAULT_QUEUE else ""),
        "partitionname": partition,
        "avail": "up",
        "timelimit": "infinite",
        "nodes": str(len(nodes)),
        "statecompact": "/".join(sorted(compact)),
        "state": "/".join(sorted(_LONG[s] for s in compact)),
        "nodelist": compress([n.node_id for n in nodes]),
        "hostnames": ",".join(n.address.rsplit(":", 1)[0] for n in nodes),
        "cpus": _spread([n.capacity.cpu_milli // 1000 for n in nodes]),
        "memory": _spread([n.capacity.memory_mib for n in nodes]),
        "gres": ",".join(sorted({f"gpu:{n.capacity.gpu}" for n in nodes if n.capacity.gpu}))
        or "(null)",
        "features": ",".join(sorted({f for n in nodes for f in n.features})) or "(null)",
    }
    if name == "nodes_aiot":
        counts = [node_state(n) for n in nodes]
        busy = sum(s in ("alloc", "mix") for s in counts)
        idle = counts.count("idle") + counts.count("resv")
        return f"{busy}/{idle}/{len(counts) - busy - idle}/{len(counts)}"
    return values[name]


@click.command(context_settings={"help_option_names": ["--help"]})  # -h is --noheader
@click.option("-p", "--partition", "partitions", multiple=True, help="Only these queues.")
@click.option("-t", "--states", "wanted", multiple=True, help="Only nodes in these states.")
@click.option("-N", "--Node", "by_node", is_flag=True, help="One line per node.")
@click.option("-s", "--summarize", is_flag=True, help="Node counts by state (A/I/O/T).")
@click.option("-o", "--format", "fmt", default=None, help="Fields (sinfo's %-letters).")
@click.option("-h", "--noheader", is_flag=True, help="No header line.")
@click.option("-l", "--long", is_flag=True, help="Accepted (states are shown in full with %T).")
@with_settings
def sinfo(
    settings: Settings,
    partitions: tuple[str, ...],
    wanted: tuple[str, ...],
    by_node: bool,
    summarize: bool,
    fmt: str | None,
    noheader: bool,
    long: bool,
) -> None:
    """Show the nodes as Slurm's sinfo: by partition (a queue; every queue holds every
    node) and state, or one line per node (-N).

    \b
    Examples:
      synctl sinfo
      synctl sinfo -N -h -o "%N %t %G"
      sinfo -s                       # from synctl slurm-commands' folder
    """
    client = settings.client()
    queues = [DEFAULT_QUEUE, *sorted(q.queue.name for q in client.list_queues().queues)]
    names = list(dict.fromkeys(queues))
    if partitions:
        names = [q for q in names if q in split_ids(partitions)]
    want = {s.lower() for s in split_ids(wanted)}
    nodes = [
        n
        for n in sorted(client.list_nodes(), key=lambda n: n.node_id)
        if not want or node_state(n) in want or _LONG[node_state(n)] in want
    ]
    fmt = fmt or (NODE_FORMAT if by_node else SUMMARY_FORMAT if summarize else SINFO_FORMAT)
    if not noheader:
        click.echo(render_format(fmt, _LETTERS, lambda f: _HEADERS[f], "sinfo").rstrip())
    for partition in names:
        if by_node:
            groups = [[n] for n in nodes]
        elif summarize:
            groups = [nodes] if nodes else []
        else:
            by_state: dict[str, list[pb.Node]] = {}
            for n in nodes:
                by_state.setdefault(node_state(n), []).append(n)
            groups = list(by_state.values())
        for group in groups:
            click.echo(_line(fmt, partition, group))


def _line(fmt: str, partition: str, group: Sequence[pb.Node]) -> str:
    return render_format(fmt, _LETTERS, lambda f: row(partition, group, f), "sinfo").rstrip()


COMMANDS: list[click.Command] = [sinfo]
