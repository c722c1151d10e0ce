"""The engine-neutral view of a waiting request (SPEC §2)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class QueuedRequest:
    """What a prefill-queue policy knows about one request.

    ``priority`` is the *internal* inference priority (lower runs earlier, 0 is normal, negative is
    elevated). Only engine-internal code may set it; nothing a client sends maps onto it.
    ``admission_priority`` belongs to the router (SPEC §5) and no prefill policy reads it.
    """

    request_id: str
    prompt_tokens: int
    cached_tokens: int = 0
    output_tokens: int = 0
    priority: int = 0
    admission_priority: int = 0
    is_decode: bool = False
    resumed: bool = False
    segment_index: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        for name in ("prompt_tokens", "cached_tokens", "output_tokens", "segment_index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        for name in ("priority", "admission_priority"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")

    @classmethod
    def trusted(cls, request_id: str, prompt_tokens: int) -> QueuedRequest:
        """A view with every other field at its default, built without the checks: for an engine model
        whose ids and token counts are valid by construction (the simulator builds one per request)."""
        view = object.__new__(cls)
        view.request_id, view.prompt_tokens = request_id, prompt_tokens
        view.cached_tokens = view.output_tokens = view.priority = view.admission_priority = view.segment_index = 0
        view.is_decode = view.resumed = False
        return view

    @property
    def remaining_prefill_tokens(self) -> int:
        """Prompt tokens whose KV still has to be computed."""
        return max(0, self.prompt_tokens - self.cached_tokens)

    def __hash__(self) -> int:
        return hash(self.request_id)

    def __eq__(self, other: object) -> bool:
        return self is other
