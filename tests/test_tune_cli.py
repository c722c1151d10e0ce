"""``prefillq tune`` through the command line, with the real simulator: the Azure traces, the three
input formats, the W_normal >= W_slo case, and bad input (exit status 2, the error names file and line).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefillq.cli.tune import register
from tests.traces import bench_records_trace, two_lengths_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps `tune` a sub-command, as in the real CLI
        pass

    register(app)
    return app


def run(*args: str) -> object:
    return CliRunner().invoke(_app(), ["tune", *args])


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("content, expected", [
    ("", "empty trace"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n", "no requests"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,10\n0.5,lots,10\n", ":3: num_prefill_tokens"),
    ("arrived_at,num_decode_tokens\n0.0,10\n", ":1: CSV header lacks column(s) num_prefill_tokens"),
    ('{"timestamp": 0, "input_length": 100, "output_length": 5}\n{"timestamp": 10, "output_length": 5}\n',
     ":2: missing key 'input_length'"),
    ('{"timestamp": 0, "input_length": "x", "output_length": 5}\n', ":1: input_length must be a number"),
])
def test_bad_traces_exit_2_and_name_file_and_line(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / ("bad.jsonl" if content.startswith("{") else "bad.csv")
    path.write_text(content)
    result = run("--trace", str(path), "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    assert str(path) in result.output
    assert expected in result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.glob("*.png"))


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    result = run("--trace", str(tmp_path / "nope.csv"))
    assert result.exit_code == 2
    assert "nope.csv" in result.output


@pytest.mark.parametrize("args, expected", [
    (["--favor", "middle"], "--favor"),
    (["--long-slo-ms", "0"], "--long-slo-ms"),
    (["--rate-scale", "-1"], "--rate-scale"),
    (["--budget", "0"], "--budget"),
    (["--profile", "no-such-profile"], "no-such-profile"),
    (["--window-s", "-5"], "--window-s"),
])
def test_bad_options_exit_2(args: list[str], expected: str) -> None:
    result = run("--trace", str(TRACES / "azure-2023-code.csv"), *args)
    assert result.exit_code == 2
    assert expected in result.output


# --- the Azure traces (real simulator) ----------------------------------------------------------

AZURE = {
    # trace: (threshold, method, short request share, short prefill-token share) — from the trace alone
    "azure-2023-conv.csv": (512, "kde_valley", 0.395, 0.110),
    "azure-2023-code.csv": (3072, "percentile_fallback_p80", 0.790, 0.459),
}


@pytest.fixture(scope="module", params=sorted(AZURE))
def azure_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object,
                                                                                                    dict, Path]:
    out = tmp_path_factory.mktemp("tune")
    name = request.param
    result = run("--trace", str(TRACES / name), "--out", str(out), "--json", str(out / "tune.json"))
    assert result.exit_code == 0, result.output
    return name, result, json.loads((out / "tune.json").read_text()), out


def test_azure_threshold_and_lanes_are_stable(azure_run: tuple) -> None:
    name, _, data, _ = azure_run
    threshold, method, short_requests, short_tokens = AZURE[name]
    assert (data["threshold"], data["threshold_method"]) == (threshold, method)
    assert data["lanes"]["short_request_share"] == pytest.approx(short_requests, abs=0.001)
    assert data["lanes"]["short_token_share"] == pytest.approx(short_tokens, abs=0.001)


def test_azure_wait_follows_the_recipe(azure_run: tuple) -> None:
    _, result, data, _ = azure_run
    assert data["w_normal_p90_ms"] <= data["w_normal_p95_ms"]
    assert data["w_slo_ms"] == 2000
    if data["capacity_problem"]:
        assert data["long_max_wait_ms"] == pytest.approx(data["w_normal_p95_ms"], abs=50)
        assert "not this knob" in result.output and "Evidence:" in result.output
    else:
        assert data["w_normal_p95_ms"] <= data["long_max_wait_ms"] <= data["w_slo_ms"]
        middle = (data["w_normal_p95_ms"] + data["w_slo_ms"]) / 2
        assert data["long_max_wait_ms"] >= middle  # --favor short (the default): towards W_slo


def test_azure_output_explains_and_prints_pasteable_configs(azure_run: tuple) -> None:
    import shlex

    from prefillq.config import load_config

    name, result, data, out = azure_run
    text = result.output
    flat = " ".join(text.split())  # prose wraps at words to the terminal
    assert data["policy"] in ("default", "promote_shortest", "hrrn", "short_request_first", "auto")
    assert data["partial_prefills"] in ("first", "ordered")
    for needle in (f"Threshold {data['threshold']:,} tokens ({data['threshold_method']})", "Lanes at",
                   "Simulated the busiest", "long_max_wait_ms", f"Policy {data['policy']}:",
                   "p95", "TTFT", "srf (tuned)", "srf (strict)", "Recommendation:"):
        assert needle in flat, needle
    if data["threshold_method"] == "kde_valley":
        assert "clear valley" in flat
    else:
        assert "falling back to the 80th percentile" in flat
    # The vLLM commands paste as they are and carry the recommendation.
    lines = text.splitlines()
    commands = []  # each command with its continuation lines (a backslash, or a newline inside the quotes)
    for i, line in enumerate(lines):
        if line.startswith("vllm serve MODEL"):
            end = next(j for j in range(i + 1, len(lines) + 1) if j == len(lines) or not lines[j].startswith(" "))
            commands.append("\n".join(lines[i:end]).replace("\\\n", " "))
    assert len(commands) == 2
    ours, ascend = (shlex.split(c) for c in commands)
    assert ours[ours.index("--scheduler-cls") + 1] == "prefillq.integrations.vllm.Scheduler"
    config = load_config(ours[ours.index("--additional-config") + 1])
    assert (config.policy, config.partial_prefills) == (data["policy"], data["partial_prefills"])
    tuned = load_config(ascend[ascend.index("--additional-config") + 1])
    assert (tuned.policy, tuned.threshold, tuned.long_max_wait_ms) == (
        "short_request_first", data["threshold"], data["long_max_wait_ms"])
    strategy = next(line for line in lines if line.startswith("--prefill_queue_strategy"))
    assert load_config(strategy).policy == data["lightllm_strategy"]
    assert (out / f"{Path(name).stem}-tune-histogram.png").read_bytes()[:4] == b"\x89PNG"
    # Every simulated row is in the JSON, and the window used is stated.
    assert set(data["predicted"]) >= {"default", "promote_shortest", "hrrn", "short_request_first",
                                      "promote_shortest (ordered)", "hrrn (ordered)", "short_request_first (ordered)"}
    assert "srf (tuned, ordered)" in text and "hrrn (ordered)" in text
    # The partial_prefills verdict, with the numbers behind it, for every reordering policy.
    detail = data["partial_prefills_detail"]
    assert set(detail["per_policy"]) == {"promote_shortest", "hrrn", "short_request_first", "auto"}
    assert f"Partial prefills {data['partial_prefills']}:" in flat
    ascend_note = "vLLM Ascend key cannot express partial_prefills"
    assert (ascend_note in flat.replace(" # ", " ")) == (data["partial_prefills"] == "ordered")
    assert ("already orders partial prefills" in flat.replace(" # ", " ")) == (data["partial_prefills"] == "ordered")
    assert data["warnings"] == []  # the tuned wait is never 0 here: no strict short-first warning
    assert not data["window"]["whole_trace"] and data["window"]["selection"] == "busiest"
    assert data["window"]["description"] in flat


# --- the other input formats, determinism, W_normal >= W_slo ------------------------------------

def _bimodal_rows(count: int = 600, seed: int = 5) -> list[tuple[float, int, int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        long = rng.random() < 0.25
        prompt = int(np.exp(rng.normal(np.log(8192 if long else 160), 0.2)))
        rows.append((round(i * 0.05, 3), prompt, int(rng.integers(16, 128))))
    return rows


def test_mooncake_jsonl_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o,
                                        "hash_ids": [1, 2]}) + "\n" for t, p, o in _bimodal_rows()))
    result = run("--trace", str(path), "--out", str(tmp_path), "--json", str(tmp_path / "t.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["threshold_method"] == "kde_valley"
    assert 160 < data["threshold"] < 2000
    assert data["window"]["whole_trace"]
    assert data["trace"]["format"] == "jsonl"


def test_bench_records_are_accepted_and_the_result_is_deterministic(tmp_path: Path) -> None:
    from prefillq.metrics import RequestRecord

    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(RequestRecord(f"r{i}", "short", p, o, t, t + 0.001, 0.05, 1.0).to_dict())
                            + "\n" for i, (t, p, o) in enumerate(_bimodal_rows())))
    outputs = []
    for attempt in range(2):
        result = run("--trace", str(path), "--out", str(tmp_path), "--json", str(tmp_path / f"{attempt}.json"))
        assert result.exit_code == 0, result.output
        outputs.append((tmp_path / f"{attempt}.json").read_text())
    assert outputs[0] == outputs[1]
    data = json.loads(outputs[0])
    assert data["threshold_method"] == "kde_valley"  # classes come from the tuned threshold, not the file


def test_w_normal_above_w_slo_through_the_cli(tmp_path: Path) -> None:
    # A burst: 40 long prompts and 120 short ones within 2 s, far more than one step budget can clear.
    rows = [(i * 0.01, 8192 + i, 32) for i in range(40)] + [(0.5 + i * 0.01, 150 + i % 7, 32) for i in range(120)]
    path = tmp_path / "burst.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{t},{p},{o}\n" for t, p, o in sorted(rows)))
    result = run("--trace", str(path), "--long-slo-ms", "100", "--out", str(tmp_path),
                 "--json", str(tmp_path / "t.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["capacity_problem"]
    assert data["w_normal_p95_ms"] >= 100
    assert data["long_max_wait_ms"] >= data["w_normal_p95_ms"] - 10
    text = result.output.replace("\n", " ")
    assert "The threshold or the capacity is the problem, not this knob" in text
    assert "Evidence:" in text and "under default (FCFS)" in text


# --- tune and compare agree on the split ---------------------------------------------------------

def test_compare_splits_a_trace_at_the_threshold_tune_recommends(tmp_path: Path) -> None:
    from prefillq.workload import load_trace

    trace = two_lengths_trace(tmp_path / "two.csv")
    result = run("--trace", str(trace), "--out", str(tmp_path), "--json", str(tmp_path / "tune.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "tune.json").read_text())
    assert (data["threshold_method"], data["lanes"]["short_requests"], data["lanes"]["long_requests"]) == (
        "kde_valley", 70, 30)
    split = load_trace(trace).params["split"]  # what `prefillq compare --trace` splits at
    assert split == {"threshold": data["threshold"], "method": data["threshold_method"]}


def test_a_trace_with_a_repeated_request_id_exits_2_in_one_line(tmp_path: Path) -> None:
    trace = bench_records_trace(tmp_path / "dup.jsonl", ["a", "b", "a"])
    result = run("--trace", str(trace), "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert f"error: {trace}:3: request_id 'a'" in result.output and "line 1" in result.output


# --- partial_prefills = "ordered" on synthetic traces (real simulator, SPEC §3.6) ----------------------

def _write_trace(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{t:.3f},{p},{o}\n" for t, p, o in sorted(rows)))
    return path


def test_ordered_is_recommended_where_started_long_prefills_hold_up_short_prompts(tmp_path: Path) -> None:
    # A 6,000-token prompt every 1.5 s takes ~6 steps of the 1,024-token budget; a short prompt arrives
    # every 0.1 s. With "first" a started long prefill keeps the budget and every policy equals FCFS.
    rows = [(i * 1.5, 6000 + i, 16) for i in range(40)] + [(0.05 + i * 0.1, 100 + i % 9, 16) for i in range(600)]
    trace = _write_trace(tmp_path / "long-chunks.csv", rows)
    result = run("--trace", str(trace), "--out", str(tmp_path), "--json", str(tmp_path / "t.json"),
                 "--profile", "h100-qwen3.5-0.8b")  # the load above is sized for this profile's step costs
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    predicted = data["predicted"]
    first = {name: predicted[name]["short_ttft_p95_ms"] for name in ("promote_shortest", "hrrn", "short_request_first")}
    assert all(p95 == pytest.approx(predicted["default"]["short_ttft_p95_ms"]) for p95 in first.values())
    ordered = predicted["short_request_first (ordered)"]
    assert ordered["short_ttft_p95_ms"] < 0.5 * first["short_request_first"]
    assert (data["policy"], data["partial_prefills"]) == ("short_request_first", "ordered")
    assert data["partial_prefills_detail"]["policy_switched_from"] == "default"
    assert ordered["long_ttft_p95_ms"] <= predicted["default"]["long_ttft_p95_ms"] + data["w_slo_ms"]
    assert '"partial_prefills": "ordered"' in result.output
    assert "vLLM Ascend key cannot express" in result.output and "already orders partial prefills" in result.output
    assert data["warnings"] == [] and data["long_max_wait_ms"] > 0


def test_ordered_is_not_recommended_when_no_prompt_needs_more_than_one_step(tmp_path: Path) -> None:
    # Every prompt fits in one step's budget and the load is light: there are no partial prefills to order.
    rows = [(i * 0.5, 600 + i % 20, 16) for i in range(60)] + [(0.25 + i * 0.5, 40 + i % 9, 16) for i in range(180)]
    trace = _write_trace(tmp_path / "one-step.csv", rows)
    result = run("--trace", str(trace), "--out", str(tmp_path), "--json", str(tmp_path / "t.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["partial_prefills"] == "first"
    assert not any(c["supported"] for c in data["partial_prefills_detail"]["per_policy"].values())
    assert "partial_prefills" not in json.loads(data["configs"]["vllm_additional_config"])["prefillq"]
    assert "cannot express" not in result.output
