"""prefillq with vLLM 0.34's ``async_kv_waiting`` queue (run by scripts/vllm_upstream_tests.py, ours only).

With ``--max-num-inflight-kv-loads``, vLLM keeps requests that may load their KV asynchronously from a
connector in a queue of its own beside ``waiting`` and takes from whichever head arrived first. prefillq
leaves that queue to vLLM (like ``kv_holding_waiting``) and orders ``waiting``; with ``default`` every
step matches stock vLLM.
"""

from __future__ import annotations

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
