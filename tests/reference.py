"""A deliberately naive reference model of every policy, written straight from SPEC §3.

It keeps a plain list and re-derives the whole order from the spec's definitions on every call, using
exact fractions for HRRN scores. The real queues must agree with it operation by operation.
"""

from __future__ import annotations

from fractions import Fraction

from prefillq.requests import QueuedRequest


class RefItem:
    def __init__(self, req: QueuedRequest, seq: int, arrival: int, t0: float, pa: int, cost: int | None,
                 partial: bool = False):
        self.req, self.seq, self.arrival, self.t0, self.pa, self.cost = req, seq, arrival, t0, pa, cost
        self.partial = partial  # a partial prefill (SPEC §3.6): running, not in the queue


class RefQueue:
    def __init__(self, policy: str, threshold: int = 256, long_max_wait_ms: float = 0.0, clock=lambda: 0.0):
        self.policy = policy
        self.threshold = threshold
        self.max_wait_s = long_max_wait_ms / 1000.0
        self.clock = clock
        self.items: list[RefItem] = []
        self.P = 0
        self.promoted = False
        self.pinned: RefItem | None = None
        self.memory: dict[str, tuple] = {}
        self.next_seq = 0
        self.next_front = -1
        self.streak = 0
        self.warnings = 0
        self.aged_promotions = 0
        self.dispatches = 0
        # SPEC §3.0: this step's pops, in order; a pop that comes back in the same step is erased from
        # the step and everything it influenced is re-derived from the step's starting state.
        self.step_pops: list[tuple[str, bool, str, bool]] = []  # (id, in rest group, lane, shorts waited)
        self.step_resets: list[int] = []  # positions in step_pops before which the short lane emptied
        self.step_start = (0, 0)  # (streak, warnings)
        self.partial_promoted = False  # promote_shortest: this step's promotion went to a partial prefill
        self.aged_partials: set[str] = set()

    # groups ------------------------------------------------------------------------------------
    def group(self, item: RefItem) -> str:
        req = item.req
        if req.is_decode:
            return "decode"
        # SPEC §4.1: back after streaming output (preempted mid-stream) -> first, in the order they came
        # back, under every policy (default and short_request_first get there by their own rules)
        if (self.policy not in ("default", "short_request_first") and req.resumed
                and req.output_tokens > 0 and req.segment_index == 0):
            return "decode"
        if item.req.priority < 0:
            return "priority"
        return "rest"

    def lane(self, item: RefItem) -> str:
        if item.req.resumed and not item.partial:
            return "immediate"
        return "short" if item.req.prompt_tokens <= self.threshold else "long"

    def bind_cost(self, item: RefItem) -> None:
        if self.group(item) == "rest" and item.cost is None:
            item.cost = max(1, item.req.prompt_tokens - item.req.cached_tokens)

    # operations ---------------------------------------------------------------------------------
    def add(self, req: QueuedRequest) -> None:
        self.memory.pop(req.request_id, None)
        item = RefItem(req, self.next_seq, self.next_seq, self.clock(), self.P, None)
        self.next_seq += 1
        self.bind_cost(item)
        self.items.append(item)
        self.pinned = None

    def prepend(self, req: QueuedRequest) -> None:
        self.skip(req)
        seq = self.next_front
        self.next_front -= 1
        if req.request_id in self.memory:
            t0, pa, cost, arrival = self.memory.pop(req.request_id)
            item = RefItem(req, seq, arrival, t0, pa, cost)
        else:
            item = RefItem(req, seq, seq, self.clock(), self.P, None)
        self.bind_cost(item)
        self.items.append(item)
        self.pinned = None

    def remove(self, request_id: str) -> None:
        self.memory.pop(request_id, None)
        before = len(self.items)
        removed = [i for i in self.items if i.req.request_id == request_id]
        self.items = [i for i in self.items if i.req.request_id != request_id]
        if len(self.items) != before:
            self.pinned = None
            if removed and self.policy == "short_request_first" and self.group(removed[0]) == "rest" \
                    and self.lane(removed[0]) == "short" and not self._lane_items("short"):
                self.step_resets.append(len(self.step_pops))
                self._derive_step()

    def step(self, tokens: int) -> None:
        self.P += tokens
        self.promoted = self.partial_promoted = False
        self.pinned = None
        self.step_pops, self.step_resets = [], []
        self.step_start = (self.streak, self.warnings)

    def skip(self, req: QueuedRequest) -> None:
        """Erase this step's pop of ``req``, if any (it was skipped, not dispatched)."""
        ids = [p[0] for p in self.step_pops]
        if req.request_id not in ids:
            return
        at = ids.index(req.request_id)
        pop = self.step_pops.pop(at)
        self.step_resets = [r - 1 if r > at else r for r in self.step_resets]
        self.dispatches -= 1
        if pop[2] == "long" and pop[3]:
            self.aged_promotions -= 1
        self.pinned = None
        self._derive_step()

    def _derive_step(self) -> None:
        """Promotion flag, streak and warnings of this step, from its start and its pops."""
        self.promoted = self.partial_promoted or any(p[1] for p in self.step_pops if p[2] != "partial")
        streak, warnings = self.step_start
        for i in range(len(self.step_pops) + 1):
            if i in self.step_resets:
                streak = 0
            if i == len(self.step_pops):
                break
            _, rest, lane, shorts = self.step_pops[i]
            if lane == "partial":  # a partial long prefill's aged-long promotion
                lane = "long"
            if rest and self.policy == "short_request_first" and lane in ("short", "long"):
                streak = streak + 1 if lane == "long" and shorts else 0
                warnings += streak == 3
        self.streak, self.warnings = streak, warnings

    def order(self, items: list[RefItem] | None = None) -> list[RefItem]:
        items = self.items if items is None else items
        decodes = sorted((i for i in items if self.group(i) == "decode"), key=lambda i: i.seq)
        elevated = sorted((i for i in items if self.group(i) == "priority"),
                          key=lambda i: (i.req.priority if self.policy == "default" else 0, i.seq))
        rest = [i for i in items if self.group(i) == "rest"]
        if self.policy == "default":
            rest.sort(key=lambda i: (i.req.priority, i.seq))
        elif self.policy == "promote_shortest":
            rest.sort(key=lambda i: i.seq)
            if rest and not self.promoted:
                best = min(rest, key=lambda i: (max(0, i.req.prompt_tokens - i.req.cached_tokens), i.seq))
                rest.remove(best)
                rest.insert(0, best)
        elif self.policy == "hrrn":
            rest.sort(key=lambda i: (-Fraction(self.P - i.pa, i.cost), i.arrival, i.req.request_id))
        elif self.policy == "auto":
            rest.sort(key=self._auto_key)
        else:
            rest = self._srf_order(items)
        return decodes + elevated + rest

    def _auto_key(self, item: RefItem) -> tuple[int, int, int]:
        """auto (docs/auto.md): due requests (deadline reached) earliest deadline first, then the rest by
        least remaining prefill; queue position breaks ties."""
        from prefillq.policies.auto import GRACE_TOKENS, SLOWDOWN

        deadline = item.pa + SLOWDOWN * item.cost + GRACE_TOKENS
        if deadline <= self.P:
            return (0, deadline, item.seq)
        return (1, max(0, item.req.prompt_tokens - item.req.cached_tokens), item.seq)

    def _lane_items(self, lane: str, items: list[RefItem] | None = None) -> list[RefItem]:
        items = self.items if items is None else items
        return sorted((i for i in items if self.group(i) == "rest" and self.lane(i) == lane),
                      key=lambda i: i.seq)

    def _srf_order(self, items: list[RefItem] | None = None) -> list[RefItem]:
        now = self.clock()
        immediate = self._lane_items("immediate", items)
        short = self._lane_items("short", items)
        long = self._lane_items("long", items)
        out = list(immediate)
        while short or long:
            aged = bool(long) and self.max_wait_s > 0 and now - long[0].t0 >= self.max_wait_s
            if long and (not short or aged):
                out.append(long.pop(0))
            else:
                out.append(short.pop(0))
        return out

    def peek(self) -> QueuedRequest:
        if self.pinned is None:
            self.pinned = self.order()[0]
        return self.pinned.req

    def pop(self) -> QueuedRequest:
        item = self.pinned if self.pinned is not None else self.order()[0]
        self.pinned = None
        rest = self.group(item) == "rest"
        lane = self.lane(item) if rest else ""
        shorts = any(i is not item for i in self._lane_items("short"))
        if rest and self.policy == "short_request_first" and lane == "long" and shorts:
            self.aged_promotions += 1
        self.dispatches += 1
        self.step_pops.append((item.req.request_id, rest, lane, shorts))
        self._derive_step()
        self.items.remove(item)
        self.memory[item.req.request_id] = (item.t0, item.pa, item.cost, item.arrival)
        return item.req


    def plan(self, partials: list[QueuedRequest], budget: int, free_seats: int, demand) -> dict[str, int]:
        """SPEC §3.6, naively: rank partial prefills and waiting requests together, hand out the budget."""
        parts = []
        for req in partials:
            key = req.request_id
            if key not in self.memory:
                self.memory[key] = (self.clock(), self.P, max(1, req.prompt_tokens - req.cached_tokens),
                                    self.next_seq)
                self.next_seq += 1
            t0, pa, cost, arrival = self.memory[key]
            parts.append(RefItem(req, arrival, arrival, t0, pa, cost, partial=True))
        if self.policy == "promote_shortest" and not self.promoted:
            rest = [i for i in self.items + parts if self.group(i) == "rest"]
            if rest and min(rest, key=lambda i: (max(0, i.req.prompt_tokens - i.req.cached_tokens), i.seq)).partial:
                self.partial_promoted = self.promoted = True
                head = min(rest, key=lambda i: (max(0, i.req.prompt_tokens - i.req.cached_tokens), i.seq))
                order = [i for i in self.order(self.items + parts) if i is not head]
                front = sum(1 for i in order if self.group(i) != "rest")
                order.insert(front, head)  # at the head of its group
            else:
                order = self.order(self.items + parts)
        else:
            order = self.order(self.items + parts)
        self.aged_partials &= {r.request_id for r in partials}
        caps = {}
        now = self.clock()
        for item in order:
            take = min(max(0, demand(item.req, budget)), budget) if budget > 0 else 0
            if item.partial:
                caps[item.req.request_id] = take
                key = item.req.request_id
                if (take and self.policy == "short_request_first" and self.group(item) == "rest"
                        and self.lane(item) == "long"
                        and key not in self.aged_partials and self._lane_items("short")
                        and self.max_wait_s > 0 and now - item.t0 >= self.max_wait_s):
                    self.aged_partials.add(key)
                    self.aged_promotions += 1
                    self.step_pops.append((key, True, "partial", True))
                    self._derive_step()
                budget -= take
            elif free_seats > 0 and take:
                budget -= take
                free_seats -= 1
        return caps


class RefRanker:
    """A naive LightLLM-style re-rank: the reference queue re-derived from the current ready list.

    A request keeps the arrival state it got when it first appeared in the list (position, clock
    value, counter value, frozen cost); every other attribute is read from its view as it is now.
    """

    def __init__(self, policy: str, **kwargs) -> None:
        self.ref = RefQueue(policy, **kwargs)

    def rank(self, ready: list[QueuedRequest]) -> list[QueuedRequest]:
        ids = {r.request_id for r in ready}
        self.ref.items = [i for i in self.ref.items if i.req.request_id in ids]
        known = {i.req.request_id: i for i in self.ref.items}
        for req in ready:
            if req.request_id in known:
                self.ref.bind_cost(known[req.request_id])
            else:
                self.ref.add(req)
        return [i.req for i in self.ref.order()]

    def step(self, tokens: int) -> None:
        self.ref.step(tokens)
