"""The server command line and the configuration rules, without starting vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefillq.cli.serve import register
from prefillq.config import ConfigError, PolicyConfig, load_config, resolve_config
from prefillq.integrations.serve import build_server_command, preflight


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_command_starts_vllms_openai_server_with_our_scheduler_on_loopback(tmp_path: Path) -> None:
    argv, env = build_server_command(str(tmp_path), PolicyConfig(policy="hrrn"), port=8123,
                                     extra_args=["--max-model-len", "4096"], python="/venv/bin/python",
                                     base_env={"PATH": "/bin"})
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert option(argv, "--model") == str(tmp_path)
    assert option(argv, "--scheduler-cls") == "prefillq.integrations.vllm.Scheduler"
    assert json.loads(option(argv, "--additional-config")) == {"prefillq": PolicyConfig(policy="hrrn").to_dict()}
    assert (option(argv, "--host"), option(argv, "--port")) == ("127.0.0.1", "8123")
    assert argv[-2:] == ["--max-model-len", "4096"]
    # private and offline for a local model folder; the loopback host keeps vLLM's sockets local too
    assert env["PATH"] == "/bin"
    assert env["VLLM_NO_USAGE_STATS"] == env["DO_NOT_TRACK"] == env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"


def test_users_own_settings_win_and_their_additional_config_is_merged() -> None:
    argv, env = build_server_command(
        "org/some-hub-model", PolicyConfig(policy="srf"), host="0.0.0.0",
        extra_args=["--scheduler-cls", "prefillq.integrations.vllm.AsyncScheduler",
                    "--additional-config", '{"other_feature": {"x": 1}}'],
        base_env={"VLLM_NO_USAGE_STATS": "0"})
    assert argv.count("--scheduler-cls") == 1
    assert option(argv, "--scheduler-cls") == "prefillq.integrations.vllm.AsyncScheduler"
    assert argv.count("--additional-config") == 1
    merged = json.loads(option(argv, "--additional-config"))
    assert merged["other_feature"] == {"x": 1} and merged["prefillq"]["policy"] == "short_request_first"
    assert env["VLLM_NO_USAGE_STATS"] == "0"
    assert "HF_HUB_OFFLINE" not in env      # a hub model may need the hub
    assert "VLLM_HOST_IP" not in env        # not a loopback host


def test_without_a_policy_the_users_ascend_config_is_passed_unchanged() -> None:
    ascend = '{"scheduler_config": {"short_request_first_config": {"enabled": true, "threshold": 512}}}'
    argv, _ = build_server_command("m", None, extra_args=["--additional-config", ascend], base_env={})
    assert json.loads(option(argv, "--additional-config")) == json.loads(ascend)
    config, source = preflight(None, ["--additional-config", ascend], environ={})
    assert (config.policy, config.threshold) == ("short_request_first", 512)
    assert "short_request_first_config" in source


def test_a_policy_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        build_server_command("m", PolicyConfig(policy="hrrn"),
                             extra_args=["--additional-config", '{"prefillq": {"policy": "srf"}}'])
    ascend_null = '{"scheduler_config": {"short_request_first_config": null}}'  # disabled is a setting too
    with pytest.raises(ConfigError, match="given twice"):
        build_server_command("m", PolicyConfig(policy="hrrn"), extra_args=["--additional-config", ascend_null])
    other = '{"scheduler_config": {"max_long_partial_prefills": 1}}'  # another feature's key: merged
    argv, _ = build_server_command("m", PolicyConfig(policy="hrrn"), extra_args=["--additional-config", other])
    assert json.loads(option(argv, "--additional-config"))["scheduler_config"] == {"max_long_partial_prefills": 1}


def test_configuration_sources_in_order_of_precedence() -> None:
    env = {"PREFILLQ_CONFIG": '{"policy": "promote_shortest"}'}
    assert resolve_config({"prefillq": {"policy": "hrrn"}}, env)[0].policy == "hrrn"
    ascend = {"scheduler_config": {"short_request_first_config": {"enabled": True}, "other": 1}}
    assert resolve_config(ascend, env)[0].policy == "short_request_first"
    assert resolve_config({"unrelated": True}, env)[0].policy == "promote_shortest"
    assert resolve_config({}, {"PREFILLQ_CONFIG": "hrrn"})[0].policy == "hrrn"
    assert resolve_config({}, {})[0] == load_config(None)
    with pytest.raises(ConfigError, match="sets both"):
        resolve_config({"prefillq": {"policy": "hrrn"}, **ascend}, {})


def test_config_file_in_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text('{"policy": "short_request_first", "threshold": 300, "long_max_wait_ms": 2000}')
    config, source = resolve_config({}, {"PREFILLQ_CONFIG": str(path)})
    assert (config.policy, config.threshold, config.long_max_wait_ms) == ("short_request_first", 300, 2000.0)
    assert "PREFILLQ_CONFIG" in source
    with pytest.raises(ConfigError, match="PREFILLQ_CONFIG: cannot read"):
        resolve_config({}, {"PREFILLQ_CONFIG": str(tmp_path / "missing.json")})


@pytest.mark.parametrize(("args", "message"), [
    (["--scheduling-policy", "lifo"], r"need scheduling policy 'fcfs' \(or 'priority' with priority_tiers\), got"),
    (["--kv-transfer-config", '{"kv_connector": "X", "kv_role": "kv_consumer"}'], "decode-only node"),
])
def test_preflight_refuses_what_the_engine_would_refuse(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        preflight(PolicyConfig(policy="short_request_first"), args, environ={})


@pytest.mark.parametrize("args", [["--scheduling-policy", "priority"], ["--scheduling-policy=priority"]])
def test_preflight_runs_the_policy_inside_priority_tiers_under_vllms_priority_mode(args: list[str]) -> None:
    """SPEC §4.1: vLLM's priority mode is accepted, with the policy inside strict tiers (before, refused)."""
    config, _ = preflight(PolicyConfig(policy="short_request_first"), args, environ={})
    assert config.policy == "short_request_first" and config.priority_tiers


