"""``hrrn``: token-aged Highest Response Ratio Next (SPEC §3.3).

    score = (P_now - P_at_arrival) / cost,   cost = max(1, prompt_tokens - cached_tokens), frozen

``P`` counts processed prefill tokens and only moves at the end of a step. Each score is a line in
``P`` (slope ``1/cost``), so two requests swap order at most once. A kinetic tournament keeps the
winner current without re-sorting: every internal node stores the winner of its two children and the
first counter value at which the loser overtakes it (its certificate). Advancing the counter repairs
only the nodes whose certificate expired. Comparisons use exact integer arithmetic, so every replica
computes the same order.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from functools import cmp_to_key

from prefillq.policies.base import Entry, PolicyQueue

NEVER = float("inf")


def beats(a: Entry, b: Entry, counter: int) -> bool:
    """True when ``a`` ranks before ``b`` at this counter value (score, then arrival, then id)."""
    left = (counter - a.p_arrival) * b.cost
    right = (counter - b.p_arrival) * a.cost
    if left != right:
        return left > right
    if a.arrival != b.arrival:
        return a.arrival < b.arrival
    return a.key < b.key


def overtake_at(winner: Entry, loser: Entry) -> float:
    """The first integer counter value at which ``loser`` ranks before ``winner`` (or NEVER).

    Only a cheaper request (steeper line) can catch up. With D = c_w - c_l > 0 the loser's score
    exceeds the winner's when P * D > K, K = pa_l * c_w - pa_w * c_l; at P * D == K the tie-break decides.
    """
    slope_gap = winner.cost - loser.cost
    if slope_gap <= 0:
        return NEVER
    k = loser.p_arrival * winner.cost - winner.p_arrival * loser.cost
    loser_wins_tie = (loser.arrival, loser.key) < (winner.arrival, winner.key)
    if loser_wins_tie:
        return -((-k) // slope_gap)  # ceil(k / D)
    return k // slope_gap + 1


class KineticTournament:
    """Winner of a set of HRRN lines at the current counter, with O(log n) insert/remove and O(1) winner."""

    def __init__(self) -> None:
        self.counter = 0
        self._capacity = 1
        self._winner: list[Entry | None] = [None, None]
        self._fails: list[float] = [NEVER, NEVER]      # certificate of each internal node
        self._min_fail: list[float] = [NEVER, NEVER]   # min certificate in the subtree
        self._free: list[int] = [0]
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def winner(self) -> Entry | None:
        return self._winner[1]  # the root (with capacity 1 the root is the only leaf)

    def insert(self, entry: Entry) -> None:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        entry.slot = slot
        node = self._capacity + slot
        self._winner[node] = entry
        self._size += 1
        self._update_path(node >> 1)

    def remove(self, entry: Entry) -> None:
        node = self._capacity + entry.slot
        entry.slot = -1
        self._size -= 1
        if not self._size and self._capacity > 1:
            # empty: back to one leaf, so that a queue of one (the usual state of an engine that keeps up) costs
            # no walk up a tree a burst once grew (the winner never depends on the tree's shape)
            self._capacity = 1
            self._winner = [None, None]
            self._fails = [NEVER, NEVER]
            self._min_fail = [NEVER, NEVER]
            self._free = [0]
            return
        self._winner[node] = None
        self._free.append(node - self._capacity)
        self._update_path(node >> 1)

    def ordered(self) -> Iterator[Entry]:
        """Every entry, best first, lazily: a best-first walk down the tree, O(log n) per entry yielded."""
        counter = self.counter

        class Node:
            __slots__ = ("entry", "node")

            def __init__(self, node: int, entry: Entry) -> None:
                self.node, self.entry = node, entry

            def __lt__(self, other: Node) -> bool:
                return beats(self.entry, other.entry, counter)

        winners = self._winner
        frontier = [Node(1, winners[1])] if winners[1] is not None else []
        while frontier:
            top = heapq.heappop(frontier)
            if top.node >= self._capacity:
                yield top.entry
                continue
            for child in (2 * top.node, 2 * top.node + 1):
                if winners[child] is not None:
                    heapq.heappush(frontier, Node(child, winners[child]))

    def advance(self, counter: int) -> None:
        self.counter = counter
        if self._min_fail[1] <= counter:
            self._repair(1)

    # --- internals --------------------------------------------------------------------------

    def _recompute(self, node: int) -> None:
        winners = self._winner
        left = winners[2 * node]
        right = winners[2 * node + 1]
        if left is None or right is None:
            winners[node] = right if left is None else left
            fail = NEVER
        elif beats(left, right, self.counter):
            winners[node] = left
            fail = overtake_at(left, right)
        else:
            winners[node] = right
            fail = overtake_at(right, left)
        self._fails[node] = fail
        mins = self._min_fail
        low = mins[2 * node]
        high = mins[2 * node + 1]
        if high < low:
            low = high
        mins[node] = fail if fail < low else low

    def _update_path(self, node: int) -> None:
        # _recompute inlined: this loop is the hot path of every add and pop.
        winners, fails, mins, counter = self._winner, self._fails, self._min_fail, self.counter
        while node:
            child = node << 1
            left = winners[child]
            right = winners[child + 1]
            if left is None or right is None:
                winner = right if left is None else left
                fail = NEVER
            else:  # beats() and overtake_at(), inlined
                left_score = (counter - left.p_arrival) * right.cost
                right_score = (counter - right.p_arrival) * left.cost
                if left_score > right_score or (left_score == right_score and (
                        left.arrival < right.arrival or (left.arrival == right.arrival and left.key < right.key))):
                    winner, loser = left, right
                else:
                    winner, loser = right, left
                slope_gap = winner.cost - loser.cost
                if slope_gap <= 0:
                    fail = NEVER
                else:
                    k = loser.p_arrival * winner.cost - winner.p_arrival * loser.cost
                    if loser.arrival < winner.arrival or (loser.arrival == winner.arrival and loser.key < winner.key):
                        fail = -((-k) // slope_gap)
                    else:
                        fail = k // slope_gap + 1
            low = mins[child]
            high = mins[child + 1]
            if high < low:
                low = high
            if fail < low:
                low = fail
            if winner is winners[node] and fail == fails[node] and low == mins[node]:
                return
            winners[node] = winner
            fails[node] = fail
            mins[node] = low
            node >>= 1

    def _repair(self, node: int) -> None:
        if node >= self._capacity:
            return
        counter = self.counter
        if self._min_fail[2 * node] <= counter:
            self._repair(2 * node)
        if self._min_fail[2 * node + 1] <= counter:
            self._repair(2 * node + 1)
        self._recompute(node)

    def _grow(self) -> None:
        old = self._capacity
        capacity = old * 2
        winners: list[Entry | None] = [None] * (2 * capacity)
        winners[capacity:capacity + old] = self._winner[old:2 * old]
        self._winner = winners
        self._fails = [NEVER] * (2 * capacity)
        self._min_fail = [NEVER] * (2 * capacity)
        self._capacity = capacity
        self._free.extend(range(capacity - 1, old - 1, -1))
        for node in range(capacity - 1, 0, -1):
            self._recompute(node)


class HRRNQueue(PolicyQueue):
    policy = "hrrn"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._tournament = KineticTournament()

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        if entry.cost is None:  # bound the first time the request takes part in the ordering, then frozen
            entry.cost = max(1, entry.view.prompt_tokens - entry.view.cached_tokens)
        self._tournament.insert(entry)

    def _delete_rest(self, entry: Entry) -> None:
        self._tournament.remove(entry)

    def _choose_rest(self) -> Entry | None:
        return self._tournament.winner()

    def _partial_lane(self, entry: Entry) -> str:
        if entry.cost is None:  # a partial the queue never ordered: bound now, by what is left
            entry.cost = max(1, entry.view.prompt_tokens - entry.view.cached_tokens)
        return "queue"

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return beats(a, b, self.processed_tokens)

    def _rest_in_order(self) -> Iterator[Entry]:
        return self._tournament.ordered()

    def _on_step(self) -> None:
        self._tournament.advance(self.processed_tokens)

    def _rest_order(self) -> list[Entry]:
        rest = [e for e in self._entries.values() if e.lane == "queue"]
        counter = self.processed_tokens
        rest.sort(key=cmp_to_key(lambda a, b: -1 if beats(a, b, counter) else 1))
        return rest
