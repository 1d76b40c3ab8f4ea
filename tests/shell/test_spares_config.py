"""Hot spares in synapse-scheduler's configuration: ``[scheduling] spares`` and
``spare_level`` (or ``--spares``/``--spare-level``), replicated by the leader
(SchedulingSettings), refused with the key and the rule when out of range."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.programs import scheduler as scheduler_main
from tests.shell.test_scheduling_config import load


def test_spares_and_their_level_from_toml_or_flags(tmp_path: Path) -> None:
    toml = '[scheduling]\nspares = 2\nspare_level = "block"'
    config = load(tmp_path, toml).scheduling.applied_to(ClusterConfig())
    assert (config.spares, config.spare_level) == (2, "block")
    flags = load(tmp_path, toml, "--spares", "1", "--spare-level", "cluster").scheduling
    assert (flags.spares, flags.spare_level) == (1, "cluster")
    unset = load(tmp_path).scheduling
    assert (unset.spares, unset.spare_level) == (None, None)  # the replicated values stay


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[scheduling]\nspares = -1", "spares must be an integer from 0 to 1000"),
        ("[scheduling]\nspares = 1001", "spares must be an integer from 0 to 1000"),
        ('[scheduling]\nspare_level = "host"', "spare_level must be one of zone, block, rack"),
    ],
)
def test_bad_spare_settings_name_the_key_and_the_rule(
    tmp_path: Path, toml: str, words: str
) -> None:
    with pytest.raises(scheduler_main.ConfigError, match=words):
        load(tmp_path, toml)
