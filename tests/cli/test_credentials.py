"""Where synctl finds its TLS files, and how it keeps log grants (no cluster: files and a
fake clock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.cli.app import CommandFailed, find_tls
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.client.logs import GrantCache, LogGrant, MemberLog
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import TlsFiles


@pytest.fixture(scope="module")
def client_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return ClusterCredentials.ensure(tmp_path_factory.mktemp("creds")).client_tls()


def test_no_tls_files_anywhere_means_plaintext(tmp_path: Path) -> None:
    assert find_tls(None, None, None, {"XDG_CONFIG_HOME": str(tmp_path)}) is None


def test_given_files_win_over_the_config_directory(tmp_path: Path, client_files: TlsFiles) -> None:
    folder = tmp_path / "synapse"
    folder.mkdir()
    (folder / "ca.pem").write_text("not a certificate")
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert find_tls(client_files.ca, client_files.cert, client_files.key, env) == client_files


def test_the_config_directory_fills_in_what_is_not_given(
    tmp_path: Path, client_files: TlsFiles
) -> None:
    folder = tmp_path / "synapse"
    folder.mkdir()
    (folder / "key.pem").write_bytes(client_files.key.read_bytes())
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    found = find_tls(client_files.ca, client_files.cert, None, env)
    assert found == TlsFiles(client_files.ca, client_files.cert, folder / "key.pem")


def test_partial_settings_name_the_missing_files(tmp_path: Path, client_files: TlsFiles) -> None:
    with pytest.raises(CommandFailed) as raised:
        find_tls(client_files.ca, None, None, {"XDG_CONFIG_HOME": str(tmp_path)})
    assert raised.value.code is ExitCode.USAGE
    assert "--cert ($SYNAPSE_CERT), --key ($SYNAPSE_KEY) not given" in str(raised.value)
    assert "--ca" not in str(raised.value).split("not given")[0]


def test_an_unreadable_file_is_named(tmp_path: Path, client_files: TlsFiles) -> None:
    missing = tmp_path / "gone.pem"
    with pytest.raises(CommandFailed) as raised:
        find_tls(missing, client_files.cert, client_files.key, {"XDG_CONFIG_HOME": "/none"})
    assert raised.value.code is ExitCode.USAGE and str(missing) in str(raised.value)


MEMBER = MemberLog("j1", 1, 0, "w1", "127.0.0.1:1")


class FakeLeader:
    """Hands out numbered grants that expire ``lifetime_s`` after the fake clock's now."""

    def __init__(self, lifetime_s: float = 60.0, signs: bool = True) -> None:
        self.now = 1000.0
        self.lifetime_s = lifetime_s
        self.signs = signs
        self.asked: list[MemberLog] = []

    def clock(self) -> float:
        return self.now

    def fetch(self, member: MemberLog) -> LogGrant | None:
        self.asked.append(member)
        if not self.signs:
            return None
        return LogGrant(f"grant-{len(self.asked)}", self.now + self.lifetime_s)


def test_a_grant_is_reused_until_it_nears_its_expiry() -> None:
    leader = FakeLeader(lifetime_s=60.0)
    cache = GrantCache(leader.fetch, clock=leader.clock, margin_s=10.0)
    assert cache.get(MEMBER) == "grant-1"
    leader.now += 49.0
    assert cache.get(MEMBER) == "grant-1"
    leader.now += 1.0  # 10 s left: replaced
    assert cache.get(MEMBER) == "grant-2"
    assert len(leader.asked) == 2


def test_each_member_has_its_own_grant_and_a_refused_one_is_fetched_again() -> None:
    leader = FakeLeader()
    cache = GrantCache(leader.fetch, clock=leader.clock)
    other = MemberLog("j1", 1, 1, "w2", "127.0.0.1:2")
    assert (cache.get(MEMBER), cache.get(other)) == ("grant-1", "grant-2")
    cache.forget(MEMBER)
    assert (cache.get(MEMBER), cache.get(other)) == ("grant-3", "grant-2")


def test_a_cluster_that_signs_no_grants_is_asked_once() -> None:
    leader = FakeLeader(signs=False)
    cache = GrantCache(leader.fetch, clock=leader.clock)
    assert cache.get(MEMBER) is None
    leader.now += 1e6
    assert cache.get(MEMBER) is None
    assert len(leader.asked) == 1


def test_a_refusal_from_the_leader_reaches_the_caller() -> None:
    def refuse(member: MemberLog) -> LogGrant | None:
        raise PermissionError(member.job_id)

    with pytest.raises(PermissionError):
        GrantCache(refuse).get(MEMBER)
