"""The launch spec a gang's members are started with, read from the job's spec."""

from __future__ import annotations

from synapse_ha.core.desired import LaunchSpec
from synapse_ha.core.health.prestart import Prestart
from synapse_ha.core.health.progress import Progress
from synapse_ha.core.model import JobSpec, Resources


def test_a_launch_spec_carries_the_job_specs_launch_fields_and_its_hang_detection() -> None:
    spec = JobSpec(
        name="train",
        replicas=2,
        resources=Resources(4000, 8192, 2),
        command=("python", "train.py"),
        shell=False,
        env=(("A", "1"),),
        workdir="/w",
        priority=5,
        time_limit_ms=60_000,
        image="img:1",
        progress=Progress(120_000, "log"),
        prestart=Prestart(("true",), shell=False, timeout_ms=5_000),
        stop_grace_ms=9_000,
    )
    assert LaunchSpec.of(spec) == LaunchSpec(
        command=("python", "train.py"),
        shell=False,
        env=(("A", "1"),),
        workdir="/w",
        time_limit_ms=60_000,
        image="img:1",
        resources=Resources(4000, 8192, 2),
        progress_timeout_ms=120_000,
        progress_source="log",
        prestart=Prestart(("true",), shell=False, timeout_ms=5_000),
        stop_grace_ms=9_000,
    )
    bare = LaunchSpec.of(JobSpec(name="b", replicas=1, resources=Resources(), command=("x",)))
    assert (bare.progress_timeout_ms, bare.progress_source, bare.prestart) == (0, "", None)
