"""The never-worse matrix (issue 27): every policy x partial-prefill mode on the installed vLLM release.

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=src:scripts/upstream:. python benchmarks/engine_matrix.py --streams 40

Runs random request streams (the differential checker's generator: arrivals, aborts, prefix hits, tight
KV caches with preemption, LoRA adapters, throttled steps, sync and async scheduling) through the real
scheduler with no model, per configuration, and counts per release x policy x mode: streams, streams
that broke one of vLLM's invariants (a request lost, duplicated, with wrong tokens; a step over the
budget or the seats; an aborted request scheduled; KV blocks not freed; no progress), and steps that left
budget idle while a capped partial prefill could have used it. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")


def broken(stream: Any, run: Any) -> bool:
    from tests.integration.differential import expected_tokens

    if run.livelock or run.over_budget or run.over_seats or run.scheduled_after_abort:
        return True
    if run.unfinished_at_end or run.free_blocks_at_end != run.total_blocks:
        return True
    for request in stream.requests:
        reasons = run.finished.get(request.request_id, [])
        if request.abort_step is None and (reasons != ["length"] or
                                           run.tokens.get(request.request_id) != expected_tokens(request)):
            return True
        if request.abort_step is not None and len(reasons) > 1:
            return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=40, help="random streams per configuration and scheduling mode")
    parser.add_argument("--json", default="benchmarks/results/engine_matrix.json")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with contextlib.suppress(ImportError):  # 0.34's CPU platform wants a Triton flag set (scripts/upstream)
        import upstream_env  # noqa: F401
    import vllm
    from tests.integration.differential import model_config, random_stream, run_stream

    from prefillq.integrations.tiny_model import make_tiny_model

    base = model_config(str(make_tiny_model(Path("/tmp/prefillq-engine-matrix/tiny-llama"))))
    rows = []
    print(f"vLLM {vllm.__version__}: {args.streams} random streams per configuration, sync and async each")
    print(f"{'policy':<20}{'mode':<9}{'streams':>8}{'breaks':>8}{'idle steps':>12}")
    for policy in POLICIES:
        for mode in ("first", "ordered"):
            streams = breaks = idle = 0
            for async_scheduling in (False, True):
                for seed in range(args.streams):
                    stream = random_stream(seed, async_scheduling)
                    run = run_stream(base, stream, {"policy": policy, "partial_prefills": mode})
                    streams += 1
                    breaks += broken(stream, run)
                    idle += len({cap.step for cap in run.idle_caps})
            rows.append({"release": vllm.__version__, "policy": policy, "mode": mode, "streams": streams,
                         "breaks": breaks, "idle_steps": idle})
            print(f"{policy:<20}{mode:<9}{streams:>8}{breaks:>8}{idle:>12}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if any(r["breaks"] or r["idle_steps"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
