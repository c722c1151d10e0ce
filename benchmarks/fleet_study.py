"""The measured answers of docs/fleet.md: does a prefill-queue policy pay off at fleet scale, with which
router, and should short-first live in the gateway, the engines, or both?

Two studies, each a set of sweeps (``prefillq.sweep``), on the Azure traces (../shared/data/traces/,
replayed faster with a rate scale so that several replicas are as loaded as one engine at a
fraction of it) and on the scenario workloads:

* **routers**: policies x routers on 4 replicas, next to 1 replica at a quarter of the rate;
* **gateway**: short-first (strict ``short_request_first`` at the workload's split) in the engines
  only, in the gateway only, or both (and a FCFS gateway, to separate the in-flight cap from the
  ordering), for several in-flight limits, behind ``least_outstanding_tokens``.

    python benchmarks/fleet_study.py [--jobs 2] [--duration 1200] [--out benchmarks/results/fleet_study.json]

Prints one markdown table per study and workload and writes every row as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from prefillq.sweep import SweepGrid, make_executor, run_sweep

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
ROUTER_NAMES = ("round_robin", "least_outstanding_tokens", "prefix_affinity")
SRF_STRICT = "short_request_first:threshold=%d"
SRF_AGED = "short_request_first:threshold=%d,long_max_wait_ms=2000"


def workloads(duration_s: float) -> dict[str, dict]:
    """name -> the grid settings for one replica ("one") and for four ("fleet", four times the traffic),
    the rate scales of each, and the short-first threshold (the trace's split, tune's choice)."""
    conv = {"trace": str(TRACES / "azure-2023-conv.csv"), "duration_s": duration_s}
    code = {"trace": str(TRACES / "azure-2023-code.csv"), "duration_s": duration_s}
    return {
        # traces: four replicas at 4x the rate scale of one
        "azure-conv": {"one": conv, "fleet": conv, "rates_one": (4.0, 6.0, 7.0), "rates": (16.0, 24.0, 28.0),
                       "threshold": 512},
        "azure-code": {"one": code, "fleet": code, "rates_one": (4.0, 6.0, 8.0), "rates": (16.0, 24.0, 32.0),
                       "threshold": 3072},
        # scenarios: four times the request rate for four replicas, same duration (~0.85 load per replica)
        "sustained": {"one": {"scenario": "sustained", "overrides": {"rate": 20.0, "duration_s": 30.0}},
                      "fleet": {"scenario": "sustained", "overrides": {"rate": 80.0, "duration_s": 30.0}},
                      "rates_one": (1.0,), "rates": (1.0,), "threshold": 512},
        "long-then-stream": {"one": {"scenario": "long-then-stream"},
                             "fleet": {"scenario": "long-then-stream",
                                       "overrides": {"leading_long": 64, "rate": 480.0}},
                             "rates_one": (1.0,), "rates": (1.0,), "threshold": 512},
    }


def policies(threshold: int) -> tuple[str, ...]:
    return ("default", "promote_shortest", "hrrn", SRF_STRICT % threshold, SRF_AGED % threshold)


def router_study(executor, name: str, spec: dict) -> list[dict]:
    rows = []
    one = SweepGrid(**spec["one"], policies=policies(spec["threshold"]), replicas=(1,), rate_scales=spec["rates_one"])
    for row in run_sweep(one, executor).rows:
        rows.append({"workload": name, **row, "router": "(1 replica, 1/4 of the traffic)"})
    for router in ROUTER_NAMES:
        grid = SweepGrid(**spec["fleet"], policies=policies(spec["threshold"]), replicas=(4,),
                         rate_scales=spec["rates"], router=router)
        rows.extend({"workload": name, **row} for row in run_sweep(grid, executor).rows)
    return rows


def gateway_study(executor, name: str, spec: dict, limits: tuple[int, ...]) -> list[dict]:
    srf = SRF_STRICT % spec["threshold"]
    rows = []
    common = {**spec["fleet"], "replicas": (4,), "rate_scales": spec["rates"][1:] or spec["rates"],
              "router": "least_outstanding_tokens"}
    for engine in ("default", srf):
        rows.extend({"workload": name, "placement": "engines" if engine != "default" else "none", **row}
                    for row in run_sweep(SweepGrid(**common, policies=(engine,)), executor).rows)
    for limit in limits:
        for gateway, engine, placement in (("default", "default", "FCFS gateway (cap only)"),
                                           (srf, "default", "gateway"), (srf, srf, "both")):
            grid = SweepGrid(**common, policies=(engine,), gateway_policy=gateway, max_inflight_per_replica=limit)
            rows.extend({"workload": name, "placement": placement, **row} for row in run_sweep(grid, executor).rows)
    return rows


def _label(policy: str) -> str:
    if policy.startswith("short_request_first:"):
        return "srf (aged 2 s)" if "long_max_wait_ms" in policy else "srf (strict)"
    return policy


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,.0f}" if isinstance(value, float) and abs(value) >= 10 else (
        f"{value:.2f}" if isinstance(value, float) else str(value))


def print_tables(router_rows: list[dict], gateway_rows: list[dict]) -> None:
    for workload in dict.fromkeys(row["workload"] for row in router_rows):
        print(f"\n### routers: {workload}\n")
        print("| router | rate scale | policy | short TTFT p50 / p95 ms | long TTFT p95 ms | out tok/s | imbalance |")
        print("|---|---|---|---|---|---|---|")
        for row in (r for r in router_rows if r["workload"] == workload):
            print(f"| {row['router']} | {row['rate_scale']:g} | {_label(row['policy'])} | "
                  f"{_fmt(row['short_ttft_p50_ms'])} / {_fmt(row['short_ttft_p95_ms'])} | "
                  f"{_fmt(row['long_ttft_p95_ms'])} | {_fmt(row['output_tokens_per_s'])} | "
                  f"{_fmt(row['token_imbalance'])} |")
    for workload in dict.fromkeys(row["workload"] for row in gateway_rows):
        print(f"\n### gateway vs engines: {workload}\n")
        print("| short-first in | in-flight cap | rate scale | short TTFT p50 / p95 ms | long TTFT p95 ms | "
              "out tok/s | gateway wait p95 ms |")
        print("|---|---|---|---|---|---|---|")
        for row in (r for r in gateway_rows if r["workload"] == workload):
            print(f"| {row['placement']} | {row['max_inflight_per_replica'] or '-'} | {row['rate_scale']:g} | "
                  f"{_fmt(row['short_ttft_p50_ms'])} / {_fmt(row['short_ttft_p95_ms'])} | "
                  f"{_fmt(row['long_ttft_p95_ms'])} | {_fmt(row['output_tokens_per_s'])} | "
                  f"{_fmt(row['gateway_wait_p95_ms'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of each trace")
    parser.add_argument("--limits", default="64,128,256", help="gateway in-flight caps per replica")
    parser.add_argument("--workloads", default="azure-conv,azure-code,sustained,long-then-stream")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fleet_study.json"))
    args = parser.parse_args()
    chosen = {name: spec for name, spec in workloads(args.duration).items() if name in args.workloads.split(",")}
    limits = tuple(int(limit) for limit in args.limits.split(","))
    logging.getLogger("prefillq").setLevel(logging.ERROR)  # the policies' runtime warnings, once per run
    start = time.perf_counter()
    router_rows: list[dict] = []
    gateway_rows: list[dict] = []
    with make_executor("process", jobs=args.jobs) as executor:
        for name, spec in chosen.items():
            router_rows.extend(router_study(executor, name, spec))
            gateway_rows.extend(gateway_study(executor, name, spec, limits))
    print_tables(router_rows, gateway_rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"duration_s": args.duration, "limits": limits, "routers": router_rows,
                                    "gateway": gateway_rows, "wall_s": time.perf_counter() - start}, indent=1) + "\n")
    print(f"\nwrote {args.out} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
