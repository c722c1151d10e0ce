"""``prefillq compare`` with replicas, routers and a gateway queue: rows, labels, JSON, and the library call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prefillq.sim.compare import CompareSettings, prepare_comparison
from prefillq.sim.fleet import FleetConfig

SMALL = {"rate": 40.0, "duration_s": 1.0, "long_tokens": 4096}


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "prefillq", "compare", "--scenario", "sustained",
                           *(f"--set={k}={v}" for k, v in SMALL.items()), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_one_replica_behind_any_router_compares_as_one_engine() -> None:
    plain = prepare_comparison(CompareSettings(scenario="sustained", overrides=SMALL)).run()
    for router in ("round_robin", "least_outstanding_tokens", "prefix_affinity"):
        fleet = prepare_comparison(CompareSettings(scenario="sustained", overrides=SMALL,
                                                   fleet=FleetConfig(replicas=1, router=router))).run()
        assert fleet.summaries == plain.summaries


def test_compare_on_replicas_reports_per_replica_load(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = _compare("--policies", "default,hrrn", "--replicas", "3", "--router", "least_outstanding_tokens",
                      "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "3 replicas (least_outstanding_tokens)" in result.stdout
    assert "requests per replica" in result.stdout
    data = json.loads(out.read_text())
    assert data["fleet"]["replicas"] == 3
    stats = data["fleet_stats"]["hrrn"]
    assert sum(replica["requests"] for replica in stats["per_replica"]) == data["policies"]["hrrn"]["completed"]
    assert stats["token_imbalance"] >= 1.0


def test_gateway_engines_or_both_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = _compare("--policies", "default,short_request_first", "--replicas", "2", "--gateway-policy", "none",
                      "--gateway-policy", "short_request_first", "--max-inflight-per-replica", "4",
                      "--json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert list(data["policies"]) == [
        "default | gateway none", "short_request_first | gateway none",
        "default | gateway short_request_first", "short_request_first | gateway short_request_first"]
    assert data["baseline"] == "default | gateway none"
    stats = data["fleet_stats"]
    assert "gateway" not in stats["default | gateway none"]
    assert stats["default | gateway short_request_first"]["gateway"]["policy"] == "short_request_first"
    assert stats["default | gateway short_request_first"]["gateway"]["held"] > 0
