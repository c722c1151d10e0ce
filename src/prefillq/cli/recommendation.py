"""How ``prefillq compare`` words its recommendation (sim/recommend.py chooses it): what to run and what it
buys, what it costs, and the line to paste; the same words under the Markdown table."""

from __future__ import annotations

import math
from typing import Any


def ms(value: Any) -> str:
    """A duration as the table shows it, with its unit."""
    from prefillq.report.tables import format_value

    return format_value(value, "ms") + " ms"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%" if abs(value) < 1 else f"{value * 100:+.0f}%"


COST_LINE_WIDTH = 80  # the cost line drops short TPOT's before/after figures rather than wrap past this


def _ranged(rec: dict[str, Any], key: str) -> str:
    """A cost change as the range the model's measured error gives it, ``-19..+21%`` (the simulated change
    alone where no range is known)."""
    ranged = (rec.get("cost_ranges") or {}).get(key)
    if ranged is None:
        return _pct(rec.get(key))
    return f"{ranged['low'] * 100:+.0f}..{ranged['high'] * 100:+.0f}%"


def _cost_line(rec: dict[str, Any], tpot: dict[str, Any], end: str) -> str:
    """What the answer costs, each change as a range: long TTFT p95, short TPOT p50 (with its before/after
    figures where the line still fits 80 columns) and output throughput."""
    long, short, output = (_ranged(rec, key) for key in ("long_ttft_p95_change", "short_tpot_p50_change",
                                                         "output_tokens_per_s_change"))
    line = f"It costs long TTFT p95 {long}, short TPOT p50 {_arrow(tpot)} ({short}), output {output}{end}"
    if len(line) > COST_LINE_WIDTH:
        line = f"Costs long TTFT p95 {long}, short TPOT p50 {short}, tok/s {output}{end}"
    return line


def recommendation_lines(rec: dict[str, Any]) -> list[str]:
    """The recommendation in plain words, at most four lines: what to run and what it buys, what it costs,
    then the vLLM command (one line) or, in LightLLM mode, what prefillq's auto adds. ``over_limit_line``
    follows them."""
    lightllm = rec["engine"] == "lightllm"
    short, tpot = rec["short_ttft_p95_ms"], rec["short_tpot_p50_ms"]
    rule = rec["rule"]
    verb, name = ("Use", rec["command"]) if lightllm and rec.get("lightllm_strategy") else ("Run", rec["row"])
    if rec["baseline"] is None:
        lines = [f"{verb} {name}: short TTFT p95 {ms(short['after'])}, the best of the rows with a starvation "
                 "bound; no default row to weigh its cost against (add --policy default)."]
    elif rec["is_default"]:
        stock = "LightLLM's default strategy" if lightllm else "stock vLLM's order"
        lines = [f"Keep default ({stock}): no other row cuts short TTFT p95 with long TTFT p95 within "
                 f"+{rule['long_ttft_p95_max_change']:.0%}, output within -{rule['throughput_max_drop']:.0%} and "
                 "a starvation bound."]
    else:
        lines = [f"{verb} {name}: short TTFT p95 {_arrow(short)} ({_pct(rec['short_ttft_p95_change'])}).",
                 _cost_line(rec, tpot, "." if lightllm else ", with:")]
    if lightllm:
        lines.append(_auto_line(rec.get("auto"), rec))
    else:
        lines.append(f"Run: {rec['command']}")
    return lines


def over_limit_line(rec: dict[str, Any]) -> str | None:
    """The better short tail the limits turned down, in one sentence (None: there is none, or in LightLLM
    mode it is the auto row, which its own line reports)."""
    over = rec.get("over_limit")
    if over is None or (rec["engine"] == "lightllm" and (rec.get("auto") or {}).get("row") == over["row"]):
        return None
    line = (f"Over the limits: {over['row']} reaches {ms(over['short_ttft_p95_ms']['after'])} "
            f"({_pct(over['short_ttft_p95_change'])}), but {over['why_not']}")
    long_change, rule = over.get("long_ttft_p95_change"), rec["rule"]
    tput_change = over.get("output_tokens_per_s_change")
    if (long_change is not None and long_change > rule["long_ttft_p95_max_change"]
            and (tput_change is None or tput_change >= -rule["throughput_max_drop"] - 1e-12)):
        line += f"; --long-cost-limit {math.ceil(long_change * 100 - 1e-9)} accepts it"
    return line + "."


