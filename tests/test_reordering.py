"""The engine's own reorder of the queue head (vLLM 0.34's cache-aware admission window, allowed with
``default`` only): ``remove_requests(head)`` then one ``prepend_request`` per request of the new order,
inside ``reordering()``. The queue then dispatches the head in the engine's order and the rest as before
(checked against a plain list), and the removal of the head leaves no dead heap entry behind, so
leaving ``reordering()`` has nothing to compact (an O(n) pass per engine step before)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq import QueuedRequest, make_queue
from prefillq.policies.entry import LazyHeap


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
