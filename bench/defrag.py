"""Defragmentation on the multi-tenant workload: ours/topology with and without drains
for scattered gangs (``ClusterConfig.defrag_share_pct``), seed by seed.

Each seed's workload (``synapse_ha.sim.tenants.multi_tenant``, ``--hours`` of arrivals on
``--hosts`` 8-GPU hosts, a pass every 0.5 s) runs under topology-aware preemption once per
share in ``--shares`` (0: no defragmentation). Prints JSON: per seed and share, the
quality table's figures (``synapse_ha.sim.quality.FIGURES``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode
from synapse_ha.sim.quality import figures
from synapse_ha.sim.tenancy import run_modes
from synapse_ha.sim.tenants import multi_tenant


def run(seed: int, share: int, hours: float, hosts: int) -> dict[str, Any]:
    """The figures of ``seed``'s workload under ours/topology at ``share`` percent."""
    workload = multi_tenant(seed=seed, hours=hours, hosts=hosts)
    config = ClusterConfig(retention_ms=0, defrag_share_pct=share)
    (result,) = run_modes(workload, modes=(PreemptionMode.TOPOLOGY,), config=config)
    return figures(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=str, default="1,2,3,4,5")
    parser.add_argument("--shares", type=str, default="0,10")
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--hosts", type=int, default=32)
    args = parser.parse_args(argv)
    out: list[dict[str, Any]] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for share in (int(s) for s in args.shares.split(",")):
            figures_ = run(seed, share, args.hours, args.hosts)
            row = {"seed": seed, "defrag_share_pct": share, **figures_}
            print(json.dumps(row), file=sys.stderr, flush=True)
            out.append(row)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
