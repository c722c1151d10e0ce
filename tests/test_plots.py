"""The pictures: identical series drawn once and named together, log axes where values span decades,
and every plot function writing a PNG."""

from __future__ import annotations

from prefillq.metrics import RequestRecord
from prefillq.report.plots import log_axis_if_wide, merge_identical, pyplot, queue_plot, ttft_cdf_plot
from prefillq.report.sweep import METRIC_LABELS, PLOT_METRICS, sweep_plots


def test_identical_series_are_drawn_once_under_a_joined_label():
    merged = merge_identical({"default": (1, 2), "hrrn": (1, 3), "short_request_first": (1, 3), "x": (1, 2)})
    assert merged == {"default = x": (1, 2), "hrrn = short_request_first": (1, 3)}
    assert merge_identical({"a": (1,), "b": (2,)}) == {"a": (1,), "b": (2,)}


def test_log_axis_only_where_values_span_decades():
    plt = pyplot()
    fig, ax = plt.subplots()
    assert not log_axis_if_wide(ax, [20.0, 35.0, 110.0]) and ax.get_yscale() == "linear"
    assert log_axis_if_wide(ax, [20.0, 35.0, 9_974.0]) and ax.get_yscale() == "log"
    assert log_axis_if_wide(ax, [0.0, 20.0, 9_974.0]) and ax.get_yscale() == "symlog"
    plt.close(fig)


def test_every_sweep_metric_has_a_label_in_words_with_its_unit():
    for metric in PLOT_METRICS:
        label = METRIC_LABELS[metric]
        assert "_" not in label and ("(ms)" in label or "/s)" in label or "mean" in label)


def _record(request_id: str, klass: str, ttft_s: float) -> RequestRecord:
    return RequestRecord(request_id=request_id, klass=klass, prompt_tokens=100 if klass == "short" else 5000,
                         output_tokens=4, scheduled_at=0.0, sent_at=0.0, ttft_s=ttft_s, e2e_s=ttft_s + 0.1)


def test_plots_write_pngs(tmp_path):
    same = [_record("a", "short", 0.02), _record("b", "long", 1.5)]
    records = {"default": [_record("a", "short", 0.9), _record("b", "long", 1.0)], "hrrn": same, "srf": same}
    assert ttft_cdf_plot(tmp_path / "cdf.png", records, bound_ttft_s=[0.01]).read_bytes()[:4] == b"\x89PNG"
    timeline = [(0.0, 2, 1, 0, 0), (1.0, 0, 2, 0, 0)]
    lanes = {"srf": [(0.0, {"short": 1, "long": 1, "immediate": 0}), (1.0, {"short": 0, "long": 0, "immediate": 0})]}
    assert queue_plot(tmp_path / "q.png", {"default": timeline, "srf": timeline}, lanes).stat().st_size > 1000
    rows = [{"policy": p, "budget": 1024, "replicas": 1, "rate_scale": r, "short_ttft_p50_ms": v * r,
             "short_ttft_p95_ms": v * r ** 3, "long_ttft_p95_ms": 100.0, "output_tokens_per_s": 10.0 * r,
             "token_imbalance": 1.0} for p, v in (("default", 30.0), ("hrrn", 20.0)) for r in (1, 2, 4, 8)]
    written = sweep_plots(tmp_path, rows)
    assert [p.name for p in written] == [f"sweep-{m}.png" for m in PLOT_METRICS]
