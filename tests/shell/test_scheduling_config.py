"""``[scheduling]`` of synapse-scheduler: priority classes, the preemption mode and the
fair-share half-life from TOML or flags, checked by the core's rule set, and applied to
the replicated configuration by the leader (SchedulingSettings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig, Limits, PreemptionMode, PriorityClass
from synapse_ha.leader.scheduling import SchedulingSettings
from synapse_ha.programs import scheduler as scheduler_main


def load(tmp_path: Path, toml: str = "", *flags: str) -> scheduler_main.SchedulerConfig:
    config = tmp_path / "scheduler.toml"
    config.write_text(toml)
    base = [
        "--config", str(config), "--id", "a", "--replica", "a=127.0.0.1:7001,127.0.0.1:7101",
        "--data-dir", str(tmp_path / "data"), "--insecure",
    ]  # fmt: skip
    return scheduler_main.load_config(
        [*base, *flags],
        environ={"SYNAPSE_RAFT_PASSWORD": "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="},
    )


def test_nothing_configured_leaves_the_replicated_settings(tmp_path: Path) -> None:
    settings = load(tmp_path).scheduling
    assert settings == SchedulingSettings()
    assert settings.applied_to(ClusterConfig()) == ClusterConfig()


def test_classes_mode_and_half_life_from_toml(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        """
[scheduling]
preemption = "blind"
fair_share_half_life = "1d"

[[scheduling.priority_classes]]
name = "batch"
value = -10
grace = "2s"

[[scheduling.priority_classes]]
name = "urgent"
value = 50
preempts = true
""",
    ).scheduling
    assert settings.priority_classes == (
        PriorityClass("batch", -10, False, 2_000),
        PriorityClass("urgent", 50, True, 30_000),
    )
    assert settings.preemption is PreemptionMode.BLIND
    assert settings.fair_share_half_life_ms == 86_400_000
    config = settings.applied_to(ClusterConfig())
    assert config.priority_classes == settings.priority_classes
    assert (config.preemption, config.fair_share_half_life_ms) == (PreemptionMode.BLIND, 86_400_000)


def test_flags_replace_the_files_classes(tmp_path: Path) -> None:
    toml = '[[scheduling.priority_classes]]\nname = "batch"\nvalue = -10\n'
    settings = load(
        tmp_path, toml, "--priority-class", "low=-1,grace=500ms", "--priority-class",
        "top=9,preempts", "--preemption", "off",
    ).scheduling  # fmt: skip
    assert settings.priority_classes == (
        PriorityClass("low", -1, False, 500),
        PriorityClass("top", 9, True, 30_000),
    )
    assert settings.preemption is PreemptionMode.OFF


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--preemption", "sometimes"), "preemption must be one of topology, blind, off"),
        (("--priority-class", "x"), "expected NAME=VALUE"),
        (("--priority-class", "x=high"), "the value must be an integer"),
        (("--priority-class", "x=1,loud"), "unknown option 'loud'"),
        (("--priority-class", "x=1", "--priority-class", "x=2"), "a class appears twice"),
        (("--priority-class", "Bad_Name=1"), "priority_classes[0].name"),
        (("--priority-class", "x=1,grace=2d"), "grace_ms: must be between 0 and 24h"),
        (("--fair-share-half-life", "0s"), "fair_share_half_life must be positive"),
        (("--max-requeues", "-1"), "max_requeues must be an integer from 0 to 1000"),
        (("--max-requeues", "1001"), "max_requeues must be an integer from 0 to 1000"),
        (("--start-timeout", "500ms"), "start_timeout must be from 1s to 24h, got '500ms'"),
        (("--start-timeout", "2d"), "start_timeout must be from 1s to 24h, got '2d'"),
        (("--start-timeout", "soon"), "start_timeout"),
        (("--priority-class", "x=1,min-runtime=8d"), "min_runtime_ms: must be 0 to 7 days"),
        (("--priority-class", "x=1,min-runtime=soon"), "min_runtime"),
        (("--reclaim-wait-max", "2d"), "reclaim_wait_max must be from 0s to 24h, got '2d'"),
        (("--master-port-base", "80"), "master_port_base must be an integer from 1024 to 45536"),
        (("--master-port-base", "50000"), "and those 10000 above"),
    ],
)
def test_bad_settings_are_refused_naming_them(
    tmp_path: Path, flags: tuple[str, ...], words: str
) -> None:
    with pytest.raises(scheduler_main.ConfigError) as refused:
        load(tmp_path, "", *flags)
    assert words in str(refused.value)


def test_max_requeues_from_toml_or_flag(tmp_path: Path) -> None:
    from_file = load(tmp_path, "[scheduling]\nmax_requeues = 40\n").scheduling
    assert from_file.applied_to(ClusterConfig()).max_requeues == 40
    from_flag = load(tmp_path, "[scheduling]\nmax_requeues = 40\n", "--max-requeues", "7")
    assert from_flag.scheduling.applied_to(ClusterConfig()).max_requeues == 7
    with pytest.raises(scheduler_main.ConfigError, match="max_requeues"):
        load(tmp_path, '[scheduling]\nmax_requeues = "many"\n')


def test_master_port_base_from_toml_or_flag(tmp_path: Path) -> None:
    assert load(tmp_path, "").scheduling.applied_to(ClusterConfig()).master_port_base == 29_500
    from_file = load(tmp_path, "[scheduling]\nmaster_port_base = 31000\n").scheduling
    assert from_file.applied_to(ClusterConfig()).master_port_base == 31_000
    from_flag = load(tmp_path, "", "--master-port-base", "20000").scheduling
    assert from_flag.applied_to(ClusterConfig()).master_port_base == 20_000


def test_start_timeout_from_toml_or_flag(tmp_path: Path) -> None:
    unset = load(tmp_path, "").scheduling.applied_to(ClusterConfig())
    assert unset.start_timeout_ms == ClusterConfig().start_timeout_ms
    from_file = load(tmp_path, '[scheduling]\nstart_timeout = "10m"\n').scheduling
    assert from_file.applied_to(ClusterConfig()).start_timeout_ms == 600_000
    from_flag = load(tmp_path, '[scheduling]\nstart_timeout = "10m"\n', "--start-timeout", "1h")
    assert from_flag.scheduling.applied_to(ClusterConfig()).start_timeout_ms == 3_600_000


def test_limits_from_toml_are_pinned_and_applied_over_the_replicated_ones(tmp_path: Path) -> None:
    settings = load(
        tmp_path, "[limits]\nsubmit_per_s = 7\npending_jobs_per_user = 500\n"
    ).scheduling
    assert settings.pinned_limits == {"submit_per_s", "pending_jobs_per_user"}
    replicated = ClusterConfig(limits=Limits(submit_burst=10, submit_per_s=99))
    applied = settings.applied_to(replicated).limits
    assert (applied.submit_per_s, applied.pending_jobs_per_user) == (7, 500)
    assert applied.submit_burst == 10  # not named by the file: the replicated value stays


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ("[limits]\nsubmit_per_s = 0\n", "limits.submit_per_s: must be a whole number from 1"),
        ("[limits]\ngpus = 4\n", "limits.gpus: no such limit"),
        ('[limits]\nspec_bytes = "64Ki"\n', "limits.spec_bytes: must be a whole number"),
        ("[limits]\nenv_bytes = 70000\n", "limits.env_bytes: must not exceed limits.spec_bytes"),
        ("limits = 3\n", "limits: must be a table"),
    ],
)
def test_bad_limits_are_refused_naming_the_key(tmp_path: Path, toml: str, says: str) -> None:
    with pytest.raises(scheduler_main.ConfigError, match=says):
        load(tmp_path, toml)


def test_node_health_settings_from_toml_and_flags(tmp_path: Path) -> None:
    toml = """