def _arrow(pair: dict[str, Any]) -> str:
    """``before → after ms``, the unit once."""
    from prefillq.report.tables import format_value

    return f"{format_value(pair['before'], 'ms')} → {ms(pair['after'])}"


def _auto_line(auto: dict[str, Any] | None, rec: dict[str, Any]) -> str:
    """LightLLM mode: what prefillq's ``auto`` (not a stock LightLLM strategy) would add on this run."""
    if auto is None:
        return "prefillq's auto was not run (add --policy auto to see what it would add)."
    after = auto["short_ttft_p95_ms"]["after"]
    if not auto["qualifies"]:
        return f"prefillq's auto (not in stock LightLLM): short TTFT p95 {ms(after)} here, but {auto['why_not']}."
    current = rec["short_ttft_p95_ms"]["after"]
    name = rec["lightllm_strategy"] or rec["row"]
    gain = "" if current in (None, 0) or after is None else f" ({_pct(after / current - 1)} vs {name})"
    return (f"prefillq's auto (not in stock LightLLM): short TTFT p95 {ms(after)}{gain} here, long TTFT p95 "
            f"{_pct(auto['long_ttft_p95_change'])}.")


def emulation_lines(data: dict[str, Any]) -> list[str]:
    """The rows that emulate another engine's own option, in one sentence (none: no line), and why none is
    recommended; with only such rows, that there is no recommendation."""
    emulated = data.get("emulations") or {}
    if not emulated:
        return []
    engine = "prefillq's vLLM plug-in" if data.get("mode", "vllm") == "vllm" else "LightLLM"
    names = "; ".join(f"{label} = {option}" for label, option in emulated.items())
    line = f"Emulations of other engines' options ({engine} does not run them; never recommended): {names}."
    if not data.get("recommendation"):
        line += " No other row, so no recommendation: add --policies default,auto."
    return [line]


def print_recommendation(console: Any, rec: dict[str, Any]) -> None:
    """The recommendation under the table; the command on one line, never broken (it is pasted whole)."""
    from rich.markup import escape

    *words, last = recommendation_lines(rec)
    for line in words:
        console.print(f"[bold]{escape(line)}[/bold]", highlight=False)
    if last.startswith("Run: "):
        console.print(escape(last.removeprefix("Run: ")), highlight=False, soft_wrap=True)
    else:
        console.print(escape(last), highlight=False)
    over = over_limit_line(rec)
    if over is not None:
        console.print(escape(over), highlight=False)


def markdown_notes(comparison: Any, rec: dict[str, Any] | None, data: dict[str, Any] | None = None) -> list[str]:
    """Under the Markdown table: the emulated rows, the recommendation, the command, and the bracket with
    its methods."""
    lines: list[str] = []
    for line in emulation_lines(data or {}):
        lines += [line, ""]
    if rec is not None:
        *words, last = recommendation_lines(rec)
        lines += [*words, ""]
        lines += (["```", last.removeprefix("Run: "), "```", ""] if last.startswith("Run: ") else [last, ""])
        over = over_limit_line(rec)
        lines += [over, ""] if over is not None else []
    bound = comparison.bound
    lines.append(f"Proven lower bound ({bound.get('method')}).")
    reference = comparison.achievable
    if reference is not None:
        lines.append("")
        lines.append(f"Best reached by a clairvoyant schedule: {reference['method']}; short TTFT p95 "
                     f"{ms(reference.get('short_ttft_p95_ms'))} by {reference['best'].get('short_ttft_p95_ms')}.")
    return lines
