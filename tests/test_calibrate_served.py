"""Re-fitting a profile on a served engine's step traces (``prefillq.calibrate.served``, ``calibrate --from-bench``).

The folders are built by hand the way ``prefillq bench --launch vllm`` with the step-trace scheduler
writes them, with step times from a known cost model, so the fit must give that model back and the
front-end time must come out as the one put in.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from prefillq.calibrate import COEFFICIENT_NAMES, fit_cost_model
from prefillq.calibrate.served import (
    ServedTraceError,
    fit_frontend,
    frontend_seconds,
    refit_profile,
    served_samples,
)
from prefillq.sim.costs import CostModel, load_profile

TRUE = CostModel(0.003, 2.5e-5, 8e-9, 7e-5, 2e-7)
FRONTEND_S = 0.0031
T0 = 1_800_000_000.0  # wall-clock start of the folder's first run
PERF0 = 500.0          # the engine's perf_counter at T0


def _steps_for_run(rng: random.Random, start_wall: float, requests: int, tag: str) -> tuple[list[dict], list[dict]]:
    """Steps of one run (busy back to back, 0.1 ms apart) and its client records."""
    steps, records = [], []
    t = start_wall + 0.01
    for i in range(requests):
        prompt = rng.choice([64, 128, 700])
        decodes = [rng.randrange(50, 3000) for _ in range(rng.randrange(0, 40))]
        rid = f"{tag}-{i}"
        arrival = t - 0.002
        chunks = [[prompt, 0]]
        seconds = TRUE.step_latency(prompt, TRUE.attention_work(prompt, 0), len(decodes), sum(decodes))
        steps.append({"start": PERF0 + (t - T0), "end": PERF0 + (t - T0) + seconds - 0.0001,
                      "end_wall": t + seconds - 0.0001, "prefill_chunks": chunks, "decode_contexts": decodes,
                      "waiting": 0, "first_token": [rid], "admitted": {rid: arrival}})
        engine_ttft = t + seconds - 0.0001 - arrival
        sent_at = arrival - start_wall - 0.0005
        records.append({"request_id": f"w-{i}", "klass": "short", "prompt_tokens": prompt, "output_tokens": 1,
                        "scheduled_at": sent_at, "sent_at": sent_at, "ttft_s": engine_ttft + FRONTEND_S,
                        "e2e_s": engine_ttft + FRONTEND_S, "itl_s": [], "error": None})
        t += seconds
        for _ in range(3):  # decode-only steps
            more = [rng.randrange(50, 3000) for _ in range(rng.randrange(1, 60))]
            seconds = TRUE.step_latency(0, 0.0, len(more), sum(more))
            steps.append({"start": PERF0 + (t - T0), "end": PERF0 + (t - T0) + seconds - 0.0001,
                          "end_wall": t + seconds - 0.0001, "prefill_chunks": [], "decode_contexts": more,
                          "waiting": 0, "first_token": [], "admitted": {}})
            t += seconds
    return steps, records


def make_folder(tmp: Path, *, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder = tmp / "bench"
    for sub in ("steps", "logs", "requests"):
        (folder / sub).mkdir(parents=True)
    runs, all_steps = [], []
    start = T0
    for phase, name in (("warmup", "warmup00-0-default"), ("measured", "measured00-default")):
        steps, records = _steps_for_run(rng, start, 40, phase)
        duration = steps[-1]["end_wall"] - start
        runs.append({"run": name, "policy": "default", "phase": phase, "round": 0, "started_at_unix": start,
                     "metrics": {"duration_s": duration}})
        (folder / "requests" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        all_steps += steps
        start = steps[-1]["end_wall"] + 30.0  # the next run starts after an idle pause
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    (folder / "logs" / "server-default-01.log").write_text("(EngineCore pid=4242) INFO ... starting\n")
    (folder / "steps" / "steps-4242.jsonl").write_text("".join(json.dumps(s) + "\n" for s in all_steps))
    return folder


@pytest.mark.parametrize("relative", [True, False])
def test_the_fit_gives_back_the_cost_model_that_timed_the_steps(tmp_path: Path, relative: bool) -> None:
    folder = make_folder(tmp_path)
    samples = served_samples([folder], "warmup")
    assert len(samples) == 40 * 4
    fit = fit_cost_model(samples, trim=False, relative=relative)
    for key, value in zip(("step_overhead_s", "prefill_token_s", "attention_token2_s", "decode_seq_s",
                           "decode_context_token_s"), (TRUE.step_overhead_s, TRUE.prefill_token_s,
                                                       TRUE.attention_token2_s, TRUE.decode_seq_s,
                                                       TRUE.decode_context_token_s), strict=True):
        assert fit.coefficients[key] == pytest.approx(value, rel=1e-4)
    assert fit.r2 == pytest.approx(1.0)


def test_each_phase_reads_only_its_own_runs(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    warmup = served_samples([folder], "warmup")
    measured = served_samples([folder], "measured")
    both = served_samples([folder], "all")
    assert len(warmup) == len(measured) == 160
    assert len(both) == 320
    assert [s.prefill_chunks for s in warmup] != [s.prefill_chunks for s in measured]
    with pytest.raises(ServedTraceError, match="later"):
        served_samples([folder], "later")


def test_the_front_end_time_is_client_ttft_minus_engine_ttft(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    values = frontend_seconds([folder], "measured")
    assert len(values) == 40
    assert [delay for delay, _ in values] == pytest.approx([FRONTEND_S] * 40, abs=1e-9)
    # the batch of each first token's step: its prefill chunk plus the decodes that ran with it
    steps = [json.loads(line) for line in (folder / "steps" / "steps-4242.jsonl").read_text().splitlines()]
    batches = [1 + len(s["decode_contexts"]) for s in steps if s["first_token"]][40:]
    assert [batch for _, batch in values] == batches
    assert fit_frontend(values) == pytest.approx((FRONTEND_S, 0.0), abs=1e-9)


def test_the_front_end_line_follows_the_median_at_each_batch_size() -> None:
    # 1 ms + 0.2 ms per sequence, with one far outlier per size that the medians ignore
    samples = [(0.001 + 0.0002 * n + noise, n) for n in (1, 4, 16, 40) for noise in (-1e-5, 0.0, 1e-5, 0.5)]
    samples += [(0.001 + 0.0002 * 40, 40)] * 3
    intercept, slope = fit_frontend(samples)
    assert intercept == pytest.approx(0.001, abs=2e-5)
    assert slope == pytest.approx(0.0002, rel=0.02)
    assert fit_frontend([]) == (0.0, 0.0)
    assert fit_frontend([(0.004, 7), (0.002, 7), (0.003, 7)]) == (0.003, 0.0)
    assert fit_frontend([(-0.001, 1), (-0.002, 5)]) == (0.0, 0.0)  # never negative


def test_a_folder_without_traces_is_refused_with_what_it_lacks(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    (folder / "logs").mkdir(parents=True)
    (folder / "runs.jsonl").write_text("")
    with pytest.raises(ServedTraceError, match="no steps"):
        served_samples([folder])


def test_refit_profile_keeps_the_base_limits_and_records_how_it_was_made(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    fit = fit_cost_model(served_samples([folder], "warmup"))
    base = {"name": "base", "step_overhead_s": 1.0, "prefill_token_s": 1.0, "source": "old",
            "defaults": {"max_num_seqs": 7, "block_size": 32}, "kv_transfer": {"bytes_per_token": 9},
            "calibration": {"r2": 0.1}}
    profile = refit_profile(base, fit, [(0.002, 1), (0.003, 2), (0.004, 3)], name="new", sources=[str(folder)],
                            phase="warmup")
    assert profile["defaults"] == base["defaults"] and profile["kv_transfer"] == base["kv_transfer"]
    assert (profile["frontend_s"], profile["frontend_per_seq_s"]) == pytest.approx((0.001, 0.001))
    assert profile["calibration"]["frontend_ms"]["median"] == pytest.approx(3.0)
    assert profile["step_overhead_s"] == pytest.approx(TRUE.step_overhead_s, rel=1e-3)
    assert profile["calibration"]["served"] is True and profile["calibration"]["base_profile"] == "base"
    assert "warmup runs" in profile["source"]


def test_the_absolute_fit_gets_the_busy_time_right_where_the_relative_one_does_not() -> None:
    # what served traffic looks like: many small decode batches, a few large ones, and a decode cost
    # that is concave in the batch (which the linear model cannot follow). The relative fit follows
    # the many small steps and misses the summed step time; the fit in seconds, with the per-step
    # constant in its solution, has residuals that sum to zero, so the busy time comes out exact.
    import math

    from prefillq.calibrate import StepSample, predict

    samples = [StepSample(0.002 + 0.001 * math.sqrt(n), [], [100] * n)
               for n in range(1, 129) for _ in range(20 if n <= 8 else 1)]
    measured = sum(s.seconds for s in samples)
    errors = {}
    for relative in (True, False):
        fit = fit_cost_model(samples, trim=False, relative=relative)
        errors[relative] = abs(sum(predict(fit.as_vector(), s) for s in samples) / measured - 1)
    assert errors[False] < 1e-9
    assert errors[True] > 0.003


def test_calibrate_from_bench_writes_a_profile_the_simulator_loads(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    out = tmp_path / "served.json"
    done = subprocess.run([sys.executable, "-m", "prefillq", "calibrate", "--from-bench", str(folder),
                           "--phase", "warmup", "--base-profile", "cpu-tiny-llama", "--name", "served-test",
                           "--out", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "profile written to" in done.stdout
    assert "front-end 3.10 ms + 0.000 ms per sequence, from 40 requests" in " ".join(done.stdout.split())
    profile = load_profile(out)
    assert profile.name == "served-test"
    assert profile.frontend_s == pytest.approx(FRONTEND_S, rel=1e-6)
    assert profile.cost.decode_seq_s == pytest.approx(TRUE.decode_seq_s, rel=1e-3)
    assert profile.defaults == load_profile("cpu-tiny-llama").defaults
    calibration = json.loads(out.read_text())["calibration"]  # terms chosen by held-out error, and that error
    assert calibration["terms"]["steps"]["chosen"] == list(COEFFICIENT_NAMES)  # every term of TRUE pays its way
    assert calibration["terms"]["frontend"]["chosen"] == ["frontend_s"]  # a constant delay: no per-sequence term
    assert calibration["heldout"]["heldout_rmse_ms"] < 1e-3 and calibration["heldout"]["frontend_mae_ms"] < 1e-3


def test_servers_side_by_side_get_the_runs_sent_to_their_ports(tmp_path: Path) -> None:
    # `--servers all-at-once`: both servers are up for the whole protocol, so only the port tells
    # which runs a trace holds
    from prefillq.calibrate.served import server_traces

    folder = tmp_path / "side"
    for sub in ("steps", "logs", "requests"):
        (folder / sub).mkdir(parents=True)
    runs = []
    for pid, port, policy in ((11, 41001, "default"), (22, 41002, "hrrn")):
        (folder / "logs" / f"server-{policy}-01.log").write_text(
            f"$ python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port {port}\n"
            f"(EngineCore pid={pid}) INFO up\n")
        step = {"start": 1.0, "end": 1.01, "prefill_chunks": [[8, 0]], "decode_contexts": [], "waiting": 0,
                "first_token": [], "admitted": {}}
        (folder / "steps" / f"steps-{pid}.jsonl").write_text(
            "".join(json.dumps({**step, "end_wall": T0 + t}) + "\n" for t in (1.0, 50.0, 100.0)))
        for round_ in (0, 1):
            runs.append({"run": f"measured0{round_}-{policy}", "policy": policy, "phase": "measured",
                         "round": round_, "url": f"http://127.0.0.1:{port}", "started_at_unix": T0 + 10 + 40 * round_})
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    traces = {t.name: sorted(r["run"] for r in t.runs) for t in server_traces(folder)}
    assert traces == {"server-default-01": ["measured00-default", "measured01-default"],
                      "server-hrrn-01": ["measured00-hrrn", "measured01-hrrn"]}


def test_refit_profile_writes_the_fitted_form_whatever_the_base_declared(tmp_path: Path) -> None:
    from prefillq.sim.costs import RooflineCostModel, profile_from_dict

    samples = served_samples([make_folder(tmp_path)], "warmup")
    base = {"name": "base", "cost_form": "roofline", "knee_tokens": 99.0, "knee_exponent": 2.0,
            "step_overhead_s": 1.0, "prefill_token_s": 1.0}
    linear = refit_profile(base, fit_cost_model(samples), [(0.002, 1)], name="lin", sources=["x"], phase="warmup")
    assert not {"cost_form", "knee_tokens", "knee_exponent"} & set(linear)
    assert type(profile_from_dict(linear).cost) is CostModel
    roofline = refit_profile(base, fit_cost_model(samples, form="roofline"), [(0.002, 1)], name="roof",
                             sources=["x"], phase="warmup")
    cost = profile_from_dict(roofline).cost
    assert isinstance(cost, RooflineCostModel) and cost.knee_tokens != 99.0
    # the steps were timed by a linear model: the roofline fit prices them as well as the linear one
    assert all(cost.step_latency(sum(c for c, _ in s.prefill_chunks),
                                 sum(cost.attention_work(c, x) for c, x in s.prefill_chunks),
                                 len(s.decode_contexts), sum(s.decode_contexts)) == pytest.approx(s.seconds, rel=0.02)
               for s in samples)
