"""The single-host search by rack (``_best_gpu_host_by_rack``) gives exactly the host
the scan over every host with enough free GPUs gives, on random free capacity, excluded
nodes, image requirements and ``within`` domains."""

from __future__ import annotations

import random

import pytest

from synapse_ha.core.model import Resources
from synapse_ha.core.scheduler.capacity import Table, View
from synapse_ha.core.scheduler.placement import (
    Gang,
    _best_gpu_host_by_rack,
    _best_gpu_host_scan,
)
from tests.core.harness import Cluster, job, node


def _cluster(rng: random.Random) -> Cluster:
    cl = Cluster()
    for i in range(rng.randint(1, 40)):
        gpus = rng.choice([4, 8, 8])
        cl.add(
            node(
                f"n{i:02d}",
                gpus=gpus,
                cpu=rng.choice([16, 64]),
                zone=f"z{rng.randint(1, 2)}",
                block=f"b{rng.randint(1, 2)}",
                rack=f"r{rng.randint(1, 5)}",
                features=("images",) if rng.random() < 0.5 else (),
            )
        )
    return cl


@pytest.mark.parametrize("seed", range(40))
def test_the_search_by_rack_finds_the_host_the_full_scan_finds(seed: int) -> None:
    rng = random.Random(seed)
    cl = _cluster(rng)
    table = Table.build(cl.state)
    assert table.levels > 0
    for n in table.at:  # random free capacity: take some GPUs and CPU from each host
        taken = rng.randint(0, n.gpu)
        gpus = tuple(sorted(rng.sample(range(n.gpu), taken))) if taken else ()
        table.adjust(n.node_id, Resources(rng.randint(0, n.cpu // 2), 0, taken), gpus, -1)
    view = View(table)
    excluded = frozenset(x.node_id for x in table.at if rng.random() < 0.2)
    views = [view, view.without(excluded)]
    domains = [d for depth in range(table.levels + 1) for d in table.domains[depth]]
    compared = found = 0
    for _ in range(60):
        spec = job(
            replicas=rng.choice([1, 1, 2, 3]),
            gpu=rng.choice([1, 2, 4, 8]),
            cpu=rng.choice([1, 4, 16]),
            image=rng.choice(["", "img"]),
        )
        gang = Gang(None, spec, spec.resources, spec.replicas)  # type: ignore[arg-type]
        target = rng.choice(views)
        within = rng.choice([(), *domains])
        expected = _best_gpu_host_scan(gang, target, within)
        assert _best_gpu_host_by_rack(gang, target, within) == expected, (spec, within)
        compared += 1
        found += expected is not None
    assert compared == 60 and found > 0
