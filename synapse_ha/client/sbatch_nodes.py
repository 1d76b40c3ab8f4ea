"""sbatch's options that choose nodes and GPU types: ``-N`` (``replicas``), and, as the job
spec's ``nodes`` (core/node_selector.py), ``-C``/``--constraint`` (features),
``-w``/``--nodelist`` (nodes a job must include), ``-x``/``--exclude``, and the ``TYPE`` of
``--gres=gpu:TYPE:N`` and ``--gpus-per-node``/``--gpus``/``--gpus-per-task=TYPE:N`` (the
GPU model). Slurm's host lists (``gpu[01-02]``) are expanded here: the spec holds plain
names. Each handler takes the option's value, the spec document and the resources being
built (:mod:`synapse_ha.client.sbatch`); a ValueError names the rule broken."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from synapse_ha.core.node_selector import FeatureError, parse_features
from synapse_ha.slurm.hostlist import HostListError, expand

GRES_GPU = re.compile(r"^gpu(?::([A-Za-z0-9_.-]+))?:(\d+)$")  # gpu[:TYPE]:N
GPUS_PER_NODE = re.compile(r"^(?:([A-Za-z0-9_.-]+):)?(\d+)$")  # [TYPE:]N


def gpu_type(gpu_type: str | None, spec: dict[str, Any]) -> None:
    """A GPU type (``a100`` of ``gpu:a100:8``): ``nodes.gpu_model``, matched against the
    model each node reports (core/node_selector.py); the last option read wins, as its
    GPU count does (the command line's over the script's)."""
    if gpu_type:
        spec.setdefault("nodes", {})["gpu_model"] = gpu_type


def _gres(value: str, spec: dict[str, Any], resources: dict[str, Any], *_: Any) -> None:
    match = GRES_GPU.match(value)
    if not match:
        raise ValueError("only gpu:N or gpu:TYPE:N is supported")
    gpu_type(match.group(1), spec)
    resources["gpu"] = int(match.group(2))


def _gpus_per_node(value: str, spec: dict[str, Any], resources: dict[str, Any], *_: Any) -> None:
    match = GPUS_PER_NODE.match(value)
    if not match:
        raise ValueError("give N or TYPE:N")
    gpu_type(match.group(1), spec)
    resources["gpu"] = int(match.group(2))


def _constraint(value: str, spec: dict[str, Any], *_: Any) -> None:
    """``--constraint``: node features, ``a&b``, ``a|b``, ``[a|b]`` (``nodes.features``)."""
    try:
        parse_features(value)
    except FeatureError as exc:
        raise ValueError(f"{exc} (docs/slurm.md)") from None
    spec.setdefault("nodes", {})["features"] = value.strip()


def _hosts(value: str) -> list[str]:
    """A Slurm host list (``gpu[01-02],gpu07``) as names, each once."""
    if "/" in value:
        raise ValueError("a file of host names is not supported: list the hosts")
    try:
        return list(dict.fromkeys(expand(value)))
    except HostListError as exc:
        raise ValueError(f"not a host list: {exc}") from None


def _nodelist(value: str, spec: dict[str, Any], *_: Any) -> None:
    """``-w``: nodes that must each hold a member of the job (``nodes.names``); the job
    has at least as many nodes as it names (``-N`` reads them too)."""
    names = _hosts(value)
    spec.setdefault("nodes", {})["names"] = names
    spec["replicas"] = max(spec["replicas"], len(names))


def _exclude(value: str, spec: dict[str, Any], *_: Any) -> None:
    spec.setdefault("nodes", {})["exclude"] = _hosts(value)


def _node_count(value: str, spec: dict[str, Any], *_: Any) -> None:
    """``-N``: the job's nodes, at least as many as ``-w`` names."""
    if not value.isdigit() or int(value) < 1:
        raise ValueError("give a whole number of nodes (a range min-max is not supported)")
    spec["replicas"] = max(int(value), len(spec.get("nodes", {}).get("names", ())))


HANDLERS: dict[str, Callable[..., None]] = {
    "nodes": _node_count,
    "gres": _gres,
    "gpus-per-node": _gpus_per_node,
    "constraint": _constraint,
    "nodelist": _nodelist,
    "exclude": _exclude,
}
