"""HRRN's kinetic tournament: emptied, it is one leaf again (a queue of one, the usual state, walks no tree a burst
grew), and its winner and order stay those of the score order whatever the inserts, removals and counter moves."""

from __future__ import annotations

from functools import cmp_to_key

from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.policies.entry import Entry
from prefillq.policies.hrrn import KineticTournament, beats
from prefillq.requests import QueuedRequest


def _entry(i: int, cost: int, p_arrival: int) -> Entry:
    entry = Entry(object(), f"r{i:03d}", QueuedRequest(f"r{i:03d}", cost), i, i, 0.0, p_arrival, cost)
    return entry


def _best_first(entries: list[Entry], counter: int) -> list[Entry]:
    return sorted(entries, key=cmp_to_key(lambda a, b: -1 if beats(a, b, counter) else 1))


def test_an_emptied_tournament_is_one_leaf_again():
    tree = KineticTournament()
    entries = [_entry(i, 10 + i, 0) for i in range(9)]
    for e in entries:
        tree.insert(e)
    for e in entries:
        tree.remove(e)
    assert len(tree) == 0 and tree.winner() is None and len(tree._winner) == 2
    lone = _entry(99, 5, 0)
    tree.insert(lone)
    assert tree.winner() is lone and list(tree.ordered()) == [lone]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "advance"]), st.integers(1, 500)), max_size=80))
def test_the_winner_and_order_are_the_score_order(operations):
    tree = KineticTournament()
    live: list[Entry] = []
    counter = 0
    for i, (op, value) in enumerate(operations):
        if op == "add":
            entry = _entry(i, value, counter)
            tree.insert(entry)
            live.append(entry)
        elif op == "remove" and live:
            tree.remove(live.pop(value % len(live)))
        else:
            counter += value
            tree.advance(counter)
        expected = _best_first(live, counter)
        assert tree.winner() is (expected[0] if expected else None)
        assert list(tree.ordered()) == expected
