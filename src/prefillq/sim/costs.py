"""The step-latency cost model and the profiles (JSON data files) that hold its coefficients.

One engine step (one forward pass over a batch) takes

    c0 + c1 * sum(chunk) + c2 * sum(chunk * (context_before + chunk / 2)) + c3 * n_decode + c4 * sum(ctx)

seconds, where the sums run over the prefill chunks of the step (``chunk`` tokens of a request whose
first ``context_before`` tokens are already computed) and over the decode sequences (their current
context length ``ctx``). c0 is the fixed per-step cost (launch, sampling, scheduler), c1 the linear
(MLP/projection) cost per token, c2 the attention cost of a token against its context, c3 and c4 the
per-sequence and KV-read costs of decoding. That is the ``"linear"`` form (``cost_form``; the default).

The ``"roofline"`` form replaces the linear term by one in which reading the weights and computing
meet: with ``N = sum(chunk) + n_decode`` the tokens that go through the projections in the step,

    c0 + c1 * knee(N) + c2 * sum(chunk * (context_before + chunk / 2)) + c3 * n_decode + c4 * sum(ctx)

    knee(N) = (K**p + N**p) ** (1 / p)        (K = knee_tokens, p = knee_exponent)

A small step is bound by reading the weights once (``c1 * K`` seconds, whatever N), a large one by
compute (``c1 * N``); ``p`` says how sharply the two meet (large p: ``max(K, N)``; p = 1: their sum;
p < 1: a curve that bends the other way, steep at first then flatter). ``knee(N) >= N`` always, so a
roofline step never costs less than the linear form with the same c0..c4 says for its prefill tokens.

A profile may also give ``frontend_s`` and ``frontend_per_seq_s``: the time a request spends in the
server outside the engine steps (HTTP, request processing, output processing, detokenization,
streaming), which a client sees in every TTFT and end-to-end latency but which no step's latency
contains. A token produced by a step of ``n`` sequences reaches the client
``frontend_s + frontend_per_seq_s * n`` after the step ends (the server processes every running
request's output each step). The simulator adds that to each request's first-token and finish
times (both 0 when absent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from prefillq.validation import check_int, check_number, reject_unknown_keys

COEFFICIENTS = ("step_overhead_s", "prefill_token_s", "attention_token2_s", "decode_seq_s", "decode_context_token_s")
COST_FORMS = ("linear", "roofline")
ROOFLINE_KEYS = ("knee_tokens", "knee_exponent")
DEFAULT_LIMITS = {
    "max_num_batched_tokens": 1024,
    "max_num_seqs": 256,
    "block_size": 16,
    "kv_blocks": 65536,
    "long_prefill_token_threshold": 0,
}


# The profile a run uses when none is given, by engine model: vLLM mode a measured GPU profile (CUDA-graph
# step times of a ~0.6B dense model on an H200); LightLLM mode the profile fitted to LightLLM's published
# study (docs/compare.md, "Profiles", says why).
DEFAULT_PROFILES = {"vllm": "h200-qwen3-0.6b", "lightllm": "h100-qwen3.5-0.8b"}


def default_profile(mode: str = "vllm") -> str:
    """The packaged profile a run in engine model ``mode`` uses when none is given."""
    return DEFAULT_PROFILES.get(mode, DEFAULT_PROFILES["vllm"])


class ProfileError(ValueError):
    """Unknown or malformed cost-model profile."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Coefficients of the step-latency formula (seconds)."""

    step_overhead_s: float
    prefill_token_s: float
    attention_token2_s: float = 0.0
    decode_seq_s: float = 0.0
    decode_context_token_s: float = 0.0

    def step_latency(self, prefill_tokens: int, attention_work: float, num_decodes: int,
                     decode_context_tokens: int) -> float:
        """Latency of one step, from the batch's aggregate terms (see the module docstring)."""
        return (self.step_overhead_s + self.prefill_token_s * prefill_tokens
                + self.attention_token2_s * attention_work + self.decode_seq_s * num_decodes
                + self.decode_context_token_s * decode_context_tokens)

    def decode_step_terms(self, num_decodes: int) -> tuple[float, float]:
        """``(a, b)`` such that ``step_latency(0, 0, num_decodes, ctx)`` is ``a + b * ctx`` bit for bit
        (the context term is the last of the sum): the simulator prices a run of decode-only steps
        with them. A subclass whose ``step_latency`` ends otherwise must override this."""
        return self.step_latency(0, 0, num_decodes, 0), self.decode_context_token_s

    @staticmethod
    def attention_work(chunk: int, context_before: int) -> float:
        """The attention term of one prefill chunk: ``chunk * (context_before + chunk / 2)``."""
        return chunk * (context_before + chunk / 2.0)

    @property
    def form(self) -> str:
        """The profile's ``cost_form``: ``"linear"`` here, ``"roofline"`` for :class:`RooflineCostModel`."""
        return "linear"

    def prefill_latency(self, prompt_tokens: int, chunk: int) -> float:
        """Time to prefill one prompt alone in chunks of ``chunk`` tokens (no other work)."""
        total = 0.0
        done = 0
        while done < prompt_tokens:
            step = min(chunk, prompt_tokens - done)
            total += self.step_latency(step, self.attention_work(step, done), 0, 0)
            done += step
        return total


