"""One self-contained HTML page per results folder (``compare --out``, ``bench``, ``sweep --out``): its
tables and every PNG plot of the folder, embedded as base64 data URIs, so the single file opens in any
browser with no server and can be mailed or attached as it is."""

from __future__ import annotations

import base64
import csv
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPORT_NAME = "report.html"

# (column key, heading) of the tables; headings in words with units.
COMPARE_TABLE = (("policy", "policy"), ("short_ttft_mean_ms", "short TTFT mean (ms)"),
                 ("short_ttft_p50_ms", "short TTFT P50 (ms)"), ("short_ttft_p95_ms", "short TTFT P95 (ms)"),
                 ("long_ttft_p95_ms", "long TTFT P95 (ms)"), ("long_e2e_p95_ms", "long end-to-end P95 (ms)"),
                 ("short_tpot_p50_ms", "short time per output token P50 (ms)"),
                 ("output_tokens_per_s", "output (tokens/s)"), ("completed", "completed"), ("failed", "failed"))
SWEEP_TABLE = (("policy", "policy"), ("budget", "budget (tokens/step)"), ("replicas", "replicas"),
               ("rate_scale", "rate scale (×)"), ("short_ttft_p50_ms", "short TTFT P50 (ms)"),
               ("short_ttft_p95_ms", "short TTFT P95 (ms)"), ("long_ttft_p95_ms", "long TTFT P95 (ms)"),
               ("output_tokens_per_s", "output (tokens/s)"), ("token_imbalance", "token imbalance (max/mean)"),
               ("gateway_wait_p95_ms", "gateway wait P95 (ms)"), ("completed", "completed"),
               ("warnings", "warnings"))

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       padding: 0 1rem; color: #1a1a1a; background: #fff; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { border: 1px solid #d0d0d0; padding: 0.3rem 0.6rem; }
th { background: #f2f4f7; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85rem; color: #555; }
.meta, .note { color: #555; font-size: 0.85rem; }
.answer { border-left: 4px solid #2e7d32; padding: 0.2rem 1rem; background: #f3f9f3; }
pre { white-space: pre-wrap; word-break: break-all; background: #f6f8fa; padding: 0.6rem; font-size: 0.85rem; }
tr.recommended td { background: #eaf5ea; font-weight: 600; }
"""
# (figure key, heading, change key) of the recommendation's before/after table
_RECOMMENDATION_FIGURES = (
    ("short_ttft_p95_ms", "short TTFT P95 (ms)", "short_ttft_p95_change"),
    ("long_ttft_p95_ms", "long TTFT P95 (ms)", "long_ttft_p95_change"),
    ("short_tpot_p50_ms", "short time per output token P50 (ms)", "short_tpot_p50_change"),
    ("output_tokens_per_s", "output (tokens/s)", "output_tokens_per_s_change"))
_BRACKET_COLUMNS = (("row", ""), ("short_ttft_mean_ms", "short TTFT mean (ms)"),
                    ("short_ttft_p50_ms", "short TTFT P50 (ms)"), ("short_ttft_p95_ms", "short TTFT P95 (ms)"))


def _cell(value: Any) -> tuple[str, bool]:
    """A value as table text, and whether it is a number (right-aligned)."""
    if value is None or value == "":
        return "–", False
    if isinstance(value, bool):
        return str(value), False
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value, False
        value = int(number) if number.is_integer() and "." not in value else number
    if isinstance(value, int):
        return f"{value:,}", True
    if isinstance(value, float):
        if value != value:
            return "–", False
        text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
        return text, True
    if isinstance(value, list | tuple):
        return "; ".join(str(v) for v in value), False
    return str(value), False


def html_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], *,
               marked: Mapping[int, str] | None = None) -> str:
    """The rows as an HTML table of the given ``(key, heading)`` columns; columns no row has are left out;
    ``marked`` gives some rows (by index) a CSS class."""
    shown = [(key, heading) for key, heading in columns if any(row.get(key) not in (None, "", []) for row in rows)]
    head = "".join(f"<th>{html.escape(heading)}</th>" for _, heading in shown)
    body = []
    for index, row in enumerate(rows):
        cells = []
        for key, _ in shown:
            text, numeric = _cell(row.get(key))
            cells.append(f'<td class="num">{html.escape(text)}</td>' if numeric else f"<td>{html.escape(text)}</td>")
        css = (marked or {}).get(index)
        body.append(f'<tr class="{css}">' if css else "<tr>")
        body[-1] += f"{''.join(cells)}</tr>"
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    name = html.escape(path.name)
    return (f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
            f"<figcaption>{name}</figcaption></figure>")


def html_page(title: str, tables: Sequence[tuple[str, str]], images: Sequence[Path], *,
              notes: Sequence[str] = (), files: Sequence[str] = ()) -> str:
    """The whole page: ``tables`` as (heading, section HTML: a table, or the recommendation), then each PNG
    embedded, then the folder's other files (names only: they sit next to the report)."""
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><p class=\"meta\">prefillq report</p>"]
    parts += [f'<p class="note">{html.escape(note)}</p>' for note in notes]
    for heading, table in tables:
        parts.append(f"<h2>{html.escape(heading)}</h2>{table}")
    if images:
        parts.append("<h2>Plots</h2>")
        parts += [_image(path) for path in images]
    if files:
        parts.append("<h2>Files in this folder</h2><ul>" + "".join(
            f"<li><code>{html.escape(name)}</code></li>" for name in files) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _csv_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _bench_rows(summary: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """A bench summary as rows (one per metric) and columns (one per policy, value and paired change)."""
    from prefillq.report.bench import TABLE_ROWS, class_counts, class_rows, interval_text

    policies = summary.get("policies", {})
    baseline = summary.get("baseline", "default")
    intervals = summary.get("intervals", {})
    rows = []
    for key, heading, _ in [*TABLE_ROWS, *class_rows(summary)]:
        row: dict[str, Any] = {"metric": heading}
        for policy, block in policies.items():
            row[policy] = block.get(key)
            metrics = intervals.get(f"{policy}_vs_{baseline}", {}).get("metrics", {})
            if policy != baseline and metrics:
                row[f"{policy} change"] = interval_text(metrics.get(key))
        rows.append(row)
    rows.append({"metric": "completed", **{p: b.get("completed") for p, b in policies.items()}})
    rows += [{"metric": heading, **dict(zip(policies, cells, strict=True))} for heading, cells in class_counts(summary)]
    columns = [("metric", "metric")]
    for policy in policies:
        columns.append((policy, policy))
        if policy != baseline:
            columns.append((f"{policy} change", f"{policy} vs {baseline} [95% interval]"))
    return rows, columns


def _compare_summary(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def compare_sections(folder: Path) -> list[tuple[str, str]]:
    """A compare folder's sections: the recommendation (what to run, what it buys and costs), every row
    with its change vs default (the recommended one marked), and the bracket of the optimum short TTFT."""
    data = _compare_summary(folder)
    policies = data.get("policies") or {}
    rec = data.get("recommendation")
    sections: list[tuple[str, str]] = []
    if rec:
        sections.append(("What to run", recommendation_html(rec)))
    rows: list[dict[str, Any]] = []
    for label, entry in policies.items():
        rows.append({"policy": label, **entry})
        change = entry.get("change_vs_default") or {}
        if label != data.get("baseline") and change:
            rows.append({"policy": f"{label}: change vs {data.get('baseline')}",
                         **{key: _percent(change.get(key)) for key, _ in COMPARE_TABLE[1:]}})
    if not rows:  # an older folder: the CSV has the figures
        rows = _csv_rows(folder / "summary.csv")
    marked = {i: "recommended" for i, row in enumerate(rows) if rec and row.get("policy") == rec.get("row")}
    sections.append(("Summary per policy", html_table(rows, COMPARE_TABLE, marked=marked)))
    bracket = bracket_html(data.get("bound"), data.get("achievable"))
    if bracket:
        sections.append(("Where the optimum lies (short TTFT)", bracket))
    return sections


def _percent(value: Any) -> str:
    return "" if value is None else f"{value * 100:+.1f}%"


def recommendation_html(rec: Mapping[str, Any]) -> str:
    """The recommendation: the row, its figures before (default) and after, and the line to run."""
    baseline = rec.get("baseline")
    if rec.get("is_default"):
        lead = ("Keep <b>default</b>: no other row cuts short TTFT P95 while keeping long TTFT P95 within "
                f"+{rec['rule']['long_ttft_p95_max_change']:.0%} of default's, output within "
                f"-{rec['rule']['throughput_max_drop']:.0%} and a starvation bound.")
    else:
        lead = (f"Run <b>{html.escape(str(rec.get('row')))}</b>: the lowest short TTFT P95 of the rows that keep "
                f"long TTFT P95 within +{rec['rule']['long_ttft_p95_max_change']:.0%} of default's, output within "
                f"-{rec['rule']['throughput_max_drop']:.0%}, and that have a starvation bound.")
    figures = [{"figure": heading, "before": (rec.get(key) or {}).get("before"),
                "after": (rec.get(key) or {}).get("after"), "change": _percent(rec.get(change))}
               for key, heading, change in _RECOMMENDATION_FIGURES]
    table = html_table(figures, (("figure", ""), ("before", f"before ({baseline or 'no default row'})"),
                                 ("after", "after"), ("change", "change")))
    parts = [f'<div class="answer"><p>{lead}</p>', table, class_recommendation_html(rec)]
    if rec.get("engine") == "lightllm":
        parts.append(f"<p>LightLLM: <code>{html.escape(str(rec.get('command')))}</code></p>")
        auto = rec.get("auto")
        if auto:
            after = (auto.get("short_ttft_p95_ms") or {}).get("after")
            verdict = "within the limits" if auto.get("qualifies") else f"but {auto.get('why_not')}"
            parts.append(f"<p>prefillq's auto (not in stock LightLLM) reaches short TTFT P95 "
                         f"{html.escape(_cell(after)[0])} ms on this run, {html.escape(verdict)}.</p>")
    else:
        parts.append(f"<pre><code>{html.escape(str(rec.get('command')))}</code></pre>")
    parts.append("</div>")
    return "".join(parts)


# (figure key, heading, change key) of the per-class before/after table (compare --scheduling-policy priority)
_CLASS_FIGURES = (("short_ttft_p95_ms", "short TTFT P95 (ms)", "short_ttft_p95_change"),
                  ("long_ttft_p95_ms", "long TTFT P95 (ms)", "long_ttft_p95_change"),
                  ("ttft_p95_ms", "TTFT P95, all requests (ms)", "ttft_p95_change"))


def class_recommendation_html(rec: Mapping[str, Any]) -> str:
    """With priority classes: how the row was chosen, and each class's figures before and after ("" without)."""
    per_class, chosen = rec.get("per_class"), rec.get("chosen_by")
    if not per_class or not chosen:
        return ""
    rows = [{"class": f"class {klass}" + (" (served first)" if int(klass) == chosen["high_class"] else
                                          " (served last)" if int(klass) == chosen["low_class"] else ""),
             "figure": heading, "before": (figures.get(key) or {}).get("before"),
             "after": (figures.get(key) or {}).get("after"), "change": _percent(figures.get(change))}
            for klass, figures in per_class.items() for key, heading, change in _CLASS_FIGURES
            if (figures.get(key) or {}).get("after") is not None]
    lead = (f"Chosen on {html.escape(chosen['high'])}, with {html.escape(chosen['low'])} held to the same limits. "
            "Per class:")
    return f"<p>{lead}</p>" + html_table(rows, (("class", "class"), ("figure", ""),
                                               ("before", f"before ({rec.get('baseline') or 'no default row'})"),
                                               ("after", "after"), ("change", "change")))


def bracket_html(bound: Mapping[str, Any] | None, achievable: Mapping[str, Any] | None) -> str:
    """The proven lower bound and the best a clairvoyant schedule reached, with their methods."""
    if not bound:
        return ""
    rows = [{"row": "proven lower bound (no schedule beats it)", **bound}]
    if achievable:
        rows.append({"row": "best reached by a clairvoyant schedule", **achievable})
    notes = [f"Lower bound: {bound.get('method')}."]
    if achievable:
        notes.append(f"Clairvoyant schedules: {achievable.get('method')}.")
    return html_table(rows, _BRACKET_COLUMNS) + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)


def _credit(folder: Path) -> list[str]:
    """The sample traces' credit (their CC-BY licence asks for it wherever a result from them is shown)."""
    from prefillq.workload.samples import CREDIT, SAMPLE_PREFIX

    traces = []
    for name, pick in (("summary.json", lambda d: (d.get("workload") or {}).get("trace")),
                       ("sweep.json", lambda d: (d.get("grid") or {}).get("trace"))):
        try:
            traces.append(pick(json.loads((folder / name).read_text(encoding="utf-8"))))
        except (OSError, ValueError, AttributeError):
            continue
    return [CREDIT] if any(str(t).startswith(SAMPLE_PREFIX) for t in traces if t) else []


def write_html_report(folder: str | Path, title: str, *, kind: str,
                      summary: Mapping[str, Any] | None = None) -> Path:
    """Write ``folder/report.html`` for a results folder of ``kind`` ``compare`` (reads summary.csv),
    ``sweep`` (sweep.csv) or ``bench`` (``summary``, the bench summary), with every PNG of the folder."""
    folder = Path(folder)
    tables: list[tuple[str, str]] = []
    notes: list[str] = []
    if kind == "compare":
        tables += compare_sections(folder)
        rows = _csv_rows(folder / "summary.csv")
        split = next((row for row in rows if row.get("split_threshold")), None)
        if split:
            notes.append(f"Short requests: prompt ≤ {split['split_threshold']} tokens ({split.get('split_method')}).")
    elif kind == "sweep":  # sweep.json keeps each cell's warnings as a list
        rows = json.loads((folder / "sweep.json").read_text(encoding="utf-8")).get("rows", [])
        tables.append(("One row per cell", html_table(rows, SWEEP_TABLE)))
    elif kind == "bench":
        rows, columns = _bench_rows(summary or {})
        tables.append(("Medians over the measured rounds", html_table(rows, columns)))
        notes += [f"warning: {w}" for w in (summary or {}).get("warnings", [])]
    else:
        raise ValueError(f"unknown report kind {kind!r}; kinds: compare, sweep, bench")
    notes += _credit(folder)
    images = sorted(folder.glob("*.png"), key=lambda p: (p.name != "ttft_cdf.png", p.name))
    files = sorted(p.name for p in folder.iterdir() if p.name != REPORT_NAME and p.suffix != ".png")
    path = folder / REPORT_NAME
    path.write_text(html_page(title, tables, images, notes=notes, files=files), encoding="utf-8")
    return path
