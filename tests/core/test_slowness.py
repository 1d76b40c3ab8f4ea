"""The slow-node detector (core/health/slowness.py): each member against the median of
the rest of its peers, a strike for the slowest by the threshold, a mark after 3 strikes
in a node's last 5 verdicts, with the evidence as a sentence."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core.health.slowness import (
    GangWindow,
    MemberPace,
    SlownessLedger,
    SlownessRule,
    judge_window,
)

RULE = SlownessRule()


def _window(job: str, window: int, *paces: tuple[str, int]) -> GangWindow:
    members = tuple(MemberPace(node, rank, step) for rank, (node, step) in enumerate(paces))
    return GangWindow(job, window, members)


def _by_node(window: GangWindow, rule: SlownessRule = RULE) -> dict[str, tuple[int, bool]]:
    return {v.node_id: (v.slower_pct, v.strike) for v in judge_window(window, rule)}


def test_the_slowest_member_15_percent_over_the_median_of_the_rest_is_a_strike() -> None:
    at = _by_node(_window("j", 0, ("a", 1000), ("b", 1000), ("c", 1000), ("d", 1150)))
    assert at == {"a": (0, False), "b": (0, False), "c": (0, False), "d": (15, True)}
    below = _by_node(_window("j", 0, ("a", 1000), ("b", 1000), ("c", 1000), ("d", 1149)))
    assert below["d"] == (14, False)


def test_the_reference_leaves_the_member_out_and_only_the_slowest_strikes() -> None:
    # c is 30 % slower than the median of a, b, d (1000) but d is slower still.
    at = _by_node(_window("j", 0, ("a", 1000), ("b", 1000), ("c", 1300), ("d", 2000)))
    assert at["c"] == (30, False)
    assert at["d"] == (100, True)
    # Three members: the other two's median is their mean, kept exact on integers.
    assert _by_node(_window("j", 0, ("a", 1000), ("b", 1200), ("c", 1400)))["c"] == (27, True)


def test_two_members_compare_with_each_other_and_a_lone_member_is_not_judged() -> None:
    assert _by_node(_window("j", 0, ("a", 1000), ("b", 1200))) == {
        "a": (-17, False),
        "b": (20, True),
    }
    assert _by_node(_window("j", 0, ("a", 1000), ("b", 1100)))["b"] == (10, False)
    assert judge_window(_window("j", 0, ("a", 5000)), RULE) == ()
    three = SlownessRule(min_peers=3)
    assert judge_window(_window("j", 0, ("a", 1000), ("b", 1200)), three) == ()


def test_members_compare_only_with_peers_doing_the_same_work() -> None:
    # Two pipeline stages: the second takes twice as long per step, evenly.
    members = (
        MemberPace("a", 0, 1000, "stage-0"),
        MemberPace("b", 1, 1000, "stage-0"),
        MemberPace("c", 2, 2000, "stage-1"),
        MemberPace("d", 3, 2000, "stage-1"),
        MemberPace("e", 4, 9000, "stage-2"),  # alone in its stage: not judged
    )
    verdicts = judge_window(GangWindow("j", 0, members), RULE)
    assert [(v.node_id, v.slower_pct, v.strike) for v in verdicts] == [
        ("a", 0, False),
        ("b", 0, False),
        ("c", 0, False),
        ("d", 0, False),
    ]


def test_members_tied_slowest_both_strike() -> None:
    at = _by_node(_window("j", 0, ("a", 1000), ("b", 1000), ("c", 1000), ("d", 1300), ("e", 1300)))
    assert at["d"] == at["e"] == (30, True)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=12),
    st.randoms(use_true_random=False),
)
def test_verdicts_do_not_depend_on_the_order_members_are_listed(
    steps: list[int], rng: random.Random
) -> None:
    members = [MemberPace(f"n{i}", i, step) for i, step in enumerate(steps)]
    shuffled = list(members)
    rng.shuffle(shuffled)
    assert judge_window(GangWindow("j", 3, tuple(members)), RULE) == judge_window(
        GangWindow("j", 3, tuple(shuffled)), RULE
    )


def test_a_node_is_marked_at_its_third_strike_with_the_evidence() -> None:
    ledger = SlownessLedger()
    healthy = (("a", 1000), ("b", 1010), ("c", 990))
    assert ledger.observe(_window("job-12", 0, *healthy, ("n7", 1230))) == ()
    assert ledger.observe(_window("job-12", 1, *healthy, ("n7", 1000))) == ()
    assert ledger.observe(_window("job-12", 2, *healthy, ("n7", 1210))) == ()
    (mark,) = ledger.observe(_window("job-12", 3, *healthy, ("n7", 1300)))
    assert mark.node_id == "n7"
    assert mark.slower_pct == 23
    assert mark.gangs == ("job-12",)
    assert mark.evidence() == (
        "node n7: 23% slower than the median of its gang in 3 of its last 4 windows "
        "(1 gang), the slowest member each time: job-12 window 0 (rank 3, 23%), "
        "job-12 window 2 (rank 3, 21%), job-12 window 3 (rank 3, 30%)"
    )
    assert ledger.marked == {"n7": mark}
    # Marked once: its later windows mark nothing more.
    assert ledger.observe(_window("job-12", 4, *healthy, ("n7", 1300))) == ()


def test_strikes_that_fell_out_of_the_last_five_verdicts_do_not_count() -> None:
    ledger = SlownessLedger()
    peers = (("a", 1000), ("b", 1000))
    # Strikes in windows 0, 1, 6 and 7: never 3 among 5 consecutive verdicts.
    for window, step in enumerate([1500, 1500, 1000, 1000, 1000, 1000, 1500, 1500]):
        assert ledger.observe(_window("j", window, *peers, ("n7", step))) == ()
    (mark,) = ledger.observe(_window("j", 8, *peers, ("n7", 1500)))
    assert [v.window for v in mark.strikes] == [6, 7, 8]
    assert mark.weighed == 5


def test_strikes_in_three_gangs_mark_the_node_and_name_the_gangs() -> None:
    ledger = SlownessLedger()
    marks = []
    for job in ("job-12", "job-15", "job-19"):
        marks += ledger.observe(_window(job, 0, ("a", 1000), ("x", 1250), ("b", 1000)))
    (mark,) = marks
    assert mark.gangs == ("job-12", "job-15", "job-19")
    assert "in 3 of its last 3 windows (3 gangs)" in mark.evidence()
    assert "job-15 window 0 (rank 1, 25%)" in mark.evidence()


def test_a_marked_node_is_no_peer_so_the_next_slowest_of_its_gang_is_found() -> None:
    ledger = SlownessLedger()
    paces = (("a", 1000), ("b", 1000), ("c", 1000), ("s1", 1500), ("s2", 1300))
    found = [m.node_id for w in range(6) for m in ledger.observe(_window("j", w, *paces))]
    assert found == ["s1", "s2"]
    assert ledger.marked["s2"].slower_pct == 30


def test_clear_forgets_the_mark_and_the_history() -> None:
    ledger = SlownessLedger()
    paces = (("a", 1000), ("b", 1000), ("n7", 1300))
    for w in range(3):
        ledger.observe(_window("j", w, *paces))
    assert set(ledger.marked) == {"n7"}
    ledger.clear("n7")
    assert ledger.marked == {}
    assert ledger.observe(_window("j", 3, *paces)) == ()
    assert ledger.observe(_window("j", 4, *paces)) == ()
    assert [m.node_id for m in ledger.observe(_window("j", 5, *paces))] == ["n7"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (SlownessRule(threshold_pct=0), "threshold_pct: between 1 and 1000, got 0"),
        (SlownessRule(span=0), "span: between 1 and 100, got 0"),
        (SlownessRule(strikes=6), "strikes: between 1 and span (5), got 6"),
        (SlownessRule(min_peers=1), "min_peers: at least 2, got 1"),
    ],
)
def test_a_rule_out_of_range_is_refused_naming_the_field(rule: SlownessRule, message: str) -> None:
    assert rule.error() == message
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SlownessLedger(rule)


def test_the_default_rule_is_in_range() -> None:
    assert RULE.error() is None
    assert (RULE.threshold_pct, RULE.strikes, RULE.span) == (15, 3, 5)


_GANGS = st.lists(
    st.lists(st.integers(min_value=0, max_value=39), min_size=2, max_size=8, unique=True),
    min_size=1,
    max_size=20,
)


@settings(max_examples=30, deadline=None)
@given(_GANGS, st.randoms(use_true_random=False))
def test_a_healthy_cluster_with_noise_under_the_threshold_never_marks(
    gangs: list[list[int]], rng: random.Random
) -> None:
    # Every pace within 6 % of the gang's: at most 1.06 / 0.94 = 12.8 % over any median.
    ledger = SlownessLedger()
    for job, nodes in enumerate(gangs):
        base = rng.randint(1_000, 3_000_000)
        for window in range(rng.randint(1, 6)):
            paces = tuple(
                MemberPace(f"n{n}", rank, int(base * rng.uniform(0.94, 1.06)))
                for rank, n in enumerate(nodes)
            )
            assert ledger.observe(GangWindow(f"job-{job}", window, paces)) == ()


@settings(max_examples=20, deadline=None)
@given(_GANGS, st.randoms(use_true_random=False), st.integers(min_value=25, max_value=200))
def test_a_slow_node_is_found_after_three_windows_and_no_other_node(
    gangs: list[list[int]], rng: random.Random, slower_pct: int
) -> None:
    # Node n0 is in every gang and slower_pct slower; noise within 4 %: it always strikes
    # (1.25 x 0.96 / 1.04 > 1.15) and no healthy node ever does.
    ledger = SlownessLedger()
    seen = 0
    marks: list[str] = []
    for job, others in enumerate(gangs):
        nodes = [0, *(n for n in others if n != 0)]
        base = rng.randint(1_000, 3_000_000)
        for window in range(rng.randint(1, 4)):
            paces = tuple(
                MemberPace(
                    f"n{n}",
                    rank,
                    int(base * rng.uniform(0.96, 1.04) * (1 + slower_pct / 100 * (n == 0))),
                )
                for rank, n in enumerate(nodes)
            )
            found = ledger.observe(GangWindow(f"job-{job}", window, paces))
            seen += 1
            marks += [m.node_id for m in found]
            if seen == 3:
                assert [m.node_id for m in found] == ["n0"]
                assert found[0].slower_pct >= 15
    assert marks == (["n0"] if seen >= 3 else [])