def knee(tokens: float, knee_tokens: float, exponent: float) -> float:
    """``(knee_tokens**p + tokens**p) ** (1/p)``, evaluated without overflow for any exponent p > 0."""
    high, low = (tokens, knee_tokens) if tokens >= knee_tokens else (knee_tokens, tokens)
    if high <= 0.0:
        return 0.0
    return high * (1.0 + (low / high) ** exponent) ** (1.0 / exponent)


@dataclass(frozen=True, slots=True)
class RooflineCostModel(CostModel):
    """The ``"roofline"`` form (module docstring): the projections cost ``c1 * knee(N)``, not ``c1 * N``."""

    knee_tokens: float = 1.0
    knee_exponent: float = 1.0

    def __post_init__(self) -> None:
        check_number("knee_tokens", self.knee_tokens, strict=True, error=ProfileError)
        check_number("knee_exponent", self.knee_exponent, strict=True, error=ProfileError)

    def step_latency(self, prefill_tokens: int, attention_work: float, num_decodes: int,
                     decode_context_tokens: int) -> float:
        # knee() inlined: the simulator prices every step with this (a call and a tuple cost ~40% more)
        tokens = prefill_tokens + num_decodes
        p = self.knee_exponent
        if tokens >= self.knee_tokens:
            linear = tokens * (1.0 + (self.knee_tokens / tokens) ** p) ** (1.0 / p)
        else:
            linear = self.knee_tokens * (1.0 + (tokens / self.knee_tokens) ** p) ** (1.0 / p)
        return (self.step_overhead_s + self.prefill_token_s * linear
                + self.attention_token2_s * attention_work + self.decode_seq_s * num_decodes
                + self.decode_context_token_s * decode_context_tokens)

    @property
    def form(self) -> str:
        return "roofline"


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """The cost of moving a request's KV from a prefill node to a decode node (disaggregated topologies).

    ``seconds(tokens) = (bytes_per_token * tokens + bytes_per_request) / link_bytes_per_s``;
    ``bytes_per_request`` is state whose size does not grow with the prompt (e.g. the recurrent state
    of linear-attention layers in hybrid models).
    """

    bytes_per_token: float
    link_bytes_per_s: float
    bytes_per_request: float = 0.0

    def __post_init__(self) -> None:
        check_number("kv_transfer.bytes_per_token", self.bytes_per_token, error=ProfileError)
        check_number("kv_transfer.link_bytes_per_s", self.link_bytes_per_s, strict=True, error=ProfileError)
        check_number("kv_transfer.bytes_per_request", self.bytes_per_request, error=ProfileError)

    def transfer_bytes(self, tokens: int) -> float:
        """Bytes moved for a request whose first ``tokens`` tokens have KV."""
        return self.bytes_per_token * tokens + self.bytes_per_request

    def seconds(self, tokens: int) -> float:
        """Time on the link for a request whose first ``tokens`` tokens have KV."""
        return self.transfer_bytes(tokens) / self.link_bytes_per_s


KV_TRANSFER_KEYS = ("bytes_per_token", "link_bytes_per_s", "bytes_per_request")


@dataclass(frozen=True)
class Profile:
    """A named cost model plus the engine defaults it was measured with."""

    name: str
    description: str
    source: str
    cost: CostModel
    defaults: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    kv_transfer: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    frontend_s: float = 0.0  # per request, outside the steps: added to TTFT and E2E (module docstring)
    frontend_per_seq_s: float = 0.0  # ... plus this per sequence in the step that produced the token

    def limit(self, key: str) -> int:
        return int(self.defaults.get(key, DEFAULT_LIMITS[key]))

    def transfer_model(self) -> KvTransfer:
        """The profile's KV-transfer cost (``kv_transfer`` block); required by disaggregated topologies."""
        missing = [key for key in ("bytes_per_token", "link_bytes_per_s") if key not in self.kv_transfer]
        if missing:
            raise ProfileError(f"profile {self.name!r}: kv_transfer lacks {', '.join(missing)} (needed to "
                               "simulate a disaggregated topology)")
        return KvTransfer(**{key: self.kv_transfer[key] for key in KV_TRANSFER_KEYS if key in self.kv_transfer})


def _profiles_dir() -> Any:
    return resources.files("prefillq.sim").joinpath("profiles")


def list_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.name[:-5] for p in _profiles_dir().iterdir() if p.name.endswith(".json"))


