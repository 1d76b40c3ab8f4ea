"""Defragmentation in synapse-scheduler's configuration: ``[scheduling]
defrag_share_pct`` (or ``--defrag-share-pct``), replicated by the leader
(SchedulingSettings), refused with the key and the rule when out of range."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.programs import scheduler as scheduler_main
from tests.shell.test_scheduling_config import load


def test_the_drain_share_from_toml_or_a_flag_and_left_as_replicated_when_unset(
    tmp_path: Path,
) -> None:
    toml = "[scheduling]\ndefrag_share_pct = 25"
    assert load(tmp_path, toml).scheduling.applied_to(ClusterConfig()).defrag_share_pct == 25
    flag = load(tmp_path, toml, "--defrag-share-pct", "10").scheduling
    assert flag.defrag_share_pct == 10
    unset = load(tmp_path).scheduling
    assert unset.defrag_share_pct is None
    replicated = ClusterConfig(defrag_share_pct=5)
    assert unset.applied_to(replicated).defrag_share_pct == 5


@pytest.mark.parametrize("value", ["-1", "101"])
def test_a_share_out_of_range_names_the_key_and_the_rule(tmp_path: Path, value: str) -> None:
    words = "defrag_share_pct must be an integer from 0 to 100"
    with pytest.raises(scheduler_main.ConfigError, match=words):
        load(tmp_path, f"[scheduling]\ndefrag_share_pct = {value}")
