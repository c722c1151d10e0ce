"""An option that would change nothing is an error (exit 2, naming the option), never accepted silently:
``compare`` and ``sweep`` (issue 20, item 6). Each case fails before any simulation runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefillq.cli import compare as compare_cli
from prefillq.cli import sweep as sweep_cli

TRACE = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "azure-2023-code.csv")


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps the commands sub-commands, as in the real CLI
        pass

    compare_cli.register(app)
    sweep_cli.register(app)
    return app


def _error(args: list[str]) -> str:
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize(("args", "named"), [
    # the in-flight cap is the gateway's: without a gateway queue nothing waits for it
    (["compare", "--replicas", "2", "--max-inflight-per-replica", "1"], "--max-inflight-per-replica"),
    (["compare", "--max-inflight-per-replica", "4"], "--max-inflight-per-replica"),
    (["compare", "--replicas", "2", "--gateway-policy", "none", "--max-inflight-per-replica", "1"],
     "--max-inflight-per-replica"),
    (["compare", "--replicas", "2", "--gateway-policy", "none"], "--gateway-policy none"),
    # a router picks among replicas: with one there is nothing to pick
    (["compare", "--router", "least_outstanding_tokens"], "--router"),
    # the trace options shape a trace, not a scenario
    (["compare", "--scenario", "long-first", "--rate-scale", "2"], "--rate-scale"),
    (["compare", "--limit", "10"], "--limit"),
    (["compare", "--start", "1"], "--start"),
    (["compare", "--duration", "5"], "--duration"),
    (["compare", "--long-threshold", "100"], "--long-threshold"),
    (["compare", "--hash-block-tokens", "16"], "--hash-block-tokens"),
    # a trace is the same requests every repeat, and nothing in the simulator is random
    (["compare", "--trace", TRACE, "--limit", "50", "--repeats", "3"], "--repeats"),
    (["compare", "--trace", TRACE, "--limit", "50", "--seed", "7"], "--seed"),
    (["sweep", "--max-inflight-per-replica", "2", "--jobs", "1"], "--max-inflight-per-replica"),
    (["sweep", "--router", "least_outstanding_tokens", "--jobs", "1"], "--router"),
    (["sweep", "--limit", "10", "--jobs", "1"], "--limit"),
    (["sweep", "--trace", TRACE, "--limit", "50", "--seed", "7", "--jobs", "1"], "--seed"),
])
def test_an_option_that_does_nothing_is_refused(args: list[str], named: str) -> None:
    message = _error(args)
    assert message.startswith("error:") and named in message, message


def test_the_same_options_where_they_act_are_accepted() -> None:
    runner = CliRunner()
    for args in (["compare", "--scenario", "low-load", "--set", "duration_s=1", "--policies", "default", "--replicas",
                  "2", "--router", "least_outstanding_tokens", "--gateway-policy", "hrrn",
                  "--max-inflight-per-replica", "1"],
                 ["compare", "--trace", TRACE, "--limit", "50", "--rate-scale", "2", "--policies", "default"]):
        result = runner.invoke(_app(), args)
        assert result.exit_code == 0, result.output
