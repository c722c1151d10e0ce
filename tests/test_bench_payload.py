"""Request bodies: exact prompt lengths as token ids, identical across policies of a round, and never a
client-settable internal priority (SPEC §5)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.bench.payload import PayloadOptions, build_body, build_payload, dropped_extra_keys, prompt_token_ids
from prefillq.workload import RequestSpec

SPEC = RequestSpec("req-1", 0.0, 300, 17, "long")


def test_prompt_is_exactly_prompt_tokens_ids_below_the_vocabulary():
    options = PayloadOptions(model="m", vocab_size=50, min_token_id=3)
    ids = prompt_token_ids(SPEC, options, payload_seed=0)
    assert len(ids) == 300
    assert all(3 <= i < 50 for i in ids)


def test_same_round_same_ids_other_round_or_request_other_ids():
    options = PayloadOptions(model="m", vocab_size=32000)
    assert prompt_token_ids(SPEC, options, 5) == prompt_token_ids(SPEC, options, 5)
    assert prompt_token_ids(SPEC, options, 5) != prompt_token_ids(SPEC, options, 6)
    other = RequestSpec("req-2", 0.0, 300, 17, "long")
    assert prompt_token_ids(SPEC, options, 5) != prompt_token_ids(other, options, 5)


def test_body_pins_the_output_length_and_asks_for_usage():
    body = build_body(SPEC, PayloadOptions(model="m"), 0)
    assert body["model"] == "m"
    assert body["max_tokens"] == 17
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["temperature"] == 0.0
    assert "ignore_eos" not in build_body(SPEC, PayloadOptions(model="m", ignore_eos=False), 0)


def test_encoded_payload_matches_the_body_and_carries_the_request_id():
    options = PayloadOptions(model="m")
    payload = build_payload(SPEC, options, 3)
    assert json.loads(payload.body) == build_body(SPEC, options, 3)
    assert ("x-request-id", "req-1") in payload.headers


def test_text_prompts():
    body = build_body(SPEC, PayloadOptions(model="m", text_prompts=True), 0)
    assert isinstance(body["prompt"], str) and len(body["prompt"].split()) == 300
    assert build_body(SPEC, PayloadOptions(model="m", text_prompts=True), 0, text="given")["prompt"] == "given"


def test_client_priority_is_never_forwarded_as_the_internal_priority():
    """SPEC §5: a 'priority' the user puts in the extra body is dropped; other fields pass through."""
    options = PayloadOptions(model="m", extra_body={"priority": -100, "top_p": 0.9})
    body = build_body(SPEC, options, 0)
    assert "priority" not in body
    assert body["top_p"] == 0.9
    assert dropped_extra_keys(options) == ["priority"]
    assert b"priority" not in build_payload(SPEC, options, 0).body


def test_operator_may_forward_vllm_request_priority_explicitly():
    options = PayloadOptions(model="m", extra_body={"priority": 5}, forward_priority=True)
    assert build_body(SPEC, options, 0)["priority"] == 5
    assert dropped_extra_keys(options) == []


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.sampled_from(["priority", "top_p", "seed", "user", "n"]),
                       st.integers(-5, 5), max_size=5),
       st.integers(1, 64), st.integers(1, 64))
def test_no_body_ever_has_priority_without_the_opt_in(extra, prompt_tokens, output_tokens):
    spec = RequestSpec("x", 0.0, prompt_tokens, output_tokens, "short")
    body = build_body(spec, PayloadOptions(model="m", extra_body=extra), 0)
    assert "priority" not in body
    assert len(body["prompt"]) == prompt_tokens and body["max_tokens"] == output_tokens


def test_extra_body_cannot_take_over_what_the_generator_owns():
    with pytest.raises(ValueError, match="max_tokens"):
        PayloadOptions(model="m", extra_body={"max_tokens": 1})
    with pytest.raises(ValueError):
        PayloadOptions(model="m", vocab_size=5, min_token_id=5)
    with pytest.raises(ValueError):
        PayloadOptions(model="")
