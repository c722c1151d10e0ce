"""prefillq with vLLM 0.34's cache-aware admission window (run by scripts/vllm_upstream_tests.py, ours only).

The window removes waiting requests and prepends them in a new order. With ``default`` prefillq takes
that as a reordering (not preempted requests coming back) and schedules as stock vLLM; with any other
policy the window would override the policy, so the engine refuses to start (SPEC §4.1: no silent change).
"""

from __future__ import annotations

import pytest
from tests.v1.core.utils import create_requests, create_scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus

from prefillq.config import ConfigError
from prefillq.integrations import vllm as plugin


def _warmed(scheduler_cls: type) -> tuple:
    """A scheduler whose prefix cache holds one prompt, and 4 new requests of which one shares it."""
    scheduler = create_scheduler(enable_prefix_caching=True, cache_aware_admission_window=4,
                                 cache_aware_admission_threshold=0, max_num_seqs=2, scheduler_cls=scheduler_cls)
    seed, warm = create_requests(num_requests=2, num_tokens=64, same_prompt=True, req_ids=["seed", "warm"])
    cold = create_requests(num_requests=4, num_tokens=64, req_ids=["x", "cold1", "cold2", "cold3"])[1:]
    scheduler.add_request(seed)
    output = scheduler.schedule()
    scheduler.update_from_output(output, ModelRunnerOutput(req_ids=["seed"], sampled_token_ids=[[0]], logprobs=None,
                                                           prompt_logprobs_dict={}, pooler_output=[]))
    scheduler.finish_requests("seed", RequestStatus.FINISHED_ABORTED)
    return scheduler, [cold[0], cold[1], warm, cold[2]]


def test_window_with_default_schedules_as_stock_and_counts_no_preemption() -> None:
    runs = {}
    for name, cls in (("stock", plugin._VllmScheduler), ("ours", plugin.Scheduler)):
        scheduler, requests = _warmed(cls)
        for request in requests:
            scheduler.add_request(request)
        output = scheduler.schedule()
        runs[name] = ([r.req_id for r in output.scheduled_new_reqs], [r.request_id for r in scheduler.waiting])
        if name == "ours":
            assert scheduler.prefill_queue.stats()["prepends"] == 0
    assert runs["ours"] == runs["stock"]
    assert runs["ours"][0] == ["warm", "cold1"]  # the window did act: the warm request went first


@pytest.mark.parametrize("policy", ["hrrn", "promote_shortest", "short_request_first"])
def test_window_with_an_ordering_policy_is_refused(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFILLQ_CONFIG", policy)
    with pytest.raises(ConfigError, match=rf"cache_aware_admission_window=4 .*override the '{policy}' policy"):
        create_scheduler(enable_prefix_caching=True, cache_aware_admission_window=4, scheduler_cls=plugin.Scheduler)


def test_window_without_prefix_cache_is_inert_and_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFILLQ_CONFIG", "hrrn")  # vLLM turns the window off without a prefix cache
    scheduler = create_scheduler(enable_prefix_caching=False, cache_aware_admission_window=4,
                                 scheduler_cls=plugin.Scheduler)
    assert scheduler.policy_config.policy == "hrrn"