def test_preflight_accepts_the_plug_ins_step_recording_key_and_checks_its_spelling() -> None:
    args = ["--additional-config", '{"prefillq": {"policy": "hrrn", "record_steps": "/tmp/steps"}}']
    config, _ = preflight(None, args, environ={})
    assert config.policy == "hrrn"
    with pytest.raises(ConfigError, match="record_steps"):
        preflight(None, ["--additional-config", '{"prefillq": {"policy": "hrrn", "record_step": "/tmp/s"}}'],
                  environ={})


def test_hrrn_may_run_on_a_decode_node() -> None:
    args = ["--kv-transfer-config", '{"kv_connector": "X", "kv_role": "kv_consumer"}']
    assert preflight(PolicyConfig(policy="hrrn"), args, environ={})[0].policy == "hrrn"


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps the commands sub-commands, as in the real CLI
        pass

    register(app)
    return app


@pytest.fixture(scope="module")
def cli() -> CliRunner:
    return CliRunner()


def test_serve_dry_run_prints_the_command(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(_app(), ["serve", str(tmp_path), "--policy", "srf", "--port", "9001", "--dry-run", "--",
                              "--max-model-len", "2048"])
    assert result.exit_code == 0, result.output
    assert "-m vllm.entrypoints.openai.api_server" in result.stdout
    assert "--scheduler-cls prefillq.integrations.vllm.Scheduler" in result.stdout
    assert '"policy":"short_request_first"' in result.stdout
    assert result.stdout.rstrip().endswith("--port 9001 --max-model-len 2048")


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "fastest"], "unknown policy 'fastest'"),
    (["--policy", "hrrn", "--config", '{"policy": "srf"}'], "either --policy or --config"),
    (["--config", '{"policy": "srf"', "--dry-run"], "malformed JSON"),
    (["--policy", "srf", "--", "--scheduling-policy", "lifo"], "scheduling policy 'fcfs'"),
    (["--policy", "sglang_hrrn", "--dry-run"], "emulation of another engine's queue option"),
    (["--config", '{"scheduler_config": {"short_request_frist_config": {"enabled": true}}}', "--dry-run"],
     "did you mean 'short_request_first_config'"),
    (["--dry-run", "--", "--additional-config",
      '{"refresh": true, "scheduler_confg": {"short_request_first_config": {"enabled": true}}}'],
     "did you mean 'scheduler_config'"),
    (["--policy", "hrrn", "--dry-run", "--", "--additional-config", '{"prefilq": {"policy": "srf"}}'],
     "did you mean 'prefillq'"),
])
def test_serve_reports_bad_input_in_one_line(cli: CliRunner, args: list[str], message: str) -> None:
    result = cli.invoke(_app(), ["serve", "some-model", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_importing_the_package_and_its_commands_loads_no_vllm_or_torch() -> None:
    code = ("import sys, prefillq, prefillq.cli, prefillq.calibrate, prefillq.calibrate.design, "
            "prefillq.calibrate.fit, prefillq.integrations.serve, prefillq.integrations.tiny_model, "
            "prefillq.cli.serve, prefillq.cli.calibrate; prefillq.cli._register_all(); "
            "heavy = [m for m in ('vllm', 'torch', 'transformers', 'tokenizers') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
