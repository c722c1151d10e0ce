"""SPEC §4: the three configuration dialects and the errors for bad input."""

from __future__ import annotations

import json

import pytest

from prefillq import ConfigError, PolicyConfig, load_config, make_queue
from prefillq.config import validate_deployment
from prefillq.policies import QUEUES


def test_native_dialect():
    cfg = load_config({"policy": "short_request_first", "threshold": 512, "long_max_wait_ms": 1500})
    assert cfg == PolicyConfig(policy="short_request_first", threshold=512, long_max_wait_ms=1500.0)


def test_native_dialect_wrapped_in_prefillq_key():
    assert load_config({"prefillq": {"policy": "hrrn"}}).policy == "hrrn"


def test_ascend_dialect_enabled_with_defaults():
    cfg = load_config('{"scheduler_config": {"short_request_first_config": {"enabled": true}}}')
    assert (cfg.policy, cfg.threshold, cfg.long_max_wait_ms) == ("short_request_first", 256, 0.0)


def test_ascend_dialect_values_and_disabled():
    cfg = load_config({"scheduler_config": {"short_request_first_config":
                                            {"enabled": True, "threshold": 300, "long_max_wait_ms": 2000}}})
    assert (cfg.policy, cfg.threshold, cfg.long_max_wait_ms) == ("short_request_first", 300, 2000.0)
    assert load_config({"scheduler_config": {"short_request_first_config": {"enabled": False}}}).policy == "default"


@pytest.mark.parametrize("source", ["--prefill_queue_strategy hrrn", "--prefill_queue_strategy=hrrn",
                                    ["--prefill_queue_strategy", "hrrn"], {"prefill_queue_strategy": "hrrn"}])
def test_lightllm_dialect(source):
    assert load_config(source).policy == "hrrn"


def test_lightllm_default_strategy():
    assert load_config([]).policy == "default"


def test_dialects_produce_the_same_policy_objects():
    native = make_queue({"policy": "short_request_first", "threshold": 256, "long_max_wait_ms": 0})
    ascend = make_queue({"scheduler_config": {"short_request_first_config": {"enabled": True}}})
    assert type(native) is type(ascend) and native.config == ascend.config
    assert type(make_queue("--prefill_queue_strategy promote_shortest")) is type(make_queue("promote_shortest"))


@pytest.mark.parametrize(("alias", "policy"), [("fcfs", "default"), ("srf", "short_request_first"),
                                               ("HRRN", "hrrn"), ("promote-shortest", "promote_shortest")])
def test_aliases(alias, policy):
    assert load_config(alias).policy == policy
    assert isinstance(make_queue(alias), QUEUES[policy])


def test_json_text_and_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"policy": "hrrn"}))
    assert load_config(str(path)).policy == "hrrn"
    assert load_config(path).policy == "hrrn"
    assert load_config('{"policy": "srf", "threshold": 10}').threshold == 10


@pytest.mark.parametrize(("source", "fragments"), [
    ("sjf", ["'sjf'", "default", "promote_shortest", "hrrn", "short_request_first"]),
    ({"policy": "hrrn", "threshhold": 5}, ["'threshhold'", "threshold", "long_max_wait_ms"]),
    ({"policy": "srf", "threshold": "256"}, ["threshold", "'256'"]),
    ({"policy": "srf", "threshold": 25.5}, ["threshold", "25.5"]),
    ({"policy": "srf", "threshold": -1}, ["threshold", "-1"]),
    ({"policy": "srf", "long_max_wait_ms": -5}, ["long_max_wait_ms", "-5"]),
    ({"policy": "srf", "long_max_wait_ms": "soon"}, ["long_max_wait_ms", "'soon'"]),
    ({"policy": 3}, ["policy", "3", "hrrn"]),
    ({"scheduler_config": {"short_request_first_config": {"enabled": "yes"}}}, ["enabled", "'yes'"]),
    ({"scheduler_config": {"short_request_first_config": {"enabled": True, "max_wait": 3}}},
     ["'max_wait'", "enabled", "threshold", "long_max_wait_ms"]),
    ({"scheduler_config": {"short_request_first_config": {"enabled": True, "threshold": -2}}}, ["threshold", "-2"]),
    ('{"policy": "hrrn",}', ["malformed JSON"]),
    ("--prefill_queue_strategy srf", ["'srf'", "default", "promote_shortest", "hrrn"]),
    ("--prefill_queue_strategy", ["needs a value"]),
    ("--max_total_tokens 5", ["'--max_total_tokens'"]),
    (42, ["int", "42"]),
])
def test_bad_configuration_is_refused_with_a_clear_message(source, fragments):
    with pytest.raises(ConfigError) as info:
        load_config(source)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ValueError)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(str(tmp_path / "nope.json"))


def test_short_request_first_refuses_decode_only_node():
    with pytest.raises(ConfigError, match="kv_consumer"):
        validate_deployment(load_config("srf"), kv_role="kv_consumer")
    validate_deployment(load_config("srf"), kv_role="kv_producer")
    validate_deployment(load_config("hrrn"), kv_role="kv_consumer")


def test_priority_scheduling_policy_is_refused():
    with pytest.raises(ConfigError, match="'priority'"):
        validate_deployment(load_config("srf"), scheduling_policy="priority")
    validate_deployment(load_config("srf"), scheduling_policy="fcfs")
