"""The LightLLM-like engine mode: the policy ranks the ready list every step, a lone request included."""

from __future__ import annotations

from prefillq.sim import simulate

from .test_sim_engine import profile, workload


def chunk_schedule(result) -> list[list[tuple[str, int]]]:
    return [step.prefill_chunks for step in result.node.steps]


def test_hrrn_binds_a_lone_requests_arrival_counter_when_it_is_first_ranked():
    # SPEC HRRN: a request's arrival counter and frozen cost are bound when the queue first sees it.
    # A (4096 tokens) is alone in step 0, so it is seen with counter 0 and cost 4096; B (2500 tokens)
    # is seen in step 1 with counter 1024. Budget = chunk = 1024; the walk orders by
    # (counter - arrival) / cost, higher first:
    #   step 1, counter 1024: A 1024/4096 > B 0            -> A
    #   step 2, counter 2048: A 2048/4096 = .50 > B 1024/2500 = .41 -> A
    #   step 3, counter 3072: A .75 < B 2048/2500 = .82      -> B, and B stays ahead (steps 4, 5);
    #   step 5: B's last 452 tokens, A's 1024-token chunk does not fit the rest (skipped); step 6: A.
    # Bound late (at step 1: counter 1024, cost 3072), A would lose step 2 to B (1024/3072 < 1024/2500).
    w = workload(("A", 0.0, 4096, 1), ("B", 0.001, 2500, 1))
    res = simulate(w, "hrrn", profile=profile(c0=0.01, c1=1e-5), budget=1024, mode="lightllm", record_steps=True)
    assert chunk_schedule(res) == [[("A", 1024)], [("A", 1024)], [("A", 1024)], [("B", 1024)], [("B", 1024)],
                                   [("B", 452)], [("A", 1024)]]

