"""Slurm host lists (``scontrol show hostnames`` / ``hostlist``): the forms real scripts
meet, the rules a malformed list breaks, and expand(compress(hosts)) == hosts for any
hosts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse_ha.slurm.hostlist import MAX_HOSTS, HostListError, compress, expand, expand_all


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("10.0.0.7:7070", ["10.0.0.7:7070"]),  # synapse's own lists: addresses, commas
        ("a,b,c", ["a", "b", "c"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("n[1,3,5-6],login", ["n1", "n3", "n5", "n6", "login"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # leftmost slowest
        ("ip-10-0-[1-2]-5", ["ip-10-0-1-5", "ip-10-0-2-5"]),
        ("[7-8]x", ["7x", "8x"]),
        ("n1,n1", ["n1", "n1"]),  # duplicates kept, as scontrol does
        ("  n[1-2]  ", ["n1", "n2"]),
        ("", []),
    ],
)
def test_expand_reads_the_forms_scripts_meet(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("n[1-3", "without its ']'"),
        ("n1-3]", "without its '['"),
        ("n[[1]]", "do not nest"),
        ("n[]", "empty bracket"),
        ("n[3-1]", "ends before it starts"),
        ("n[a-b]", "give N or LO-HI"),
        ("n1,,n2", "empty host name"),
        ("n1,", "empty host name"),
        ("n 1", "no spaces"),
        ("n[0-99999999]", f"more than {MAX_HOSTS:,}"),
        ("a[0-999]b[0-999]", f"more than {MAX_HOSTS:,}"),
    ],
)
def test_a_malformed_list_names_the_rule(text: str, rule: str) -> None:
    with pytest.raises(HostListError, match=rule.replace("[", r"\[").replace("]", r"\]")):
        expand(text)


@pytest.mark.parametrize(
    ("hosts", "text"),
    [
        (["n1", "n2", "n3", "x"], "n[1-3],x"),
        (["gpu08", "gpu09", "gpu10"], "gpu[08-10]"),
        (["n9", "n10", "n12"], "n[9-10,12]"),
        (["n1", "n01"], "n1,n01"),  # different widths stay apart
        (["a", "b"], "a,b"),
        (["n3", "n1"], "n[3,1]"),  # order is kept
        ([], ""),
    ],
)
def test_compress_writes_the_usual_form(hosts: list[str], text: str) -> None:
    assert compress(hosts) == text
    assert expand(text) == hosts


def test_several_lists_expand_in_order() -> None:
    assert expand_all(["n[1-2]", "m1"]) == ["n1", "n2", "m1"]


NAMES = st.builds(
    lambda prefix, number, width: f"{prefix}{str(number).zfill(width)}" if width else prefix,
    st.sampled_from(["n", "gpu-", "r1n", "host", "a.b-"]),
    st.integers(0, 120),
    st.sampled_from([0, 1, 2, 3]),
)


@given(st.lists(NAMES, max_size=40))
def test_expand_undoes_compress_for_any_hosts(hosts: list[str]) -> None:
    assert expand(compress(hosts)) == hosts
