"""The picture in docs/auto.md: how long each request waited for its first token, per policy.

Simulator, vLLM mode, the ``sustained`` scenario (8 s of Poisson traffic at 60 req/s, 25% 8K prompts),
budget 4096, every policy with ``partial_prefills = "ordered"``. One panel per policy: x = arrival time,
y = TTFT (log scale), short and long requests in two colours.

    nice python benchmarks/auto_order_plot.py [--out docs/auto-order.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prefillq.config import PolicyConfig
from prefillq.report.plots import pyplot, save_figure
from prefillq.sim import simulate
from prefillq.workload import scenario

POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/auto-order.png"))
    args = parser.parse_args()
    workload = scenario("sustained")
    plt = pyplot()
    figure, axes = plt.subplots(1, len(POLICIES), figsize=(3.2 * len(POLICIES), 3.4), sharex=True, sharey=True)
    for axis, policy in zip(axes, POLICIES, strict=True):
        result = simulate(workload, PolicyConfig(policy, partial_prefills="ordered"), budget=4096)
        for klass, colour in (("short", "tab:blue"), ("long", "tab:red")):
            done = [r for r in result.records if r.klass == klass and r.ttft_s is not None]
            axis.scatter([r.sent_at for r in done], [r.ttft_s for r in done], s=3, c=colour, label=klass,
                         alpha=0.6)
        axis.set_yscale("log")
        summary = result.summary
        axis.set_title(f"{policy}\nshort p95 {summary['short_ttft_p95_ms']:,.0f} ms, "
                       f"long p95 {summary['long_ttft_p95_ms']:,.0f} ms", fontsize=8)
        axis.set_xlabel("arrival (s)")
    axes[0].set_ylabel("TTFT (s)")
    axes[0].legend(loc="upper left", fontsize=7)
    figure.tight_layout()
    print(save_figure(figure, args.out))


if __name__ == "__main__":
    main()
