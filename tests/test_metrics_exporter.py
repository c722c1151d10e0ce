"""The Prometheus exporter over a plain PolicyQueue (no vLLM): what each metric family reports."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefillq import QueuedRequest, make_queue
from prefillq.config import ConfigError, PolicyConfig, load_config, resolve_config
from prefillq.integrations.metrics import MetricsError, PartialPrefillCounters, QueueCollector, start_exporter

R = QueuedRequest


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def families(collector: QueueCollector) -> dict[str, Any]:
    return {family.name: family for family in collector.collect()}


def samples(family: Any) -> dict[str, float]:
    """Sample values by lane label ('' for an unlabelled sample); counters' `_total` samples only."""
    return {s.labels.get("lane", ""): s.value for s in family.samples if not s.name.endswith("_created")}


def srf_queue(clock: FakeClock) -> Any:
    return make_queue({"policy": "srf", "threshold": 256, "long_max_wait_ms": 1000, "stats_interval_s": 0},
                      clock=clock)


def test_srf_lanes_dispatches_promotions_and_warnings() -> None:
    clock = FakeClock()
    queue = srf_queue(clock)
    for i in range(3):
        queue.add_request(R(f"long-{i}", 4000))
    clock.now += 0.5
    for i in range(2):
        queue.add_request(R(f"short-{i}", 100))
    queue.add_request(R("resumed", 3000, resumed=True))
    counters = PartialPrefillCounters()
    collector = QueueCollector(queue, counters)

    found = families(collector)
    assert samples(found["prefillq_waiting_requests"]) == {"immediate": 1, "short": 2, "long": 3}
    assert samples(found["prefillq_longest_wait_seconds"])["long"] == pytest.approx(0.5)
    assert samples(found["prefillq_dispatched_requests"]) == {}
    assert found["prefillq_policy"].samples[0].labels == {"policy": "short_request_first"}

    queue.pop_request()                       # the resumed request: the immediate lane
    queue.on_prefill_submitted(3000)
    clock.now += 2.0                          # every long head has now waited past long_max_wait_ms
    for _ in range(3):                        # three aged-long promotions in a row while shorts wait
        queue.pop_request()
    queue.on_prefill_submitted(12000)
    queue.pop_request()
    counters.record(2, 700)

    found = families(collector)
    assert samples(found["prefillq_waiting_requests"]) == {"immediate": 0, "short": 1, "long": 0}
    assert samples(found["prefillq_dispatched_requests"]) == {"immediate": 1, "long": 3, "short": 1}
    assert samples(found["prefillq_aged_long_promotions"]) == {"": 3}
    assert samples(found["prefillq_degradation_warnings"]) == {"": 1}
    assert samples(found["prefillq_degradation_streak"]) == {"": 0}  # the short dispatch ended the streak
    assert samples(found["prefillq_scheduler_steps"]) == {"": 2}
    assert samples(found["prefillq_prefill_tokens"]) == {"": 15000}
    assert samples(found["prefillq_partial_prefills_deferred"]) == {"": 2}
    assert samples(found["prefillq_partial_prefill_tokens_yielded"]) == {"": 700}
    assert found["prefillq_dispatched_requests"].type == "counter"
    assert found["prefillq_waiting_requests"].type == "gauge"


def test_other_policies_report_the_total_and_only_their_own_counters() -> None:
    queue = make_queue({"policy": "hrrn", "stats_interval_s": 0})
    for i in range(4):
        queue.add_request(R(f"r{i}", 100 * (i + 1)))
    queue.pop_request()
    found = families(QueueCollector(queue))
    assert samples(found["prefillq_waiting_requests"]) == {"queue": 3}
    assert samples(found["prefillq_dispatched_requests"]) == {"queue": 1}
    assert not {"prefillq_aged_long_promotions", "prefillq_degradation_warnings", "prefillq_promotions"} & set(found)
    assert samples(found["prefillq_partial_prefills_deferred"]) == {"": 0}

    shortest = make_queue({"policy": "promote_shortest", "stats_interval_s": 0})
    for request in (R("long", 5000), R("short", 10)):
        shortest.add_request(request)
    assert shortest.pop_request().request_id == "short"
    assert samples(families(QueueCollector(shortest))["prefillq_promotions"]) == {"": 1}


def test_counters_never_go_down_when_a_pop_is_undone_in_its_step() -> None:
    queue = make_queue({"policy": "default", "stats_interval_s": 0})
    queue.add_request(R("a", 100))
    collector = QueueCollector(queue)
    request = queue.pop_request()
    assert samples(families(collector)["prefillq_dispatched_requests"]) == {"queue": 1}
    queue.prepend_request(request)            # popped and back in the same step: not a dispatch
    assert queue.stats()["dispatched"] == {}
    assert samples(families(collector)["prefillq_dispatched_requests"]) == {"queue": 1}
    assert samples(families(collector)["prefillq_waiting_requests"]) == {"queue": 1}  # gauges follow the queue


def test_a_read_racing_the_engine_thread_is_retried() -> None:
    queue = make_queue({"policy": "default", "stats_interval_s": 0})
    queue.add_request(R("a", 100))
    real_stats, failures = queue.stats, [RuntimeError("dictionary changed size during iteration")] * 3

    def flaky_stats() -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return real_stats()

    queue.stats = flaky_stats
    assert samples(families(QueueCollector(queue))["prefillq_waiting_requests"]) == {"queue": 1}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_endpoint_serves_the_text_format_with_help_and_refuses_a_taken_port() -> None:
    queue = make_queue({"policy": "srf", "stats_interval_s": 0})
    queue.add_request(R("s", 10))
    queue.pop_request()
    port = free_port()
    exporter = start_exporter(port, queue, addr="127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
        parsed = {f.name: f for f in text_string_to_metric_families(text)}
        assert "# HELP prefillq_dispatched_requests_total Requests dispatched" in text
        assert [(s.name, s.labels, s.value) for s in parsed["prefillq_dispatched_requests"].samples] == [
            ("prefillq_dispatched_requests_total", {"lane": "short"}, 1.0)]
        assert all(name.startswith("prefillq_") for name in parsed)
        assert all(f.documentation for f in parsed.values())
        with pytest.raises(MetricsError, match=rf"metrics_port {port} cannot be used .*each engine needs its own"):
            start_exporter(port, queue, addr="127.0.0.1")
    finally:
        exporter.close()


@pytest.mark.parametrize("bad", [-1, 65536, "9464", True, 94.64])
def test_metrics_port_must_be_a_port(bad: Any) -> None:
    with pytest.raises(ConfigError, match="metrics_port must be a TCP port 1-65535"):
        load_config({"policy": "srf", "metrics_port": bad})


def test_metrics_port_from_additional_config_and_off_by_default() -> None:
    config, _ = resolve_config({"prefillq": {"policy": "srf", "metrics_port": 9464}}, environ={})
    assert config.metrics_port == 9464
    assert PolicyConfig().metrics_port == 0
    assert load_config({"metrics_port": None}).metrics_port == 0
