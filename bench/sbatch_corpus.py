"""How many real batch scripts ``synctl sbatch --test-only`` accepts as they are.

    python bench/sbatch_corpus.py DIR [--node-shape GPU,CPU_MILLI,MEMORY_MIB] [--out FILE]

Every file in DIR (a folder of Slurm batch scripts, e.g. public training scripts; the
project commits none) is read as ``synctl sbatch --test-only FILE`` reads it: its
``#SBATCH`` options translated (:func:`synapse_ha.client.sbatch.translate`) and the job
spec checked (:func:`synapse_ha.core.spec.document.parse_job_spec`). A variable that
``--export`` names is taken as set in the submitting shell; ``--exclusive`` and
``--mem=0`` take a node whole, of the shape ``--node-shape`` gives (as on a cluster of
one node shape; without it, they are refused as with no cluster to ask). Prints JSON: how many were
accepted, each refusal's option and rule, the refusals counted by option, and how many
call ``srun`` or expand host lists with ``scontrol show hostnames`` (both run inside an
sbatch job: docs/slurm.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from synapse_ha.client.sbatch import NodeShape, SbatchError, translate
from synapse_ha.core.spec.document import SpecError, parse_job_spec

_SRUN = re.compile(r"(^|[\s;&|(`$])srun\s", re.MULTILINE)
_HOSTNAMES = re.compile(r"scontrol\s+show\s+hostnames?\b")


class _EveryVariable(Mapping[str, str]):
    """A submitting shell that has every variable an ``--export`` names."""

    def __getitem__(self, key: str) -> str:
        return "set"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, key: object) -> bool:
        return True


def check(path: Path, shape: NodeShape | None = None) -> dict[str, Any]:
    """One script's verdict: accepted, or the option and rule that refused it."""
    text = path.read_text(errors="replace")
    row: dict[str, Any] = {
        "script": path.name,
        "calls_srun": bool(_SRUN.search(text)),
        "expands_hostnames": bool(_HOSTNAMES.search(text)),
    }
    try:
        out = translate(
            text,
            path.name,
            environ=_EveryVariable(),
            node_shape=(lambda _selected: shape) if shape is not None else None,
        )
        parse_job_spec(out.spec, topology_levels=None)
    except SbatchError as exc:
        row |= {"accepted": False, "option": exc.option, "rule": exc.rule, "where": exc.where}
        return row
    except SpecError as exc:
        first = exc.violations[0]
        row |= {"accepted": False, "option": f"spec:{first.field}", "rule": first.rule}
        return row
    row |= {"accepted": True, "replicas": out.spec["replicas"], "notes": len(out.notes)}
    return row


def _option_name(written: str) -> str:
    return written.split("=", 1)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--node-shape", help="GPU,CPU_MILLI,MEMORY_MIB of every node")
    args = parser.parse_args(argv)
    shape = NodeShape(*(int(v) for v in args.node_shape.split(","))) if args.node_shape else None
    files = sorted(p for p in args.folder.iterdir() if p.is_file() and p.suffix != ".tsv")
    if not files:
        parser.error(f"{args.folder}: no scripts")
    rows = [check(p, shape) for p in files]
    accepted = [r for r in rows if r["accepted"]]
    refused = Counter(_option_name(r["option"]) for r in rows if not r["accepted"])
    report = {
        "scripts": len(rows),
        "node_shape": args.node_shape,
        "accepted": len(accepted),
        "accepted_share": round(len(accepted) / len(rows), 3),
        "refused_by_option": dict(refused.most_common()),
        "calling_srun": sum(r["calls_srun"] for r in rows),
        "expanding_hostnames": sum(r["expands_hostnames"] for r in rows),
        "accepted_without_srun": sum(not r["calls_srun"] for r in accepted),
        "rows": rows,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
