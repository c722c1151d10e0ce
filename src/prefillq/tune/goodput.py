"""``tune --ttft-slo``: the configuration that maximises TTFT-SLO goodput (SPEC §6).

Every candidate run (each policy with ``partial_prefills`` first, and the reordering ones with
"ordered") carries its goodput; the one with the highest share of requests meeting the SLO wins.
Shares within :data:`GOODPUT_TIE` of the highest count as equal; among equals the recipe's own
preference decides (the short-TTFT choice it would make without an SLO first, then "first" over
"ordered", then the fixed order of the candidates), so an SLO that every policy meets keeps the
usual recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefillq.tune.choose import ORDERED_POLICIES, POLICIES_SIMULATED, ordered_label

GOODPUT_TIE = 0.005
"""Goodputs within half a percentage point of the best are treated as equal."""


@dataclass
class GoodputChoice:
    policy: str
    partial_prefills: str
    goodput: float
    reason: str


def candidates() -> list[tuple[str, str, str]]:
    """(summary label, policy, partial_prefills) of every candidate run, in the tie-break order."""
    return ([(name, name, "first") for name in POLICIES_SIMULATED]
            + [(ordered_label(name), name, "ordered") for name in ORDERED_POLICIES])


def choose_by_goodput(summaries: dict[str, dict[str, Any]], slo: Any, *, usual: tuple[str, str]) -> GoodputChoice:
    """The candidate with the highest goodput; ``usual`` = (policy, partial_prefills) chosen without an SLO."""
    runs = [(label, policy, mode, summaries[label].get("goodput")) for label, policy, mode in candidates()
            if label in summaries and summaries[label].get("goodput") is not None]
    if not runs:
        raise ValueError("no candidate run has a goodput figure (the SLO covers none of the requests)")
    best = max(goodput for *_, goodput in runs)
    equals = [(label, policy, mode, g) for label, policy, mode, g in runs if g >= best - GOODPUT_TIE]
    usual_label = ordered_label(usual[0]) if usual[1] == "ordered" else usual[0]
    equals.sort(key=lambda run: (run[0] != usual_label, run[2] != "first"))
    label, policy, mode, goodput = equals[0]
    others = ", ".join(f"{other} {g:.1%}" for other, _, _, g in sorted(runs, key=lambda r: -r[3])[:4]
                       if other != label)
    tie = (f"; {len(equals) - 1} other run(s) come within {GOODPUT_TIE:.1%} and the usual recommendation "
           "breaks the tie" if len(equals) > 1 else "")
    reason = (f"it maximises goodput under the TTFT SLO {slo}: {goodput:.1%} of requests meet it "
              f"(next: {others}){tie}")
    return GoodputChoice(policy=policy, partial_prefills=mode, goodput=goodput, reason=reason)
