"""``parse_policy_spec``: the SPEC of ``prefillq compare --policy`` (a name, JSON, or NAME:KEY=VALUE,...)."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefillq.config import ConfigError, PolicyConfig, _typed_value, parse_policy_spec


def test_a_name_or_alias_is_that_policy_with_its_defaults_and_the_label_is_the_spec_as_given():
    assert parse_policy_spec("hrrn") == ("hrrn", PolicyConfig(policy="hrrn"))
    assert parse_policy_spec("srf") == ("srf", PolicyConfig(policy="short_request_first"))
    assert parse_policy_spec(" FCFS ") == (" FCFS ", PolicyConfig())


def test_name_key_value_pairs_are_typed_by_the_config_field():
    label, config = parse_policy_spec("short_request_first:threshold=512,long_max_wait_ms=1500")
    assert label == "short_request_first:threshold=512,long_max_wait_ms=1500"
    assert config == PolicyConfig(policy="short_request_first", threshold=512, long_max_wait_ms=1500.0)
    assert type(config.threshold) is int and type(config.long_max_wait_ms) is float
    _, config = parse_policy_spec("srf: threshold = 64 , trust-request-priority=true, stats_interval_s=0.5")
    assert config == PolicyConfig(policy="short_request_first", threshold=64, trust_request_priority=True,
                                  stats_interval_s=0.5)
    assert parse_policy_spec("hrrn:trust_request_priority=off")[1].trust_request_priority is False


def test_a_json_object_in_the_native_dialect():
    spec = '{"policy": "short_request_first", "threshold": 1024}'
    assert parse_policy_spec(spec) == (spec, PolicyConfig(policy="short_request_first", threshold=1024))
    assert parse_policy_spec('{"policy": "hrrn"}')[1] == PolicyConfig(policy="hrrn")


def test_every_config_field_can_be_set_by_key_value():
    """Generic over PolicyConfig: a field added later (e.g. partial_prefills) is read the same way."""
    for f in fields(PolicyConfig):
        if f.name == "policy":
            continue
        value = f.default
        text = str(value).lower() if isinstance(value, bool) else str(value)
        assert getattr(parse_policy_spec(f"default:{f.name}={text}")[1], f.name) == value, f.name


def test_literal_and_optional_field_types():
    assert _typed_value("partial_prefills", "ordered", Literal["first", "ordered"]) == "ordered"
    with pytest.raises(ConfigError, match=r"partial_prefills='last' is not a valid choice; valid choices: "
                                          r"first, ordered"):
        _typed_value("partial_prefills", "last", Literal["first", "ordered"])
    assert _typed_value("metrics_port", "none", int | None) is None
    assert _typed_value("metrics_port", "9100", int | None) == 9100
    with pytest.raises(ConfigError, match="metrics_port='x' must be an integer"):
        _typed_value("metrics_port", "x", int | None)


@given(threshold=st.integers(0, 10**9), wait=st.floats(0, 1e7, allow_nan=False), trust=st.booleans(),
       policy=st.sampled_from(["default", "promote_shortest", "hrrn", "short_request_first", "fcfs", "srf"]))
def test_key_value_and_json_specs_agree(threshold, wait, trust, policy):
    text = f"{policy}:threshold={threshold},long_max_wait_ms={wait!r},trust_request_priority={trust}"
    expected = PolicyConfig(policy=policy, threshold=threshold, long_max_wait_ms=wait, trust_request_priority=trust)
    assert parse_policy_spec(text) == (text, expected)
    as_json = json.dumps({"policy": policy, "threshold": threshold, "long_max_wait_ms": wait,
                          "trust_request_priority": trust})
    assert parse_policy_spec(as_json)[1] == expected


@pytest.mark.parametrize("spec, message", [
    ("", "empty"),
    ("fifo", "unknown policy 'fifo'; valid policies: default, promote_shortest"),
    ("fifo:threshold=1", "unknown policy 'fifo'"),
    ("srf:treshold=512", "'treshold' is not a setting (did you mean 'threshold'?); valid keys: threshold,"),
    ("srf:threshold=abc", "threshold='abc' must be an integer"),
    ("srf:threshold=1.5", "threshold='1.5' must be an integer"),
    ("srf:threshold=-1", "threshold must be a non-negative integer, got -1"),
    ("srf:long_max_wait_ms=soon", "long_max_wait_ms='soon' must be a number"),
    ("srf:long_max_wait_ms=inf", "long_max_wait_ms must be a non-negative number"),
    ("srf:trust_request_priority=maybe", "trust_request_priority='maybe' must be true or false"),
    ("srf:", "expected KEY=VALUE"),
    ("srf:threshold", "expected KEY=VALUE"),
    ("srf:threshold=1,", "expected KEY=VALUE"),
    ("srf:threshold=1,threshold=2", "'threshold' is given twice"),
    ("srf:policy=hrrn", "'policy' is given before ':'"),
    ("threshold=512", "settings go after the policy name, as NAME:KEY=VALUE"),
    ("{bad", "malformed JSON"),
    ('{"policy": "hrrn", "treshold": 5}', "did you mean 'threshold'?"),
])
def test_bad_specs_are_one_line_config_errors_naming_the_spec(spec, message):
    with pytest.raises(ConfigError) as caught:
        parse_policy_spec(spec)
    text = str(caught.value)
    assert text.startswith(f"policy spec {spec!r}: ") and message in text and "\n" not in text
