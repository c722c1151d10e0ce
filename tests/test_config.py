"""SPEC §4: the three configuration dialects and the errors for bad input."""

from __future__ import annotations

import json

import pytest

from prefillq import ConfigError, PolicyConfig, load_config, make_queue
from prefillq.config import resolve_config, validate_deployment
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
    ("sjf", ["'sjf'", "default", "promote_shortest", "hrrn", "short_request_first", "auto"]),
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


# --- SPEC §4: one Ascend parser for the engine (resolve_config) and the Python API (load_config) ------

ASCEND_SRF = {"enabled": True, "threshold": 512, "long_max_wait_ms": 2000}
# A real vLLM Ascend --additional-config: other features' keys around ours, at both levels.
REAL_ASCEND = {
    "ascend_scheduler_config": {"enabled": True, "enable_chunked_prefill": True},
    "torchair_graph_config": {"enabled": False},
    "weight_prefetch_config": {"enabled": False},
    "expert_map_path": "/tmp/map.json",
    "refresh": True,
    "scheduler_config": {"short_request_first_config": ASCEND_SRF, "max_long_partial_prefills": 1},
}


def test_ascend_dialect_ignores_other_top_level_and_scheduler_config_keys():
    cfg = load_config(REAL_ASCEND)
    assert (cfg.policy, cfg.threshold, cfg.long_max_wait_ms) == ("short_request_first", 512, 2000.0)
    assert load_config(json.dumps(REAL_ASCEND)) == cfg
    assert resolve_config(REAL_ASCEND, environ={})[0] == cfg


def test_prefillq_key_ignores_other_top_level_keys():
    assert load_config({"prefillq": {"policy": "hrrn"}, "torchair_graph_config": {"enabled": True}}).policy == "hrrn"


@pytest.mark.parametrize("other", [{}, {"max_long_partial_prefills": 1}])
def test_ascend_short_request_first_config_null_means_the_defaults(other):
    data = {"scheduler_config": {"short_request_first_config": None, **other}}
    assert load_config(data) == PolicyConfig()
    config, source = resolve_config(data, environ={"PREFILLQ_CONFIG": "hrrn"})  # disabled is a choice
    assert config == PolicyConfig() and "short_request_first_config" in source


def test_an_ascend_object_that_does_not_configure_short_request_first_means_the_defaults():
    assert load_config({"scheduler_config": {"max_long_partial_prefills": 1}, "refresh": True}) == PolicyConfig()
    assert resolve_config({"scheduler_config": {"max_long_partial_prefills": 1}}, environ={})[0] == PolicyConfig()


NEAR_MISSES = [
    ({"scheduler_config": {"short_request_frist_config": {"enabled": True}}},
     "short_request_frist_config", "short_request_first_config"),
    ({"scheduler_confg": {"short_request_first_config": {"enabled": True}}, "refresh": True},
     "scheduler_confg", "scheduler_config"),
    ({"scheduler_config": {"short_request_first_config": {"enabled": True, "treshold": 100}}},
     "treshold", "threshold"),
    ({"prefilq": {"policy": "short_request_first"}, "torchair_graph_config": {}}, "prefilq", "prefillq"),
    ({"prefillq": {"polcy": "hrrn"}}, "polcy", "policy"),
    ({"prefillq": {"policy": "srf", "long_max_wait": 5}}, "long_max_wait", "long_max_wait_ms"),
]


@pytest.mark.parametrize(("source", "typo", "meant"), NEAR_MISSES)
def test_a_near_miss_spelling_of_a_key_we_read_is_an_error_naming_the_key_it_resembles(source, typo, meant):
    with pytest.raises(ConfigError) as info:
        load_config(source)
    message = str(info.value)
    assert repr(typo) in message and f"did you mean {meant!r}" in message, message


@pytest.mark.parametrize(("source", "typo", "meant"), [
    ({"policy": "hrrn", "treshold": 5}, "treshold", "threshold"),
    ({"prefill_queue_stratgy": "hrrn"}, "prefill_queue_stratgy", "prefill_queue_strategy"),
])
def test_a_near_miss_in_the_native_dialect_names_the_key_it_resembles(source, typo, meant):
    with pytest.raises(ConfigError, match=f"'{typo}'.*did you mean '{meant}'"):
        load_config(source)


@pytest.mark.parametrize(("source", "fragments"), [
    ({"scheduler_config": {"short_request_first_config": {"enabled": True, "max_wait": 3}}, "refresh": 1},
     ["'max_wait'", "enabled", "threshold", "long_max_wait_ms"]),
    ({"scheduler_config": {"short_request_first_config": {"enabled": True, "threshold": -2}}, "refresh": 1},
     ["threshold", "-2"]),
    ({"scheduler_config": {"short_request_first_config": {"enabled": True, "long_max_wait_ms": -1}}},
     ["long_max_wait_ms", "-1"]),
    ({"scheduler_config": {"short_request_first_config": "on"}}, ["short_request_first_config", "'on'"]),
    ({"scheduler_config": "srf"}, ["scheduler_config", "'srf'"]),
    ({"prefillq": "hrrn", "refresh": 1}, ["prefillq", "'hrrn'"]),
    ({"prefillq": {"policy": "hrrn"}, "scheduler_config": {"short_request_first_config": {"enabled": True}}},
     ["sets both", "prefillq", "short_request_first_config"]),
])
def test_unknown_keys_and_bad_values_inside_what_we_read_remain_errors(source, fragments):
    for parse in (load_config, lambda data: resolve_config(data, environ={})):
        with pytest.raises(ConfigError) as info:
            parse(source)
        for fragment in fragments:
            assert fragment in str(info.value), (fragment, str(info.value))


@pytest.mark.parametrize("source", [
    REAL_ASCEND,
    {"scheduler_config": {"short_request_first_config": None}},
    {"scheduler_config": {"short_request_first_config": {"enabled": False, "threshold": 100}}},
    {"prefillq": {"policy": "hrrn", "trust_request_priority": True}, "refresh": True},
    {"prefillq": None},
    *[source for source, _, _ in NEAR_MISSES],
    {"scheduler_config": {"short_request_first_config": {"enabled": True, "threshold": -2}}},
])
def test_the_engine_path_reads_additional_config_with_the_same_parser_as_load_config(source):
    """What an engine runs (resolve_config on vLLM's additional_config dict) is what load_config says."""
    try:
        expected: object = load_config(source)
    except ConfigError as exc:
        expected = str(exc)
    try:
        got: object = resolve_config(source, environ={"PREFILLQ_CONFIG": "promote_shortest"})[0]
    except ConfigError as exc:
        got = str(exc)
    assert got == expected
