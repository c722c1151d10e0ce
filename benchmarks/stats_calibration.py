"""Is the paired interval of ``prefillq bench`` calibrated? False-positive rate and power by simulation.

For each number of rounds and each kind of round noise, many experiments are simulated in which two
policies run the same rounds. Every round has a large shared factor (the round's load, the machine's
mood: lognormal, sd 0.3 in log space), which pairing cancels, and each policy gets its own noise of
sd ``--noise`` (0.07 in log space, so the paired log-ratio has sd ~0.1; real bench rounds of the tiny
model show 1-5%, the default is deliberately noisier):

* ``normal``: Gaussian noise;
* ``heavy``: Student-t noise with 3 degrees of freedom scaled to the same sd (rare big outliers).

With no true effect a calibrated 95% interval excludes zero in 5% of experiments (the false-positive
rate, FPR); with a true -30% change the share that excludes zero is the power. Each method is
measured at every size, not only where ``compare_paired`` uses it, because that is the evidence for
the cut-off (:data:`prefillq.stats.BOOTSTRAP_MIN_UNITS`):

* ``chosen``: :func:`prefillq.stats.compare_paired` as it is (its ``method`` column says which rule);
* ``t``: the t-interval on the log-ratios;
* ``expanded-bootstrap``: the expanded percentile bootstrap over rounds;
* ``percentile-bootstrap``: the plain percentile bootstrap (the rule before SPEC §6 was fixed).

A second table puts rounds on several machines whose effect differs (machine random effect of sd
``--machine-sd`` on the log-ratio; three rounds on each of 3-30 machines, and two unbalanced
layouts) and compares the cluster methods with treating every round as independent and with the
two-stage bootstrap (machines, then rounds within each, expanded like the others).

Usage: ``python benchmarks/stats_calibration.py [--experiments 4000] [--samples 2000] [--json PATH]``
(about a minute on one core; the bootstrap rows dominate).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from prefillq.stats import (
    BOOTSTRAP_MIN_UNITS,
    _expanded_bootstrap,
    _t_interval,
    bootstrap_mean_interval,
    bootstrap_means,
    compare_paired,
)

ROUND_SPREAD = 0.3
EFFECT = math.log(0.7)  # a 30% cut
ROUNDS = (3, 5, 10, 20, 30)
#: Rounds per machine: balanced (3 each on 3, 5, 10 and 30 machines) and unbalanced layouts.
LAYOUTS = ((3,) * 3, (3,) * 5, (3,) * 10, (3,) * 30, (1, 2, 3, 6), (1, 1, 8))


def policy_noise(rng: np.random.Generator, kind: str, shape: tuple[int, ...], sd: float) -> np.ndarray:
    """Per-policy log noise of standard deviation ``sd``: Gaussian or t(3) (variance 3, rescaled)."""
    if kind == "normal":
        return rng.normal(0.0, sd, shape)
    return rng.standard_t(3, shape) * (sd / math.sqrt(3.0))


def simulate(rng: np.random.Generator, kind: str, experiments: int, rounds: int, effect: float,
             sd: float) -> tuple[np.ndarray, np.ndarray]:
    """Baseline and treatment values, one row per experiment: shared round factor, own noise."""
    shared = rng.normal(0.0, ROUND_SPREAD, (experiments, rounds))
    baseline = 1000.0 * np.exp(shared + policy_noise(rng, kind, shared.shape, sd))
    treatment = 1000.0 * np.exp(shared + effect + policy_noise(rng, kind, shared.shape, sd))
    return baseline, treatment


def _t_rule(d: list[float], samples: int) -> bool:
    mean = math.fsum(d) / len(d)
    se = math.sqrt(math.fsum((v - mean) ** 2 for v in d) / (len(d) - 1) / len(d))
    low, high, _ = _t_interval(mean, se, len(d) - 1, 0.95)
    return low > 0 or high < 0


def _expanded_rule(d: list[float], samples: int) -> bool:
    low, high, _ = _expanded_bootstrap(bootstrap_means(d, samples=samples, seed=0), len(d), 0.95)
    return low > 0 or high < 0


def _percentile_rule(d: list[float], samples: int) -> bool:
    low, high = bootstrap_mean_interval(d, samples=samples, seed=0)
    return low > 0 or high < 0


RULES: dict[str, Callable[[list[float], int], bool]] = {
    "t": _t_rule, "expanded-bootstrap": _expanded_rule, "percentile-bootstrap": _percentile_rule}


def rate(hits: int, experiments: int) -> dict[str, float]:
    """A proportion with its binomial standard error."""
    p = hits / experiments
    return {"rate": p, "se": math.sqrt(max(p * (1 - p), 1e-12) / experiments)}


def rounds_table(experiments: int, samples: int, sd: float, seed: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for kind in ("normal", "heavy"):
        for n in ROUNDS:
            rng = np.random.default_rng([seed, n, kind == "heavy"])
            data = {label: simulate(rng, kind, experiments, n, effect, sd)
                    for label, effect in (("fpr", 0.0), ("power", EFFECT))}
            chosen_method = ""
            for rule in ("chosen", *RULES):
                row: dict[str, object] = {"noise": kind, "rounds": n, "rule": rule}
                for label, (base, treat) in data.items():
                    hits = 0
                    for a, b in zip(base.tolist(), treat.tolist(), strict=True):
                        if rule == "chosen":
                            result = compare_paired(a, b, samples=samples)
                            chosen_method = result.method
                            hits += result.excludes_zero
                        else:
                            hits += RULES[rule](np.log(np.asarray(b) / np.asarray(a)).tolist(), samples)
                    row[label] = rate(hits, experiments)
                row["method"] = chosen_method if rule == "chosen" else rule
                rows.append(row)
    return rows


def machines_table(experiments: int, samples: int, sd: float, machine_sd: float,
                   seed: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for kind in ("normal", "heavy"):
        for layout in LAYOUTS:
            rng = np.random.default_rng([seed, 1000 + len(layout), sum(layout), kind == "heavy"])
            machines, n = len(layout), sum(layout)
            groups = [m for m, size in enumerate(layout) for _ in range(size)]
            count = experiments if machines < BOOTSTRAP_MIN_UNITS else max(200, experiments // 4)
            hits = {"grouped": 0, "ignoring-groups": 0, "two-stage": 0}
            method = ""
            for _ in range(count):
                base, treat = simulate(rng, kind, 1, n, 0.0, sd)
                machine_effect = np.repeat(rng.normal(0.0, machine_sd, machines), layout)
                a, b = base[0].tolist(), (treat[0] * np.exp(machine_effect)).tolist()
                grouped = compare_paired(a, b, groups=groups, samples=samples)
                method = grouped.method
                hits["grouped"] += grouped.excludes_zero
                hits["ignoring-groups"] += compare_paired(a, b, samples=samples).excludes_zero
                d = np.log(np.asarray(b) / np.asarray(a)).tolist()
                two_stage = bootstrap_means(d, groups=groups, samples=samples, seed=0)
                low, high, _ = _expanded_bootstrap(two_stage, machines, 0.95)
                hits["two-stage"] += low > 0 or high < 0
            rows.append({"noise": kind, "layout": "+".join(map(str, layout)), "machines": machines,
                         "method": method, "experiments": count,
                         "fpr": rate(hits["grouped"], count),
                         "fpr_ignoring_groups": rate(hits["ignoring-groups"], count),
                         "fpr_two_stage_bootstrap": rate(hits["two-stage"], count)})
    return rows


def _pct(cell: object) -> str:
    assert isinstance(cell, dict)
    return f"{100 * cell['rate']:5.1f}% ±{100 * cell['se']:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", type=int, default=4000, help="simulated experiments per cell")
    parser.add_argument("--samples", type=int, default=2000, help="bootstrap resamples per experiment")
    parser.add_argument("--noise", type=float, default=0.07, help="per-policy log noise sd per round")
    parser.add_argument("--machine-sd", type=float, default=0.05, help="sd of the machine effect on d")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "stats_calibration.json")
    args = parser.parse_args()

    started = time.perf_counter()
    rounds = rounds_table(args.experiments, args.samples, args.noise, args.seed)
    machines = machines_table(args.experiments, args.samples, args.noise, args.machine_sd, args.seed)
    elapsed = time.perf_counter() - started

    print(f"No machines: {args.experiments} experiments per cell, per-policy log noise sd {args.noise} "
          f"(log-ratio sd {args.noise * math.sqrt(2):.3f}); FPR = no true effect, power = true -30%; "
          "± one binomial SE")
    print(f"{'noise':6} {'rounds':>6}  {'rule':20} {'method':20} {'FPR':>12} {'power -30%':>12}")
    for row in rounds:
        print(f"{row['noise']:6} {row['rounds']:>6}  {row['rule']:20} {row['method']:20} "
              f"{_pct(row['fpr']):>12} {_pct(row['power']):>12}")
    print(f"\nSeveral machines: {args.machine_sd} sd machine effect on the log-ratio, no true effect on average")
    print(f"{'noise':6} {'rounds per machine':>20}  {'method':20} {'FPR':>12} {'FPR ignoring groups':>20} "
          f"{'FPR two-stage boot.':>20}")
    for row in machines:
        print(f"{row['noise']:6} {row['layout'][:20]:>20}  {row['method']:20} {_pct(row['fpr']):>12} "
              f"{_pct(row['fpr_ignoring_groups']):>20} {_pct(row['fpr_two_stage_bootstrap']):>20}")
    print(f"\n({elapsed:.0f} s)")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "tool": "benchmarks/stats_calibration.py", "experiments": args.experiments, "samples": args.samples,
        "policy_noise_sd": args.noise, "machine_sd": args.machine_sd, "round_spread": ROUND_SPREAD,
        "effect_log_ratio": EFFECT, "bootstrap_min_units": BOOTSTRAP_MIN_UNITS, "seed": args.seed,
        "elapsed_s": elapsed, "rounds": rounds, "machines": machines}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
