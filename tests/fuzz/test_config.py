"""Fuzzing the TOML configuration loaders of synapse-scheduler and synapse-worker.

Every key either program reads, at the top level and in its tables, gets a value of any
TOML type (and some that are not TOML at all); ``load_config`` must answer with a
configuration or with its :class:`ConfigError`, whose message names the key, never with
another exception (a traceback at start-up). ``data_dir`` stays a writable directory of
the test's own, since the loaders create it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse_ha.programs import scheduler, worker
from tests.fuzz import harness

TOML_VALUES = [
    "1",
    "-1",
    "0",
    "9223372036854775807",
    "3.5",
    "inf",
    "nan",
    "true",
    '""',
    '"x"',
    '"1s"',
    '"-5s"',
    '"10m"',
    '"500ms"',
    '"127.0.0.1:7070"',
    '"::1"',
    '"/nonexistent/file"',
    '"rack=r1"',
    "[]",
    "[1, 2]",
    '["a", "b"]',
    '["127.0.0.1:1,127.0.0.1:2"]',
    "{}",
    "{a = 1}",
    '{id = "r1"}',
    '[{id = "r1", raft = "127.0.0.1:1", grpc = "127.0.0.1:2"}]',
    '[{name = "x", value = "y"}]',
    '[{name = "x", value = 1, preempts = true, grace = "1s"}]',
    "1979-05-27T07:32:00Z",
    '"\\u0000"',
]
BROKEN = ["= 1", "[[", 'x = "unterminated', "\x00", "a.b = 1\na = 2"]

SCHEDULER_KEYS = {
    "": [
        "replica_id",
        "replicas",
        "raft_password_file",
        "timeouts",
        "scheduling",
        "limits",
        "raft",
        "reads",
        "history",
        "tls",
        "insecure",
        "bootstrap_token_file",
        "join",
        "restore",
        "metrics",
        "metrics_address",
        "log_level",
    ],
    "timeouts": ["heartbeat_interval", "lease_ttl", "leader_step_down", "dead_timeout"],
    "scheduling": ["locality_wait", "preemption", "fair_share_half_life", "priority_classes"],
    "limits": ["spec_bytes", "env_bytes", "submit_per_s", "watch_streams_total"],
    "raft": ["election_min", "election_max", "compaction_entries"],
    "reads": ["heavy_concurrency", "heavy_cpu_share"],
    "history": ["enabled", "event_ring"],
    "tls": ["ca", "cert", "key"],
    "metrics": ["address"],
}
WORKER_KEYS = {
    "": [
        "schedulers",
        "node_id",
        "listen",
        "advertise",
        "cpu",
        "memory",
        "topology",
        "heartbeat_interval",
        "lease_ttl",
        "fence_grace",
        "stop_grace",
        "run_as",
        "allow_root_members",
        "cgroup_root",
        "no_cgroups",
        "image_runtime",
        "image_run_args",
        "mock_gpus",
        "mock_gpu_model",
        "mock_nvlink",
        "log_level",
        "features",
        "metrics",
        "user_map",
        "tls",
        "insecure",
    ],
    "tls": ["ca", "cert", "key"],
    "metrics": ["address"],
    "features": ["x", "images"],
    "user_map": ["alice", "*"],
}

SCHEDULER_BASE = {
    "replica_id": '"r1"',
    "replicas": '[{id = "r1", raft = "127.0.0.1:1", grpc = "127.0.0.1:2"}]',
    "insecure": "true",
}
WORKER_BASE = {"schedulers": '["127.0.0.1:1"]', "node_id": '"n1"', "insecure": "true"}


def documents(keys: dict[str, list[str]], base: dict[str, str]) -> st.SearchStrategy[str]:
    """TOML text: a valid configuration (``base``, top-level keys) with random keys of
    each table set to random values, or broken TOML."""

    def render(tables: dict[str, dict[str, str]]) -> str:
        tables = {**tables, "": {**base, **tables.get("", {})}}
        out = [f"{k} = {v}" for k, v in tables.get("", {}).items()]
        for table, items in tables.items():
            if table:
                out.append(f"[{table}]")
                out += [f"{k} = {v}" for k, v in items.items()]
        return "\n".join(out) + "\n"

    tables = st.fixed_dictionaries(
        {},
        optional={
            table: st.dictionaries(st.sampled_from(names), st.sampled_from(TOML_VALUES), max_size=6)
            for table, names in keys.items()
        },
    )
    return st.one_of(
        tables.map(render),
        st.builds(lambda t, b: render(t) + b, tables, st.sampled_from(BROKEN)),
    )


def _only_config_errors(load: Callable[[], Any], kind: type[Exception]) -> str:
    try:
        load()
    except kind:
        return harness.REJECTED
    except SystemExit as exc:  # argparse; not expected with well-formed flags
        raise AssertionError(f"the loader exited: {exc}") from exc
    return harness.ACCEPTED


TALLY = harness.Tally("config")
record_the_counts = harness.recorder(TALLY)


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config")
    (root / "data").mkdir()
    return root


SETTINGS = settings(
    max_examples=harness.examples(100),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(text=documents(SCHEDULER_KEYS, SCHEDULER_BASE))
def test_scheduler_config_errors_are_config_errors(config_dir: Path, text: str) -> None:
    TALLY.examples += 1
    path = config_dir / "scheduler.toml"
    path.write_text(text)
    argv = ["--config", str(path), "--data-dir", str(config_dir / "data")]
    environ = {"SYNAPSE_RAFT_PASSWORD": "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="}
    kind = _only_config_errors(lambda: scheduler.load_config(argv, environ), scheduler.ConfigError)
    TALLY.add("scheduler.load_config", "-", harness.Outcome(kind, "-"))


@SETTINGS
@given(text=documents(WORKER_KEYS, WORKER_BASE))
def test_worker_config_errors_are_config_errors(config_dir: Path, text: str) -> None:
    TALLY.examples += 1
    path = config_dir / "worker.toml"
    path.write_text(text)
    argv = ["--config", str(path), "--data-dir", str(config_dir / "data")]
    kind = _only_config_errors(lambda: worker.load_config(argv, {}, euid=1000), worker.ConfigError)
    TALLY.add("worker.load_config", "-", harness.Outcome(kind, "-"))


# What the fuzzer found: each of these gave a TypeError, an AttributeError, or opened a
# file descriptor, instead of a ConfigError naming the key.
SCHEDULER_REGRESSIONS = {
    "replicas = 1": "replicas",
    "timeouts = 1": "timeouts",
    'raft = "x"': "raft",
    "raft_password_file = 1": "raft_password_file",
    "bootstrap_token_file = 0": "bootstrap_token_file",
    "data_dir = 1": "data_dir",
    "[tls]\nca = 1": "tls.ca",
}
WORKER_REGRESSIONS = {
    "schedulers = 1": "schedulers",
    "schedulers = [1]": "schedulers",
    "features = 1": "features",
    "metrics = 1": "metrics",
    "user_map = 1": "user_map",
    "[tls]\nkey = 1": "tls.key",
}


@pytest.mark.parametrize("text", sorted(SCHEDULER_REGRESSIONS))
def test_scheduler_config_key_of_the_wrong_type(tmp_path: Path, text: str) -> None:
    path = tmp_path / "scheduler.toml"
    base = "\n".join(f"{k} = {v}" for k, v in SCHEDULER_BASE.items() if k not in text)
    path.write_text(base + "\n" + text + "\n")
    argv = ["--config", str(path), "--data-dir", str(tmp_path / "data")]
    if "data_dir" in text:
        argv = argv[:2]
    with pytest.raises(scheduler.ConfigError, match=SCHEDULER_REGRESSIONS[text]):
        scheduler.load_config(
            argv, {"SYNAPSE_RAFT_PASSWORD": "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="}
        )


@pytest.mark.parametrize("text", sorted(WORKER_REGRESSIONS))
def test_worker_config_key_of_the_wrong_type(tmp_path: Path, text: str) -> None:
    path = tmp_path / "worker.toml"
    base = "\n".join(f"{k} = {v}" for k, v in WORKER_BASE.items() if k not in text)
    path.write_text(base + "\n" + text + "\n")
    argv = ["--config", str(path), "--data-dir", str(tmp_path / "data")]
    with pytest.raises(worker.ConfigError, match=WORKER_REGRESSIONS[text]):
        worker.load_config(argv, {}, euid=1000)
