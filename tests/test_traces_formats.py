"""Published trace formats read as their publishers distribute them, the shipped samples, and the error
for a file of no known format."""

from __future__ import annotations

import gzip
import json

import pytest
import typer
from typer.testing import CliRunner

from prefillq.cli.compare import register as register_compare
from prefillq.cli.traces import register as register_traces
from prefillq.workload import WorkloadError, load_trace
from prefillq.workload.samples import SAMPLES
from tests.cli_app import cli_app

# A few rows in each publisher's column layout (values of the same kind as the published files).
AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,879,19
2023-11-16 18:16:02.3101070,91,50
2023-11-16 18:16:02.3101070,4808,10
"""
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00.009930+00:00,2162,5
2024-05-10 00:00:00.250000+00:00,1150,27
2024-05-10 00:00:01.509930+00:00,4396,13
2024-05-10 00:00:03.000000+00:00,87,301
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,76,493,Conversation log
156.5,ChatGPT,1360,391,1751,API log
160,ChatGPT,0,12,12,API log
"""
BURSTGPT_SESSIONS = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
0,7,3.2,ChatGPT,120,40,160,Conversation log
2.5,7,1.0,ChatGPT,300,20,320,Conversation log
"""


def _requests(workload):
    return [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in workload.requests]


def test_azure_2023_published_csv(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(AZURE_2023)
    workload = load_trace(path, long_threshold=1000)
    assert workload.params["format"] == "azure-llm-csv"
    assert _requests(workload) == [(0.0, 374, 44), (4.314579, 396, 109), (4.31941, 879, 19),
                                   (15.629517, 91, 50), (15.629517, 4808, 10)]
    assert [r.klass for r in workload.requests] == ["short", "short", "short", "short", "long"]


def test_azure_2024_published_csv_with_utc_offsets(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_code_1week.csv"
    path.write_text(AZURE_2024)
    workload = load_trace(path)
    assert workload.params["format"] == "azure-llm-csv"
    assert _requests(workload) == [(0.0, 2162, 5), (0.24007, 1150, 27), (1.5, 4396, 13), (2.99007, 87, 301)]


def test_burstgpt_published_csv_skips_failed_requests_and_starts_at_the_first(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)
    workload = load_trace(path)
    assert workload.params["format"] == "burstgpt-csv"
    # the failed request (0 response tokens) and the empty prompt are no requests a server completes
    assert _requests(workload) == [(0.0, 472, 18), (113.0, 417, 76), (151.5, 1360, 391)]
    assert workload.params["skipped_rows"] == 2


def test_burstgpt_with_session_ids(tmp_path):
    path = tmp_path / "BurstGPT_sessions.csv"
    path.write_text(BURSTGPT_SESSIONS)
    workload = load_trace(path)
    assert _requests(workload) == [(0.0, 120, 40), (2.5, 300, 20)]
    assert [r.session for r in workload.requests] == ["7", "7"]


def test_rows_out_of_time_order_start_at_the_earliest(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:50,100,5\n"
                    "2023-11-16 18:15:48.5,200,6\n")
    assert _requests(load_trace(path)) == [(0.0, 200, 6), (1.5, 100, 5)]


def test_gzip_compressed_trace_reads_like_the_plain_one(tmp_path):
    plain, packed = tmp_path / "a.csv", tmp_path / "a.csv.gz"
    plain.write_text(AZURE_2023)
    packed.write_bytes(gzip.compress(AZURE_2023.encode()))
    assert _requests(load_trace(packed)) == _requests(load_trace(plain))


@pytest.mark.parametrize(("content", "line", "message"), [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\nyesterday,5,5\n", 3, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3.5,44\n", 2, "ContextTokens"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nsoon,x,1,1,2,API log\n", 2, "Timestamp"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,x,1,-1,0,API log\n", 2,
     "Response tokens"),
])
def test_bad_published_rows_name_file_line_and_column(tmp_path, content, line, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message) as info:
        load_trace(path)
    assert f"{path}:{line}:" in str(info.value)


@pytest.mark.parametrize("content", ["time,prompt,output\n0,5,5\n", '{"t": 0, "prompt": 5}\n'])
def test_unknown_format_lists_every_format_and_its_columns(tmp_path, content):
    path = tmp_path / "mystery.trace"
    path.write_text(content)
    with pytest.raises(WorkloadError, match="unknown trace format") as info:
        load_trace(path)
    message = str(info.value)
    for needed in ("TIMESTAMP, ContextTokens, GeneratedTokens", "Timestamp, Request tokens, Response tokens",
                   "arrived_at, num_prefill_tokens, num_decode_tokens", "input_length", "scheduled_at"):
        assert needed in message


def _app() -> typer.Typer:
    return cli_app(register_compare, register_traces)


@pytest.mark.parametrize(("name", "content", "count"), [("azure.csv", AZURE_2023, 5), ("azure24.csv", AZURE_2024, 4),
                                                         ("burst.csv", BURSTGPT, 3)])
def test_published_formats_run_through_compare_with_every_request_completed(tmp_path, name, content, count):
    path = tmp_path / name
    path.write_text(content)
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(_app(), ["compare", "--trace", str(path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    policies = json.loads(out.read_text())["policies"]
    assert policies and all(entry["completed"] == count for entry in policies.values())


def test_samples_are_shipped_and_read_by_name():
    for sample in SAMPLES.values():
        assert sample.path.is_file() and sample.path.stat().st_size < 400_000
    conv = load_trace("sample:azure-conv")
    assert len(conv.requests) == 19_366 and conv.name == "azure-conv"
    assert conv.params["trace"] == "sample:azure-conv" and conv.params["format"] == "azure-csv"
    code = load_trace("sample:azure-code", limit=10)
    assert len(code.requests) == 10 and code.requests[0].arrival_s == 0.0


def test_an_unknown_sample_lists_the_samples():
    with pytest.raises(WorkloadError, match="sample:azure-conv, sample:azure-code"):
        load_trace("sample:nope")


def test_traces_command_lists_samples_and_credits_the_source():
    result = CliRunner().invoke(_app(), ["traces"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())
    for text in ("sample:azure-conv", "19,366", "sample:azure-code", "8,819", "CC-BY 4.0", "AzurePublicDataset"):
        assert text in words
    help_text = CliRunner().invoke(_app(), ["traces", "--help"], env={"COLUMNS": "100"}).output
    assert "CC-BY 4.0" in " ".join(help_text.split())


def test_the_samples_and_their_credit_are_package_data():
    """A plain (non-editable) install carries only what pyproject's package-data names: the shipped samples
    and their credit must match it."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from prefillq.workload.samples import DATA_DIR

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["prefillq"]
    package = root / "src" / "prefillq"
    shipped = [sample.path for sample in SAMPLES.values()] + [DATA_DIR / "README.md"]
    named = [pattern for pattern in patterns if "**" not in pattern]  # our entries name the folder exactly
    for path in shipped:
        assert path.is_file()
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatchcase(relative, pattern) for pattern in named), relative
    assert "CC-BY 4.0" in (DATA_DIR / "README.md").read_text()
