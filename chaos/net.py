"""Network namespaces joined by a bridge, and partitions as one nftables table.

Layout: a bridge ``scbr0`` in the root namespace holds ``BRIDGE_ADDRESS`` (where the
never-faulted sink listens); every host (replica, worker, client) gets a namespace
``synchaos-<name>`` with a veth ``eth0`` into the bridge and an address in ``SUBNET``.

Partitions are the set ``blocked`` of (source, destination) address pairs in the table
``bridge synapse_chaos``, whose forward chain drops bridged IPv4 packets of any listed
pair. A whole layout is swapped atomically by one ``nft -f`` transaction (flush the set,
add the new pairs). Traffic between the root namespace and a host is not bridged
forwarding, so the sink and the observer are never cut.

Everything here is named with the prefixes below; :func:`sweep` removes all of it (also
what a crashed earlier run left behind).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos import hosts

NETNS_PREFIX = "synchaos-"
LINK_PREFIX = "scv-"
BRIDGE = "scbr0"
NFT_TABLE = "synapse_chaos"
SUBNET_PREFIX = "10.77.0."
BRIDGE_ADDRESS = SUBNET_PREFIX + "1"
# The share of packets the loss faults drop, at random, on each pair in the lossy set.
LOSS_PERCENT = 30


LOCK_PATH = "/run/synapse-chaos.lock"
LOCK_WAIT_S = 20 * 60.0
LOCK_POLL_S = 0.5


class NetError(Exception):
    """A network operation failed; the message names the command and its output."""


@contextlib.contextmanager
def machine_lock(wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Only one holder on this machine at a time: a scenario, the preflight or a sweep
    (each removes whatever the others created). Waits up to ``wait_s`` for another run."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise NetError(
                        f"another chaos run still holds {LOCK_PATH} after {wait_s:.0f} s"
                    ) from None
                if not said:
                    print(f"chaos: waiting for another chaos run ({LOCK_PATH})", file=sys.stderr)
                    said = True
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)


def run(argv: Sequence[str], *, input_text: str | None = None, check: bool = True) -> str:
    try:
        done = subprocess.run(
            list(argv), input=input_text, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetError(f"{' '.join(argv)}: {exc}") from None
    if check and done.returncode != 0:
        raise NetError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # r1, w2, client
    address: str  # 10.77.0.x

    @property
    def netns(self) -> str:
        return NETNS_PREFIX + self.name

    @property
    def link(self) -> str:
        return LINK_PREFIX + self.name


def exec_prefix(host: Host) -> list[str]:
    """Prefix that runs a command inside the host's namespace."""
    return ["ip", "netns", "exec", host.netns]


# ----------------------------------------------------------------- setup, sweep


def create(hosts: Iterable[Host]) -> None:
    """Bridge, namespaces, veths, addresses and the (empty) partition table."""
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    for host in hosts:
        run(["ip", "netns", "add", host.netns])
        run(
            [
                "ip",
                "link",
                "add",
                host.link,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            ]
        )
        run(["ip", "link", "set", host.link, "master", BRIDGE, "up"])
        run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
    run(
        ["nft", "-f", "-"],
        input_text=(
            f"table bridge {NFT_TABLE} {{\n"
            "  set blocked { type ipv4_addr . ipv4_addr; }\n"
            "  set lossy { type ipv4_addr . ipv4_addr; }\n"
            "  chain forward_filter {\n"
            "    type filter hook forward priority 0; policy accept;\n"
            "    ip saddr . ip daddr @blocked drop\n"
            f"    ip saddr . ip daddr @lossy numgen random mod 100 < {LOSS_PERCENT} drop\n"
            "  }\n"
            "}\n"
        ),
    )


