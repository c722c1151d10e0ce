"""An opt-in Prometheus endpoint for a prefillq queue inside a serving engine's process.

Turned on by the ``metrics_port`` configuration key; vLLM's scheduler plug-in
(:mod:`prefillq.integrations.vllm`) starts it in its EngineCore process. This module does not import
vLLM, and imports ``prometheus_client`` (a vLLM dependency) only when an exporter is built.

Nothing is counted twice: at scrape time a collector reads the queue's own :meth:`PolicyQueue.stats`
and the two partial-prefill counters of :class:`PartialPrefillCounters`, which the scheduler increments
(plain integers: no lock and no Prometheus object on the scheduling path). Scrapes run in the exporter's
thread while the engine thread keeps scheduling, so a read that races a change of the queue is retried,
and counters never go down between scrapes (a pop the engine undoes within its step is not a dispatch,
SPEC §3.0, and may be seen for a moment).

One port per engine process: data-parallel engines started by one vLLM command share their
configuration, so engine ``i`` (its local data-parallel rank) listens on ``metrics_port + i``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("prefillq")

PREFIX = "prefillq_"
STATS_RETRIES = 20


@dataclass(slots=True)
class PartialPrefillCounters:
    """What ``partial_prefills: "ordered"`` changed; the scheduler adds to these as it schedules.

    ``deferred``: running partial prefills (requests part-way through their prompt) that a step gave
    fewer tokens than vLLM's own order would have, one per request per step, because a waiting request
    the policy ranks ahead of them took the budget. ``tokens_yielded``: the prefill tokens they gave up.
    Both stay 0 under ``partial_prefills: "first"`` (vLLM's order: running requests first).
    """

    deferred: int = 0
    tokens_yielded: int = 0

    def record(self, requests: int, tokens: int) -> None:
        """Add one step's deferrals: ``requests`` partial prefills deferred, ``tokens`` tokens given up."""
        self.deferred += requests
        self.tokens_yielded += tokens


class MetricsError(RuntimeError):
    """The metrics endpoint cannot start (its port is taken); the message says what to change."""


# (stats key, metric name without the prefix, HELP text); counters are read from monotonic stats keys.
QUEUE_COUNTERS = (
    ("steps", "scheduler_steps", "Scheduling steps the queue has seen end."),
    ("processed_prefill_tokens", "prefill_tokens",
     "Prefill tokens the engine submitted for execution (all requests, running and new)."),
    ("prepends", "requeued_requests",
     "Requests put back at the front of the queue after leaving it in an earlier step (preempted)."),
)
POLICY_COUNTERS = (  # present only for the policy whose stats carry the key
    ("aged_long_promotions", "aged_long_promotions",
     "short_request_first: long requests dispatched ahead of waiting short ones (aged past long_max_wait_ms)."),
    ("degradation_warnings", "degradation_warnings",
     "short_request_first: warnings that aged-long promotions ran in a streak (threshold likely too small)."),
    ("promotions", "promotions", "promote_shortest: shortest requests moved ahead of the queue's head."),
)
POLICY_GAUGES = (
    ("degradation_streak", "degradation_streak",
     "short_request_first: consecutive aged-long promotions while short requests waited (now)."),
)


class QueueCollector:
    """A Prometheus collector over one queue and the scheduler's partial-prefill counters."""

    def __init__(self, queue: Any, counters: PartialPrefillCounters | None = None) -> None:
        self.queue = queue
        self.counters = counters if counters is not None else PartialPrefillCounters()
        self._floor: dict[tuple[str, str], float] = {}  # the last value exported for each counter sample

    def snapshot(self) -> dict[str, Any]:
        """The queue's ``stats()``, retried while the engine thread changes the queue under the read."""
        for _ in range(STATS_RETRIES):
            try:
                return self.queue.stats()
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        return self.queue.stats()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        stats = self.snapshot()
        yield InfoMetricFamily(PREFIX + "policy", "The prefill-queue policy this engine runs.",
                               value={"policy": str(stats["policy"])})
        yield self._lanes(GaugeMetricFamily(PREFIX + "waiting_requests",
                          "Requests in the waiting queue, by lane (short_request_first: immediate, short, long; "
                          "other policies: queue; decode and priority when present).", labels=["lane"]),
                          stats["lanes"])
        yield self._lanes(GaugeMetricFamily(PREFIX + "longest_wait_seconds",
                          "Longest time a request now waiting has been in the queue, by lane.", labels=["lane"]),
                          stats["longest_wait_s"])
        yield self._lanes(CounterMetricFamily(PREFIX + "dispatched_requests",
                          "Requests dispatched from the waiting queue (scheduled), by lane.", labels=["lane"]),
                          stats["dispatched"], counter="dispatched_requests")
        for key, name, help_text in QUEUE_COUNTERS:
            yield self._counter(CounterMetricFamily, name, help_text, stats[key])
        for key, name, help_text in POLICY_COUNTERS:
            if key in stats:
                yield self._counter(CounterMetricFamily, name, help_text, stats[key])
        for key, name, help_text in POLICY_GAUGES:
            if key in stats:
                yield GaugeMetricFamily(PREFIX + name, help_text, value=stats[key])
        yield self._counter(CounterMetricFamily, "partial_prefills_deferred",
                            "Running partial prefills given fewer tokens in a step because a waiting request "
                            "ranked ahead of them took the budget (partial_prefills=ordered), one per request "
                            "per step.", self.counters.deferred)
        yield self._counter(CounterMetricFamily, "partial_prefill_tokens_yielded",
                            "Prefill tokens running partial prefills gave up to waiting requests ranked ahead "
                            "of them (partial_prefills=ordered).", self.counters.tokens_yielded)

    def _lanes(self, metric: Any, values: dict[str, float], counter: str = "") -> Any:
        """``metric`` with one sample per lane; a ``counter`` (its name) never goes down between scrapes."""
        if counter:  # a lane exported once stays, even when an undone pop takes it out of the stats
            values = {**{lane: 0 for name, lane in self._floor if name == counter}, **values}
        for lane, value in sorted(values.items()):
            metric.add_metric([lane], self._monotonic(counter, lane, value) if counter else value)
        return metric

    def _counter(self, family: Any, name: str, help_text: str, value: float) -> Any:
        return family(PREFIX + name, help_text, value=self._monotonic(name, "", value))

    def _monotonic(self, name: str, label: str, value: float) -> float:
        floor = max(self._floor.get((name, label), 0.0), float(value))
        self._floor[(name, label)] = floor
        return floor


@dataclass
class MetricsExporter:
    """A running endpoint: ``http://<host>:<port>/metrics``; :meth:`close` stops it."""

    port: int
    collector: QueueCollector
    server: Any
    thread: Any

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_exporter(port: int, queue: Any, counters: PartialPrefillCounters | None = None, *,
                   addr: str = "0.0.0.0") -> MetricsExporter:
    """Serve the queue's metrics on ``addr:port`` from a daemon thread; :class:`MetricsError` if the port is taken."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    collector = QueueCollector(queue, counters)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise MetricsError(f"metrics_port {port} cannot be used ({exc.strerror or exc}): another process on "
                           "this host listens there (another engine? each engine needs its own port); "
                           "choose a free port or remove metrics_port") from None
    logger.info("prefillq: Prometheus metrics on http://%s:%d/metrics", addr, port)
    return MetricsExporter(port, collector, server, thread)