def _number(data: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    return check_number(f"{where}: {key}", data.get(key, default), error=ProfileError)


def cost_from_dict(data: dict[str, Any], where: str = "profile") -> CostModel:
    """The cost model of a profile's JSON object: its ``cost_form`` (default ``"linear"``) and coefficients."""
    form = data.get("cost_form", "linear")
    if form not in COST_FORMS:
        raise ProfileError(f"{where}: unknown cost_form {form!r}; valid: {', '.join(COST_FORMS)}")
    coefficients = {
        "step_overhead_s": _number(data, "step_overhead_s", where),
        "prefill_token_s": _number(data, "prefill_token_s", where),
        **{key: _number(data, key, where, 0.0) for key in COEFFICIENTS[2:]},
    }
    if form == "linear":
        given = [key for key in ROOFLINE_KEYS if key in data]
        if given:
            raise ProfileError(f"{where}: {', '.join(given)} only apply to cost_form \"roofline\" (this profile's "
                               f"form is \"linear\"); valid forms: {', '.join(COST_FORMS)}")
        return CostModel(**coefficients)
    missing = [key for key in ROOFLINE_KEYS if key not in data]
    if missing:
        raise ProfileError(f"{where}: cost_form \"roofline\" needs {', '.join(missing)}")
    knees = {key: check_number(f"{where}: {key}", data[key], strict=True, error=ProfileError) for key in ROOFLINE_KEYS}
    return RooflineCostModel(**coefficients, **knees)


def cost_to_dict(cost: CostModel) -> dict[str, Any]:
    """The profile keys that describe ``cost`` (the inverse of :func:`cost_from_dict`)."""
    out: dict[str, Any] = {}
    if cost.form != "linear":
        out["cost_form"] = cost.form
    out.update({key: getattr(cost, key) for key in COEFFICIENTS})
    if isinstance(cost, RooflineCostModel):
        out.update({key: getattr(cost, key) for key in ROOFLINE_KEYS})
    return out


def profile_from_dict(data: dict[str, Any], where: str = "profile") -> Profile:
    """Validate a profile's JSON object."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object")
    cost = cost_from_dict(data, where)
    given = data.get("defaults", {})
    if not isinstance(given, dict):
        raise ProfileError(f"{where}: defaults must be an object")
    reject_unknown_keys(given, DEFAULT_LIMITS, f"{where}: defaults", error=ProfileError)
    defaults = dict(DEFAULT_LIMITS)
    for key, value in given.items():
        defaults[key] = check_int(f"{where}: defaults.{key}", value, error=ProfileError)
    kv_transfer = data.get("kv_transfer") or {}
    if not isinstance(kv_transfer, dict):
        raise ProfileError(f"{where}: kv_transfer must be an object")
    for key in KV_TRANSFER_KEYS:
        if key in kv_transfer:
            _number(kv_transfer, key, f"{where}: kv_transfer")
    known = {"name", "description", "source", "defaults", "kv_transfer", "frontend_s", "frontend_per_seq_s",
             "cost_form", *COEFFICIENTS, *ROOFLINE_KEYS}
    return Profile(
        name=str(data.get("name", where)),
        description=str(data.get("description", "")),
        source=str(data.get("source", "")),
        cost=cost,
        defaults=defaults,
        kv_transfer=dict(kv_transfer),
        extra={k: v for k, v in data.items() if k not in known},
        frontend_s=_number(data, "frontend_s", where, 0.0),
        frontend_per_seq_s=_number(data, "frontend_per_seq_s", where, 0.0),
    )


def profile_data(profile: str | Path) -> tuple[dict[str, Any], str]:
    """A profile's JSON object, by packaged name or JSON file path, and the name errors call it by."""
    text = str(profile)
    if text.endswith(".json") or "/" in text or Path(text).is_file():
        path = Path(text)
        try:
            return json.loads(path.read_text(encoding="utf-8")), str(path)
        except FileNotFoundError:
            raise ProfileError(f"{path}: no such profile file") from None
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not valid JSON ({exc})") from None
    try:
        raw = _profiles_dir().joinpath(f"{text}.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"unknown profile {text!r}; available: {', '.join(list_profiles())}") from None
    try:
        return json.loads(raw), f"profile {text!r}"
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {text!r}: not valid JSON ({exc})") from None


@cache
def _load_packaged(name: str) -> Profile:
    data, where = profile_data(name)
    return profile_from_dict(data, where=where)


def load_profile(profile: str | Path | Profile) -> Profile:
    """A profile by packaged name (``h100-qwen3.5-0.8b``), by JSON file path, or passed through."""
    if isinstance(profile, Profile):
        return profile
    text = str(profile)
    if text.endswith(".json") or "/" in text or Path(text).is_file():
        data, where = profile_data(text)
        return profile_from_dict(data, where=where)
    return _load_packaged(text)