def namespace_pids(netns: str) -> list[int]:
    out = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def leftover_sinks() -> list[int]:
    """Pids of effect sinks (``python -m chaos.sink``) still running: the sink lives in
    the root namespace, on the bridge's address, so a run killed from outside leaves it
    behind holding that address."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-m" in argv and b"chaos.sink" in argv:
            pids.append(int(entry.name))
    return sorted(pids)


def sweep() -> list[str]:
    """Remove every namespace, link and table of ours, killing whatever runs in those
    namespaces first, and any effect sink left running. Returns what was removed (for the
    log)."""
    removed: list[str] = []
    for pid in leftover_sinks():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 9)
            removed.append(f"sink pid {pid}")
    _layouts.clear()
    if shutil.which("ip") is None:
        return removed
    for line in run(["ip", "netns", "list"], check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NETNS_PREFIX):
            continue
        for pid in namespace_pids(name):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)
        run(["ip", "netns", "del", name], check=False)
        removed.append(f"netns {name}")
    for line in run(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if name.startswith(LINK_PREFIX) or name == BRIDGE:
            run(["ip", "link", "del", name], check=False)
            removed.append(f"link {name}")
    if shutil.which("nft") is not None:
        tables = run(["nft", "list", "tables"], check=False)
        if f"table bridge {NFT_TABLE}" in tables:
            run(["nft", "delete", "table", "bridge", NFT_TABLE], check=False)
            removed.append(f"nft table bridge {NFT_TABLE}")
    return removed


# ------------------------------------------------------------------- partitions


class _Layouts:
    """The pairs each fault owner (a nemesis lane) has asked for, per nftables set; the
    set always holds their union, so that lanes playing at once never clear each
    other's partitions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pairs: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def set(self, nft_set: str, owner: str, pairs: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            self._pairs[(nft_set, owner)] = set(pairs)
            union = sorted(
                set().union(*(v for (name, _), v in self._pairs.items() if name == nft_set))
            )
            script = f"flush set bridge {NFT_TABLE} {nft_set}\n"
            if union:
                body = ", ".join(f"{a} . {b}" for a, b in union)
                script += f"add element bridge {NFT_TABLE} {nft_set} {{ {body} }}\n"
            run(["nft", "-f", "-"], input_text=script)

    def clear(self) -> None:
        """Forget every owner's pairs (the sets themselves go with the table)."""
        with self._lock:
            self._pairs.clear()


_layouts = _Layouts()


def set_blocked(pairs: Iterable[tuple[str, str]], owner: str = "") -> None:
    """Replace ``owner``'s part of the partition layout with ``pairs`` (directed); the
    table drops the union of every owner's pairs, swapped in one transaction."""
    _layouts.set("blocked", owner, pairs)


def set_lossy(pairs: Iterable[tuple[str, str]], owner: str = "") -> None:
    """Replace ``owner``'s (directed) pairs whose packets are dropped at random
    (``LOSS_PERCENT`` of them, nftables ``numgen random``) in one transaction."""
    _layouts.set("lossy", owner, pairs)


def heal_network() -> None:
    """Clear every owner's partitions and losses."""
    _layouts.clear()
    set_blocked([])
    set_lossy([])


def one_way(sources: Iterable[str], destinations: Iterable[str]) -> set[tuple[str, str]]:
    """Only the direction from every address of ``sources`` to every one of
    ``destinations``."""
    dst = list(destinations)
    return {(x, y) for x in sources for y in dst if x != y}


def cut(group_a: Iterable[str], group_b: Iterable[str]) -> set[tuple[str, str]]:
    """Both directions between every address of ``group_a`` and every one of ``group_b``."""
    a, b = list(group_a), list(group_b)
    return {(x, y) for x in a for y in b if x != y} | {(y, x) for x in a for y in b if x != y}


# ------------------------------------------------------------ probes, preflight


@dataclass(frozen=True, slots=True)
class Backends:
    partitions: str
    latency: str
    toxiproxy: str
    loss: str = ""
    freezer: str = ""  # "" when the cgroup v2 freezer is unusable (see freezer_skip)
    freezer_skip: str = ""  # why the freeze-host kind is skipped, if it is
    disks: str = ""
    clock: str = ""


