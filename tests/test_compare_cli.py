"""``prefillq compare`` from the command line: the table, the JSON summary, files, and bad input (exit 2)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from prefillq.cli.compare import register
from tests.traces import bench_records_trace, two_lengths_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
JSON_KEYS = {"short_ttft_p50_ms", "short_ttft_p95_ms", "long_ttft_p95_ms", "long_e2e_p95_ms", "short_tpot_p50_ms",
             "output_tokens_per_s", "completed"}


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps `compare` a sub-command, as in the real CLI
        pass

    register(app)
    return app


def run(*args: str):
    return CliRunner().invoke(_app(), ["compare", *args])


def test_compare_without_options_runs_the_default_scenario_through_the_real_entry_point():
    done = subprocess.run([sys.executable, "-m", "prefillq.cli", "compare"], capture_output=True, text=True,
                          timeout=120, env={"COLUMNS": "200", "PATH": ""})
    assert done.returncode == 0, done.stderr
    for text in ("long-first", "default", "promote_shortest", "hrrn", "short_request_first", "bound (lower)",
                 "auto:partial_prefills=ordered", "✓ recommended", "best reached by a clairvoyant schedule"):
        assert text in done.stdout


def test_json_summary_has_the_documented_keys(tmp_path):
    out = tmp_path / "s.json"
    result = run("--scenario", "interleaved", "--mode", "lightllm", "--template-tokens", "12", "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["scenario"] == "interleaved" and data["profile"] == "h100-qwen3.5-0.8b"
    assert set(data["policies"]) == {"default", "promote_shortest", "hrrn", "short_request_first", "auto"}
    for summary in data["policies"].values():
        assert set(summary) >= JSON_KEYS
        assert summary["completed"] == 192
    recommendation = data["recommendation"]  # LightLLM mode: one of LightLLM's own strategies, auto beside it
    assert recommendation["command"] == f"--prefill_queue_strategy {recommendation['row']}"
    assert recommendation["row"] in ("default", "promote_shortest", "hrrn")
    assert recommendation["auto"]["row"] == "auto"
    assert {"short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms", "method"} <= set(data["bound"])
    default = data["policies"]["default"]["short_ttft_p50_ms"]
    assert data["policies"]["hrrn"]["short_ttft_p50_ms"] < 0.3 * default
    for key in ("short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms"):
        assert all(data["bound"][key] <= entry[key] for entry in data["policies"].values())


def test_out_dir_gets_csv_json_and_plots(tmp_path):
    result = run("--scenario", "low-load", "--policies", "default,srf", "--repeats", "2", "--seed", "3",
                 "--set", "rate=10", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for name in ("summary.json", "summary.csv", "records.csv", "ttft_cdf.png", "queue.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    with (tmp_path / "records.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["policy"] for row in rows} == {"default", "short_request_first"}
    assert {row["repeat"] for row in rows} == {"0", "1"}
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["repeats"] == 2 and len(data["per_repeat"]["default"]) == 2
    assert (tmp_path / "ttft_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_trace_replay(tmp_path):
    result = run("--trace", str(TRACES / "azure-2023-code.csv"), "--limit", "300", "--rate-scale", "4",
                 "--policies", "default,hrrn", "--json", str(tmp_path / "t.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["policies"]["default"]["completed"] == 300


def test_bad_input_exits_2_with_a_clear_message(tmp_path):
    bad_trace = tmp_path / "bad.csv"
    bad_trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,12,3\n0.5,x,3\n")
    cases = [
        (["--scenario", "nope"], "unknown scenario 'nope'"),
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["--profile", "cpu-tiny-llama-missing"], "unknown profile"),
        (["--budget", "0"], "budget must be an integer >= 1"),
        (["--policies", "default,fifo"], "fifo"),
        (["--mode", "sglang"], "unknown mode"),
        (["--trace", str(bad_trace)], f"{bad_trace}:3:"),
        (["--trace", str(tmp_path / "missing.csv")], "no such trace file"),
        (["--scenario", "sustained", "--set", "rate=-1"], "rate"),
        (["--scenario", "sustained", "--set", "nonsense"], "KEY=VALUE"),
        (["--scenario", "long-first", "--trace", str(bad_trace)], "not both"),
        (["--repeats", "0"], "repeats must be an integer >= 1"),
        (["--template-tokens", "-1"], "template_tokens must be a non-negative integer"),
        (["--policies", " , "], "no policies"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output and message in result.output, (args, result.output)


def test_an_overloaded_trace_replay_warns_with_the_factor_and_a_rate_scale():
    trace = str(TRACES / "azure-2023-code.csv")
    result = CliRunner().invoke(_app(), ["compare", "--trace", trace, "--limit", "200", "--rate-scale", "40",
                                         "--policies", "default", "--profile", "h100-qwen3.5-0.8b"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "x the engine's prefill capacity" in warnings[0] and "--rate-scale" in warnings[0]
    calm = run("--trace", trace, "--limit", "200", "--rate-scale", "4", "--policies", "default",
               "--profile", "h100-qwen3.5-0.8b")
    assert calm.exit_code == 0 and "warning:" not in calm.output


def test_a_trace_is_split_where_tune_puts_the_threshold_and_every_output_says_so(tmp_path):
    from prefillq.tune import choose_threshold

    trace = two_lengths_trace(tmp_path / "two.csv")
    threshold = choose_threshold([100] * 70 + [5000] * 30).threshold
    result = CliRunner().invoke(_app(), ["compare", "--trace", str(trace), "--policies", "default,srf",
                                         "--out", str(tmp_path / "out"), "--no-plots"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "70 short / 30 long requests" in result.output
    assert f"short = prompt tokens <= {threshold}, the threshold prefillq tune chooses: kde_valley" in result.output
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["split"] == {"threshold": threshold, "method": "kde_valley"}
    assert data["policies"]["default"]["short_count"] == 70 and data["policies"]["default"]["long_count"] == 30
    with (tmp_path / "out" / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(row["split_threshold"], row["split_method"]) for row in rows} == {(str(threshold), "kde_valley")}


def test_long_threshold_overrides_the_split_as_the_users(tmp_path):
    trace = two_lengths_trace(tmp_path / "two.csv")
    result = CliRunner().invoke(_app(), ["compare", "--trace", str(trace), "--policies", "default",
                                         "--long-threshold", "100", "--json", str(tmp_path / "s.json")],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "70 short / 30 long requests" in result.output  # a prompt at the threshold is short
    assert "short = prompt tokens <= 100, from --long-threshold" in result.output
    assert json.loads((tmp_path / "s.json").read_text())["split"] == {"threshold": 100, "method": "user"}


def test_a_scenario_keeps_its_own_split(tmp_path):
    result = run("--scenario", "long-first", "--policies", "default", "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "s.json").read_text())["split"] == {"threshold": None, "method": "scenario"}


def test_a_trace_with_a_repeated_request_id_exits_2_in_one_line(tmp_path):
    trace = bench_records_trace(tmp_path / "dup.jsonl", ["a", "b", "a"])
    result = run("--trace", str(trace), "--policies", "default")
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert f"error: {trace}:3: request_id 'a'" in result.output and "line 1" in result.output


def test_generated_ids_never_collide_with_the_traces_own(tmp_path):
    trace = bench_records_trace(tmp_path / "ids.jsonl", ["trace-0000002", None, None, None])
    result = run("--trace", str(trace), "--policies", "default,srf", "--out", str(tmp_path), "--no-plots")
    assert result.exit_code == 0, result.output
    policies = json.loads((tmp_path / "summary.json").read_text())["policies"]
    assert all(entry["completed"] == 4 for entry in policies.values())
    with (tmp_path / "records.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for policy in ("default", "short_request_first"):
        ids = [row["request_id"] for row in rows if row["policy"] == policy]
        assert len(ids) == len(set(ids)) == 4 and "trace-0000002" in ids


# --- configured rows: --policy SPEC, --long-prefill-token-threshold, warnings ------------------------------

def run_wide(*args: str):
    return CliRunner().invoke(_app(), ["compare", *args], env={"COLUMNS": "400"})


def test_configured_rows_are_labelled_by_spec_in_the_table_json_csv_and_plots(tmp_path):
    specs = ["short_request_first:threshold=64", "srf:threshold=256,long_max_wait_ms=1500", '{"policy": "hrrn"}']
    args = [arg for spec in specs for arg in ("--policy", spec)]
    result = run_wide("--scenario", "long-first", "--policies", "default", *args, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for label in ["default", *specs]:
        assert f"│ {label} " in result.output
    data = json.loads((tmp_path / "summary.json").read_text())
    assert list(data["policies"]) == ["default", *specs] == list(data["configs"])
    config = data["configs"][specs[1]]
    assert (config["policy"], config["threshold"], config["long_max_wait_ms"]) == ("short_request_first", 256, 1500.0)
    p50 = {label: entry["short_ttft_p50_ms"] for label, entry in data["policies"].items()}
    assert p50[specs[0]] == p50["default"] and p50[specs[1]] < 0.1 * p50[specs[0]]  # 64: one lane; 256: two
    assert data["baseline"] == "default" and data["policies"][specs[2]]["change_vs_default"]["short_ttft_p50_ms"] < 0
    with (tmp_path / "summary.csv").open() as handle:
        assert [row["policy"] for row in csv.DictReader(handle)] == ["default", *specs]
    with (tmp_path / "records.csv").open() as handle:
        assert list(dict.fromkeys(row["policy"] for row in csv.DictReader(handle))) == ["default", *specs]
    assert (tmp_path / "ttft_cdf.png").stat().st_size > 0 and (tmp_path / "queue.png").stat().st_size > 0


def test_policy_alone_replaces_the_default_rows_and_without_plain_default_there_is_no_change_column(tmp_path):
    result = run_wide("--scenario", "long-first", "--policy", "hrrn", "--policy", "srf:threshold=64",
                      "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "s.json").read_text())
    assert list(data["policies"]) == ["hrrn", "srf:threshold=64"] and data["baseline"] is None
    assert all("change_vs_default" not in entry for entry in data["policies"].values())
    assert "no % change: no row runs plain default (add --policy default)" in result.output
    fcfs = run_wide("--scenario", "long-first", "--policy", "hrrn", "--policy", "fcfs")
    assert fcfs.exit_code == 0 and "% change vs fcfs (plain default)" in fcfs.output and "%" in fcfs.output


def test_configured_rows_in_1p1d_and_lightllm(tmp_path):
    result = run_wide("--scenario", "long-first", "--topology", "1p1d", "--mode", "lightllm", "--policy", "default",
                      "--policy", "srf:threshold=200", "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "s.json").read_text())
    assert list(data["policies"]) == list(data["pd_stats"]) == ["default", "srf:threshold=200"]
    assert data["policies"]["srf:threshold=200"]["short_ttft_p50_ms"] < data["policies"]["default"]["short_ttft_p50_ms"]


def test_bad_policy_specs_exit_2_in_one_line():
    cases = [
        (["--policy", "srf:treshold=512"], "policy spec 'srf:treshold=512': 'treshold' is not a setting (did you "
                                           "mean 'threshold'?)"),
        (["--policy", "srf:threshold=big"], "threshold='big' must be an integer"),
        (["--policy", "fifo"], "unknown policy 'fifo'"),
        (["--policy", "{oops"], "malformed JSON"),
        (["--policy", "hrrn", "--policy", "hrrn"], "two rows are labelled 'hrrn'"),
        (["--policies", "default", "--policy", "default"], "two rows are labelled 'default'"),
        (["--long-prefill-token-threshold", "-5"], "long_prefill_token_threshold must be a non-negative integer"),
    ]
    for args, message in cases:
        result = run_wide("--scenario", "long-first", *args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, (args, result.output)


def test_long_prefill_token_threshold_lets_shorts_in_sooner_under_default(tmp_path):
    def short_ttft(*args: str) -> tuple[float, dict]:
        result = run_wide("--scenario", "long-first", "--policies", "default", *args,
                          "--json", str(tmp_path / "s.json"))
        assert result.exit_code == 0, result.output
        data = json.loads((tmp_path / "s.json").read_text())
        return data["policies"]["default"]["short_ttft_mean_ms"], data

    off, data_off = short_ttft()
    capped, data_capped = short_ttft("--long-prefill-token-threshold", "256")
    assert capped < off and data_off["long_prefill_token_threshold"] == 0
    assert data_capped["long_prefill_token_threshold"] == 256
    assert short_ttft("--long-prefill-token-threshold", "0")[0] == off


def test_a_lopsided_srf_threshold_warns_in_one_line_and_in_the_json(tmp_path):
    trace = two_lengths_trace(tmp_path / "two.csv")  # 70 prompts of 100 tokens, 30 of 5000
    result = run_wide("--trace", str(trace), "--policies", "default,srf", "--policy", "srf:threshold=50",
                      "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.output
    assert warnings[0].startswith("warning: row 'srf:threshold=50': short_request_first threshold 50 splits the "
                                  "requests 0 short / 100 long, so it orders requests as default (FCFS) does")
    assert "--policy short_request_first:threshold=" in warnings[0]
    assert json.loads((tmp_path / "s.json").read_text())["warnings"] == [warnings[0].removeprefix("warning: ")]


def test_the_overload_warning_names_the_factor_and_a_rate_and_is_in_the_json(tmp_path):
    result = run_wide("--scenario", "overload", "--policies", "default", "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "x the engine's prefill capacity" in warnings[0]
    assert "--set rate=" in warnings[0]
    assert json.loads((tmp_path / "s.json").read_text())["warnings"] == [warnings[0].removeprefix("warning: ")]
    calm = run_wide("--scenario", "low-load", "--policies", "default", "--json", str(tmp_path / "c.json"))
    assert calm.exit_code == 0 and json.loads((tmp_path / "c.json").read_text())["warnings"] == []


def test_lightllm_engine_options(tmp_path):
    # --prefill-token-gate: LightLLM's ok_prefill rule keeps the shorts in the router; hrrn cannot help.
    out = tmp_path / "s.json"
    result = run("--scenario", "long-first", "--mode", "lightllm", "--template-tokens", "12", "--policies",
                 "default,hrrn", "--prefill-token-gate", "--router-tick-ms", "30", "--lightllm-schedule",
                 "prefill-first", "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["engine_options"] == {"schedule": "prefill-first", "router_tick_s": 0.03, "prefill_token_gate": True}
    assert data["policies"]["hrrn"]["short_ttft_p50_ms"] > 10_000
    for args, message in [
        (("--mode", "lightllm", "--lightllm-schedule", "fast"),
         "unknown schedule 'fast'; valid choices: prefill-first"),
        (("--router-tick-ms", "10"), "router_tick_s: LightLLM engine options need --mode lightllm"),
        (("--mode", "lightllm", "--router-tick-ms", "-1"), "router_tick_s must be a non-negative number"),
    ]:
        result = run("--scenario", "low-load", "--set", "num_requests=4", *args)
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


# --- --policies peers: other engines' options, emulated, beside default and auto -------------------------------

PEER_ROWS_VLLM = ["default", "auto:partial_prefills=ordered", "sglang_hrrn", "sglang_spf:partial_prefills=ordered",
                  "trtllm_suf", "dynamo_wspt"]


def test_policies_peers_shows_every_emulation_named_as_such_and_recommends_none_of_them(tmp_path):
    result = run_wide("--scenario", "long-first", "--policies", "peers", "--no-achievable",
                      "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "s.json").read_text())
    assert list(data["policies"]) == PEER_ROWS_VLLM
    assert data["emulations"] == {"sglang_hrrn": "SGLang --schedule-policy hrrn",
                                  "sglang_spf:partial_prefills=ordered": "SGLang --schedule-policy "
                                                                         "shortest-prefill-first",
                                  "trtllm_suf": "TensorRT-LLM context_scheduling_policy=shortest_uncached_first",
                                  "dynamo_wspt": "Dynamo --router-queue-policy wspt"}
    rec = data["recommendation"]
    assert rec["row"] not in data["emulations"]
    assert all(rec["candidates"][label].startswith("an emulation of") for label in data["emulations"])
    text = " ".join(result.output.split())
    assert ("Emulations of other engines' options (prefillq's vLLM plug-in does not run them; never recommended): "
            "sglang_hrrn = SGLang --schedule-policy hrrn;") in text
    assert "vllm serve MODEL" in text and '"policy": "sglang' not in text


def test_policies_peers_in_lightllm_mode_answers_with_lightllm_s_own_strategy(tmp_path):
    result = run_wide("--scenario", "interleaved", "--mode", "lightllm", "--policies", "hrrn,peers",
                      "--no-achievable", "--format", "markdown")
    assert result.exit_code == 0, result.output
    assert "| sglang_spf " in result.output and "partial_prefills=ordered" not in result.output
    assert "(LightLLM does not run them; never recommended)" in result.output
    rec_line = next(line for line in result.output.splitlines() if line.startswith(("Use ", "Keep ")))
    assert rec_line.startswith(("Use --prefill_queue_strategy hrrn", "Keep default"))


def test_the_help_names_the_peers_group_and_policy_peers_exits_2():
    done = subprocess.run([sys.executable, "-m", "prefillq.cli", "compare", "--help"], capture_output=True,
                          text=True, timeout=60, env={"COLUMNS": "100", "PATH": ""})
    help_text = " ".join(done.stdout.split())
    assert done.returncode == 0 and "The group 'peers' adds default, auto and the emulations" in help_text
    result = run("--policy", "peers")
    assert result.exit_code == 2 and "'peers' is a group of rows, not a policy: give it to --policies" in result.output
