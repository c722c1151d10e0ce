"""Queue rules that keep a policy no worse than the engine's own (SPEC §4.1), on the bare queues.

* A request that comes back after streaming output (preempted mid-stream) goes first under every policy.
* A popped request is remembered (arrival, token-aged deadline, frozen cost) until the engine forgets it,
  with no limit on how many when the engine says when it is done (the vLLM plug-in does).
* Reading the head of a queue costs what the head costs (vLLM 0.34's admission window reads it with
  ``islice``): iteration is lazy.
"""

from __future__ import annotations

import itertools

import pytest

from prefillq.config import PolicyConfig
from prefillq.policies import make_queue
from prefillq.policies.auto import GRACE_TOKENS, SLOWDOWN
from prefillq.requests import QueuedRequest

POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")


def _queue(policy: str):
    return make_queue(PolicyConfig(policy=policy, stats_interval_s=0), clock=lambda: 0.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_back_after_streaming_output_goes_first_under_every_policy(policy: str) -> None:
    """Stock vLLM puts a preempted request back at the head of its queue; its user watches a stalled
    stream. Six newer short prompts wait; it had streamed 17 tokens of a 2,000-token prompt."""
    queue = _queue(policy)
    long = QueuedRequest("long", 2000)
    queue.add_request(long)
    assert queue.pop_request() is long
    queue.on_prefill_submitted(2000)
    for i in range(6):
        queue.add_request(QueuedRequest(f"s{i}", 10))
    queue.on_prefill_submitted(0)
    back = QueuedRequest("long", 2016, output_tokens=17, resumed=True)  # recompute: prompt + output - 1
    queue.prepend_request(back)
    assert next(iter(queue)) is back
    assert queue.peek_request() is back and queue.pop_request() is back


def test_requests_back_after_output_keep_the_order_they_came_back_in() -> None:
    queue = _queue("auto")
    for name in ("a", "b"):
        queue.add_request(QueuedRequest(name, 500))
    first, second = queue.pop_request(), queue.pop_request()
    queue.add_request(QueuedRequest("short", 5))
    queue.on_prefill_submitted(1000)
    queue.prepend_request(QueuedRequest(second.request_id, 520, output_tokens=20, resumed=True))
    queue.prepend_request(QueuedRequest(first.request_id, 510, output_tokens=10, resumed=True))
    assert [r.request_id for r in queue] == [first.request_id, second.request_id, "short"]


def _preempt_after(queue, others: int) -> str:
    """Pop a 100-token request, then ``others`` requests each added and popped, then prepend the first
    (preempted, no output) beside a fresh 1-token request; which one dispatches first."""
    queue.add_request(QueuedRequest("old", 100))
    assert queue.pop_request().request_id == "old"
    for i in range(others):
        queue.add_request(QueuedRequest(f"r{i}", 1))
        queue.pop_request()
    queue.on_prefill_submitted(SLOWDOWN * 100 + GRACE_TOKENS)  # the old request's deadline has passed
    queue.add_request(QueuedRequest("new", 1))
    queue.prepend_request(QueuedRequest("old", 100, resumed=True))
    return queue.pop_request().request_id


def test_the_deadline_survives_any_number_of_other_requests_when_nothing_is_forgotten_by_count() -> None:
    """auto's bound: a request past its deadline goes before every request that arrived after it. Before
    the fix a table of 65,536 memories dropped the oldest: after 70,000 others the request came back with a
    fresh deadline and the 1-token newcomer went first."""
    queue = _queue("auto")
    queue.memory_limit = None  # what the vLLM plug-in sets: it forgets each request when vLLM frees it
    assert _preempt_after(queue, 70_000) == "old"


def test_a_forgotten_request_comes_back_as_new() -> None:
    queue = _queue("auto")
    queue.add_request(QueuedRequest("old", 100))
    request = queue.pop_request()
    queue.forget_request(request)  # the engine finished it; an id reused later is a new request
    queue.on_prefill_submitted(SLOWDOWN * 100 + GRACE_TOKENS)
    queue.add_request(QueuedRequest("new", 1))
    queue.prepend_request(QueuedRequest("old", 100, resumed=True))
    assert queue.pop_request().request_id == "new"


@pytest.mark.parametrize("policy", POLICIES)
def test_reading_the_head_does_not_order_the_whole_queue(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = _queue(policy)
    for i in range(50):
        queue.add_request(QueuedRequest(f"r{i}", 1 + (i * 37) % 300))
    expected = []
    for _ in range(5):  # the order pops would take: peek, then the rest in dispatch order
        expected.append(queue.pop_request())
    for request in reversed(expected):
        queue.prepend_request(request)
    queue.on_prefill_submitted(0)
    full = list(queue)

    def whole_queue(*_: object) -> None:
        raise AssertionError("iteration sorted the whole queue")

    monkeypatch.setattr(type(queue), "_rest_order", whole_queue)
    monkeypatch.setattr(type(queue), "_dispatch_order", whole_queue)
    assert list(itertools.islice(iter(queue), 5)) == full[:5]
    assert list(queue) == full