def _probe_tcp(from_ns: str, address: str, port: int, timeout_s: float) -> bool:
    code = (
        "import socket,sys\n"
        "try:\n"
        f"    socket.create_connection(({address!r}, {port}), timeout={timeout_s}).close()\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    done = subprocess.run(
        ["ip", "netns", "exec", from_ns, "python3", "-c", code],
        capture_output=True,
        timeout=timeout_s + 10,
    )
    return done.returncode == 0


def preflight() -> Backends:
    """Prove the fault backends work here, in scratch namespaces: two hosts reach each
    other over the bridge, an nftables pair drops their traffic and removing it restores
    it. Probes ``tc netem`` and Toxiproxy. The caller holds :func:`machine_lock`.
    Raises :class:`NetError` with the reason when namespaces or nftables are unusable."""
    if os.geteuid() != 0:
        raise NetError("the chaos suite needs root (network namespaces, nftables)")
    for tool in ("ip", "nft", "python3"):
        if shutil.which(tool) is None:
            raise NetError(f"{tool!r} is not installed (apt-get install iproute2 nftables)")
    sweep()
    a, b = Host("probe-a", SUBNET_PREFIX + "250"), Host("probe-b", SUBNET_PREFIX + "251")
    server: subprocess.Popen[bytes] | None = None
    try:
        create([a, b])
        server = subprocess.Popen(
            [
                *exec_prefix(b),
                "python3",
                "-c",
                "import socket,time\n"
                "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                f"s.bind(({b.address!r},7999)); s.listen()\n"
                "while True:\n    c,_=s.accept(); c.close()\n",
            ],
            start_new_session=True,
        )
        reachable = False
        for _ in range(20):
            if _probe_tcp(a.netns, b.address, 7999, 1.0):
                reachable = True
                break
        if not reachable:
            raise NetError(f"namespaces over bridge {BRIDGE}: {a.address} cannot reach {b.address}")
        set_blocked(cut([a.address], [b.address]))
        if _probe_tcp(a.netns, b.address, 7999, 1.0):
            raise NetError(
                f"nftables table bridge {NFT_TABLE} does not drop bridged traffic "
                f"between {a.address} and {b.address}"
            )
        set_blocked([])
        if not _probe_tcp(a.netns, b.address, 7999, 2.0):
            raise NetError("traffic did not recover after clearing the nftables partition")
        netem = run(
            [
                "ip",
                "netns",
                "exec",
                a.netns,
                "tc",
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "netem",
                "delay",
                "1ms",
            ],
            check=False,
        )
        del netem
        qdisc = run(
            ["ip", "netns", "exec", a.netns, "tc", "qdisc", "show", "dev", "eth0"], check=False
        )
        latency = (
            "tc netem (available)"
            if "netem" in qdisc
            else "none: tc netem is not available on this kernel; no latency/loss faults"
        )
    finally:
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, 9)
            server.wait(timeout=5)
        sweep()
    skip = hosts.probe_freezer()
    return Backends(
        partitions=f"nftables (table bridge {NFT_TABLE}) over network namespaces",
        latency=latency,
        toxiproxy=probe_toxiproxy(),
        loss=f"nftables numgen random: {LOSS_PERCENT}% of packets on a lossy pair",
        freezer="" if skip else f"cgroup v2 cgroup.freeze under {hosts.cgroup_parent()}",
        freezer_skip=skip,
        disks=f"tmpfs of {hosts.DISK_SIZE} per replica and worker data directory, filled",
        clock="wall-clock offset file read by chaos/clockshim (Python time.time/time_ns)",
    )


def probe_toxiproxy() -> str:
    url = os.environ.get("TOXIPROXY_URL", "")
    if not url:
        return "not run: TOXIPROXY_URL is not set"
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/version", timeout=2) as answer:
            version = answer.read().decode(errors="replace").strip()
    except OSError as exc:
        return f"not run: {url} is not reachable ({exc})"
    return (
        f"reachable at {url} (version {version}) but not used: partitions run on nftables, "
        "which cut every protocol including Raft"
    )
