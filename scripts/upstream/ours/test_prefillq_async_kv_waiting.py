"""prefillq with vLLM 0.34's ``async_kv_waiting`` queue (run by scripts/vllm_upstream_tests.py, ours only).

With ``--max-num-inflight-kv-loads``, vLLM keeps requests that may load their KV asynchronously from a
connector in a queue of its own beside ``waiting`` and takes from whichever head arrived first. prefillq
leaves that queue to vLLM (like ``kv_holding_waiting``) and orders ``waiting``; with ``default`` every
step matches stock vLLM.
"""

from __future__ import annotations

import json

import pytest
from tests.v1.core.utils import create_requests, create_scheduler, mock_kv
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import RequestStatus

from prefillq.integrations import vllm as plugin


def _steps(scheduler_cls: type) -> tuple[list, object]:
    scheduler = create_scheduler(enable_prefix_caching=True, block_size=16, max_num_seqs=2,
                                 use_kv_connector=mock_kv(matched_tokens=32, is_async=True),
                                 scheduler_cls=scheduler_cls)
    scheduler.scheduler_config.max_num_inflight_kv_loads = 1
    scheduler.connector.may_load_async = lambda request: request.request_id.startswith("kv")
    requests = create_requests(num_requests=5, num_tokens=48, block_size=16, max_tokens=2,
                               req_ids=["w0", "kv1", "w2", "kv3", "w4"])
    for request in requests:
        scheduler.add_request(request)
    seen = [([r.request_id for r in scheduler.waiting], [r.request_id for r in scheduler.async_kv_waiting])]
    for _ in range(12):
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        seen.append((sorted(output.num_scheduled_tokens.items()), [r.request_id for r in scheduler.waiting],
                     [r.request_id for r in scheduler.async_kv_waiting]))
        loaded = {r.request_id for r in scheduler.requests.values() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS}
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, sampled_token_ids=[[1] for _ in ids], logprobs=None, prompt_logprobs_dict={},
            pooler_output=[], kv_connector_output=KVConnectorOutput(finished_recving=loaded)))
    return seen, scheduler


def test_async_kv_waiting_stays_vllm_s_and_steps_match_stock() -> None:
    stock, _ = _steps(plugin._VllmScheduler)
    ours, scheduler = _steps(plugin.Scheduler)
    assert ours[0] == (["w0", "w2", "w4"], ["kv1", "kv3"])  # the connector's requests are not in our queue
    assert isinstance(scheduler.waiting, plugin.PolicyQueue)
    assert not isinstance(scheduler.async_kv_waiting, plugin.PolicyQueue)
    assert ours == stock
    scheduled = {request_id for step in ours[1:] for request_id, _ in step[0]}
    assert scheduled == {"w0", "kv1", "w2", "kv3", "w4"}  # every request ran, from both queues


@pytest.mark.parametrize("partial_prefills", ["first", "ordered"])
@pytest.mark.parametrize("policy", ["promote_shortest", "hrrn", "short_request_first", "auto"])
def test_every_policy_leaves_async_kv_waiting_to_vllm_and_runs_every_request(
        policy: str, partial_prefills: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every policy × mode: the connector's queue keeps vLLM's own order and every request runs, as in stock."""
    monkeypatch.setenv("PREFILLQ_CONFIG", json.dumps({"policy": policy, "partial_prefills": partial_prefills,
                                                      "stats_interval_s": 0}))
    stock, _ = _steps(plugin._VllmScheduler)
    ours, scheduler = _steps(plugin.Scheduler)
    assert scheduler.waiting.policy == policy
    assert ours[0][1] == stock[0][1] == ["kv1", "kv3"]
    for step_ours, step_stock in zip(ours[1:], stock[1:], strict=True):
        kv_ours, kv_stock = step_ours[2], step_stock[2]
        assert kv_ours == [r for r in kv_stock if r in kv_ours]  # its order is vLLM's (never reordered)
    scheduled = {request_id for step in ours[1:] for request_id, _ in step[0]}
    assert scheduled == {"w0", "kv1", "w2", "kv3", "w4"}
    assert sum(total for step in ours[1:] for _, total in step[0]) == \
        sum(total for step in stock[1:] for _, total in step[0])  # the same work, none lost or repeated