[scheduling]
gpu_drain_threshold = 2
unfit_backoff = "30m"
"""
    settings = load(tmp_path, toml, "--cordon-after-start-failures", "0").scheduling
    config = settings.applied_to(ClusterConfig())
    assert (config.gpu_drain_threshold, config.unfit_backoff_ms) == (2, 1_800_000)
    assert config.cordon_after_start_failures == 0
    assert load(tmp_path).scheduling.applied_to(ClusterConfig()) == ClusterConfig()


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[scheduling]\ngpu_drain_threshold = -1", "gpu_drain_threshold must be an integer"),
        ("[scheduling]\ngpu_drain_threshold = true", "gpu_drain_threshold must be an integer"),
        ('[scheduling]\nunfit_backoff = "8d"', "unfit_backoff must be from 0s to 7d"),
        ("[scheduling]\ncordon_after_start_failures = 1001", "cordon_after_start_failures"),
    ],
)
def test_bad_node_health_settings_name_the_key_and_the_rule(
    tmp_path: Path, toml: str, words: str
) -> None:
    with pytest.raises(scheduler_main.ConfigError, match=words):
        load(tmp_path, toml)


def test_hold_until_stopped_from_toml_or_flag(tmp_path: Path) -> None:
    held = load(tmp_path, "[scheduling]\nhold_until_stopped = true").scheduling
    assert held.hold_until_stopped is True
    assert held.applied_to(ClusterConfig()).hold_until_stopped
    flag = load(tmp_path, "[scheduling]\nhold_until_stopped = true", "--no-hold-until-stopped")
    assert flag.scheduling.hold_until_stopped is False
    with pytest.raises(
        scheduler_main.ConfigError, match="hold_until_stopped must be true or false"
    ):
        load(tmp_path, '[scheduling]\nhold_until_stopped = "yes"')


def test_clear_gpu_faults_on_reboot_from_toml_or_flag(tmp_path: Path) -> None:
    toml = "[scheduling]\nclear_gpu_faults_on_reboot = true"
    assert load(tmp_path, toml).scheduling.clear_gpu_faults_on_reboot is True
    assert load(tmp_path, "").scheduling.clear_gpu_faults_on_reboot is None
    flag = load(tmp_path, toml, "--no-clear-gpu-faults-on-reboot").scheduling
    assert flag.applied_to(ClusterConfig(clear_gpu_faults_on_reboot=True)) == ClusterConfig()
    with pytest.raises(scheduler_main.ConfigError, match="clear_gpu_faults_on_reboot must be"):
        load(tmp_path, "[scheduling]\nclear_gpu_faults_on_reboot = 1")


def test_minimum_run_times_and_the_reclaim_wait_from_toml_or_flags(tmp_path: Path) -> None:
    toml = """
[scheduling]
reclaim_wait_max = "20m"

[[scheduling.priority_classes]]
name = "batch"
value = -10
min_runtime = "1h"
"""
    settings = load(tmp_path, toml).scheduling
    assert settings.priority_classes == (PriorityClass("batch", -10, False, 30_000, 3_600_000),)
    assert settings.applied_to(ClusterConfig()).reclaim_wait_max_ms == 1_200_000
    flags = load(
        tmp_path, toml, "--priority-class", "low=-1,min-runtime=30m", "--reclaim-wait-max", "0s"
    ).scheduling
    assert flags.priority_classes == (PriorityClass("low", -1, False, 30_000, 1_800_000),)
    assert flags.applied_to(ClusterConfig()).reclaim_wait_max_ms == 0
    unset = load(tmp_path, "").scheduling.applied_to(ClusterConfig())
    assert unset.reclaim_wait_max_ms == ClusterConfig().reclaim_wait_max_ms
