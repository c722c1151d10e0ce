"""The engine's own reorder of the queue head (vLLM 0.34's cache-aware admission window, allowed with
``default`` only): ``remove_requests(head)`` then one ``prepend_request`` per request of the new order,
inside ``reordering()``. The queue then dispatches the head in the engine's order and the rest as before
(checked against a plain list), and the removal of the head leaves no dead heap entry behind, so
leaving ``reordering()`` has nothing to compact (an O(n) pass per engine step before)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq import QueuedRequest, make_queue
from prefillq.policies.entry import Entry, LazyHeap


@settings(max_examples=150, deadline=None)
@given(size=st.integers(2, 60), window=st.integers(2, 70), churn=st.lists(st.integers(0, 59), max_size=10),
       data=st.data())
def test_a_window_reorder_orders_the_head_as_the_engine_says_and_leaves_nothing_to_compact(size, window, churn,
                                                                                          data):
    queue = make_queue("default")
    reference = []  # the queue's order as a plain list, as vLLM's deque would hold it
    for index in range(size):
        request = QueuedRequest(f"r{index}", prompt_tokens=16 + index)
        queue.add_request(request)
        reference.append(request)
    for position in churn:  # earlier aborts: dead entries anywhere in the heap
        if position < len(reference) and len(reference) > 2:
            queue.remove_request(reference.pop(position))
    head = list(itertools.islice(queue, window))
    assert head == reference[:len(head)]
    new_order = data.draw(st.permutations(head))

    compacted: list[tuple[int, int]] = []
    original = LazyHeap.compact

    def spy(heap: LazyHeap) -> None:
        compacted.append((len(heap._items), heap.live))
        original(heap)

    LazyHeap.compact = spy
    try:
        with queue.reordering():
            queue.remove_requests(head)
            for request in reversed(new_order):
                queue.prepend_request(request)
    finally:
        LazyHeap.compact = original

    reference = list(new_order) + reference[len(head):]
    assert list(queue) == reference
    # the head's removal left no dead entry behind (earlier aborts' ones wait as before): nothing compacted
    assert compacted == []
    popped = [queue.pop_request() for _ in range(len(reference))]
    assert popped == reference


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=400), take=st.integers(0, 450))
def test_a_heap_read_in_order_gives_its_live_entries_sorted_however_far_the_reader_goes(keys, take):
    # past a share of the heap the reader gets the rest from one sort: the same entries, in the same order
    heap = LazyHeap()
    entries = []
    for seq, (priority, dies) in enumerate(keys):
        entry = Entry(object(), f"r{seq}", QueuedRequest(f"r{seq}", 1), seq, seq, 0.0, 0, None)
        heap.push((priority, seq, entry))
        entries.append((priority, seq, entry, dies))
    for _, _, entry, dies in entries:
        if dies:
            entry.alive = False
            heap.discard()
    reference = [entry for _, _, entry, dies in sorted(entries, key=lambda e: e[:2]) if not dies]
    assert list(itertools.islice(heap.ordered(), take)) == reference[:take]


def _twins(policy: str, draw) -> tuple[Any, Any, list[QueuedRequest]]:
    """Two queues fed the same requests (some decodes, some elevated, a few priorities, earlier aborts)."""
    now = [0.0]
    queues = (make_queue(policy, clock=lambda: now[0]), make_queue(policy, clock=lambda: now[0]))
    queued = []
    kinds = ("plain", "later") if draw(st.booleans()) else ("plain", "plain", "decode", "elevated", "later")
    for index in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(kinds))
        request = QueuedRequest(f"r{index}", prompt_tokens=draw(st.integers(1, 5000)),
                                is_decode=kind == "decode", priority={"elevated": -1, "later": 2}.get(kind, 0))
        now[0] += 0.5
        for queue in queues:
            queue.add_request(request)
        queued.append(request)
    for position in draw(st.lists(st.integers(0, 39), max_size=5)):  # aborts: dead entries in the heaps
        if position < len(queued):
            gone = queued.pop(position)
            for queue in queues:
                queue.remove_request(gone)
    if queued and draw(st.booleans()):  # a step that popped one and put it back: its pop is undone
        for queue in queues:
            queue.prepend_request(queue.pop_request())
        queued = list(queues[0])
    return queues, queued


@settings(max_examples=300, deadline=None)
@given(policy=st.sampled_from(("default", "hrrn", "promote_shortest", "short_request_first", "auto")),
       shape=st.sampled_from(("head", "head", "anywhere", "subset", "stranger")), data=st.data())
def test_move_to_front_leaves_the_state_the_calls_one_by_one_leave(policy, shape, data):
    (fast, slow), queued = _twins(policy, data.draw)
    order = list(fast)
    assert order == list(slow)
    if shape == "head":  # vLLM 0.34's window: the first W in dispatch order, back in a new order
        # a few of a long queue (fresh entries pushed) or a large share (one rebuild)
        removed = order[:data.draw(st.one_of(st.integers(0, 4), st.integers(0, len(order))))]
    else:
        removed = data.draw(st.lists(st.sampled_from(queued), unique_by=id)) if queued else []
    prepended = list(data.draw(st.permutations(removed)))
    if shape == "subset" and prepended:
        prepended.pop(data.draw(st.integers(0, len(prepended) - 1)))  # not a permutation: one stays out
    if shape == "stranger":
        prepended.append(QueuedRequest("stranger", prompt_tokens=7))  # a request that was never queued
    fast.move_to_front(removed, prepended)
    with slow.reordering():
        slow.remove_requests(removed)
        for request in prepended:
            slow.prepend_request(request)
    assert list(fast) == list(slow)
    assert fast.stats() == slow.stats()
    late = QueuedRequest("late", prompt_tokens=3)
    # what comes after sees the same queue: new arrivals, a preempted request coming back, the pops
    for queue in (fast, slow):
        queue.add_request(late)
        if queue:
            queue.prepend_request(queue.pop_request())
            queue.on_prefill_submitted(0)
            back = queue.pop_request()
            queue.on_prefill_submitted(100)
            queue.prepend_request(back)
    assert fast.stats() == slow.stats()
    assert [fast.pop_request() for _ in range(len(fast))] == [slow.pop_request() for _ in range(len(slow))]


def test_default_moves_a_window_of_waiting_requests_in_one_pass_reusing_their_entries():
    queue = make_queue("default")
    requests = [QueuedRequest(f"r{index}", prompt_tokens=16) for index in range(6)]
    for request in requests:
        queue.add_request(request)
    before = {key: id(entry) for key, entry in queue._entries.items()}
    calls = []
    queue.prepend_request = lambda request: calls.append(request)  # the calls one by one would land here
    queue.move_to_front(requests[:4], [requests[2], requests[0], requests[3], requests[1]])
    assert calls == []
    assert {key: id(entry) for key, entry in queue._entries.items()} == before
    assert [r.request_id for r in queue] == ["r1", "r3", "r0", "r2", "r4", "r5"]


@settings(max_examples=100, deadline=None)
@given(size=st.integers(17, 80), count=st.integers(2, 4), priorities=st.lists(st.sampled_from([0, 0, 2]), min_size=80,
                                                                             max_size=80), data=st.data())
def test_a_few_requests_of_a_long_queue_move_as_the_calls_one_by_one_would(size, count, priorities, data):
    # a window of a few requests of a long default queue: fresh entries pushed in, not a rebuild
    queues = (make_queue("default", clock=lambda: 0.0), make_queue("default", clock=lambda: 0.0))
    for index in range(size):
        request = QueuedRequest(f"r{index}", prompt_tokens=16, priority=priorities[index])
        for queue in queues:
            queue.add_request(request)
    head = list(itertools.islice(queues[0], count))
    prepended = list(data.draw(st.permutations(head)))
    fast, slow = queues
    fast.move_to_front(head, prepended)
    with slow.reordering():
        slow.remove_requests(head)
        for request in prepended:
            slow.prepend_request(request)
    assert list(fast) == list(slow) and fast.stats() == slow.stats()
    assert [fast.pop_request() for _ in range(size)] == [slow.pop_request() for _ in range(size)]


@settings(max_examples=150, deadline=None)
@given(policy=st.sampled_from(("default", "hrrn", "promote_shortest", "short_request_first", "auto")),
       peek=st.booleans(), data=st.data())
def test_the_whole_queue_at_once_is_its_dispatch_order(policy, peek, data):
    (queue, _), _ = _twins(policy, data.draw)
    if peek and queue:
        queue.peek_request()  # a pinned head comes first
    assert queue.in_order() == list(queue)
