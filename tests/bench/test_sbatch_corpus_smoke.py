"""The sbatch corpus benchmark on a folder of scripts written here: each verdict, the
refusals counted by option, and srun / scontrol use told apart from acceptance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sbatch_corpus.py"

SCRIPTS = {
    "torchrun.sh": """#!/bin/bash
#SBATCH --job-name=pretrain --nodes=2 --ntasks-per-node=1 --gres=gpu:8  # one per node
#SBATCH --export=ALL,HF_TOKEN
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes 2 --rdzv-endpoint "$head:29500" train.py
""",
    "plain.sh": "#!/bin/sh\n#SBATCH -N 2\ntorchrun train.py\n",
    "account.sh": "#!/bin/sh\n#SBATCH -N 2 -A proj\nsrun python train.py\n",
    "tasks.sh": "#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=8\nsrun python train.py\n",
    "exclusive.sh": "#!/bin/sh\n#SBATCH -N 2 --exclusive\nsrun python train.py\n",
}


def test_the_corpus_benchmark_counts_each_verdict(tmp_path: Path) -> None:
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "MANIFEST.tsv").write_text("not a script\n")
    out = subprocess.run(
        [sys.executable, str(BENCH), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert (report["scripts"], report["accepted"]) == (5, 4)
    assert report["refused_by_option"] == {"--exclusive": 1}
    rows = {r["script"]: r for r in report["rows"]}
    assert rows["torchrun.sh"]["accepted"] and rows["torchrun.sh"]["replicas"] == 2
    assert rows["torchrun.sh"]["calls_srun"] and rows["torchrun.sh"]["expands_hostnames"]
    assert not rows["plain.sh"]["calls_srun"]
    assert (report["calling_srun"], report["accepted_without_srun"]) == (4, 1)
    assert rows["account.sh"]["accepted"]
    assert rows["tasks.sh"]["accepted"] and rows["tasks.sh"]["replicas"] == 2
    assert "needs the cluster's node shape" in rows["exclusive.sh"]["rule"]


def test_a_node_shape_lets_exclusive_take_whole_nodes(tmp_path: Path) -> None:
    (tmp_path / "exclusive.sh").write_text(SCRIPTS["exclusive.sh"])
    out = subprocess.run(
        [sys.executable, str(BENCH), str(tmp_path), "--node-shape", "8,96000,1048576"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert (report["accepted"], report["node_shape"]) == (1, "8,96000,1048576")
