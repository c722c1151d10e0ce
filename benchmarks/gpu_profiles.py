"""Fit the packaged H200 profiles to the measured GPU step times, and report how each cost form fits.

    PYTHONPATH=src python benchmarks/gpu_profiles.py [--data ../shared/calibration/gpu] [--write]

Reads ``h200-<model>-steps.json`` (CUDA-graph step times of a plain PyTorch forward on one H200; the
folder's README says how they were taken), fits the cost model with ``prefillq calibrate``'s fit
(:func:`prefillq.calibrate.fit_cost_model`, relative error) in both forms, prints median / max relative
error per profile and form, and with ``--write`` writes ``src/prefillq/sim/profiles/h200-<model>.json``
(roofline form). ``h200-*-multichunk-steps.json`` (steps with several prefill chunks) are predicted by
the single-chunk fit, by number of chunks: a check, not fitted. Writes the table as JSON to --json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from prefillq.calibrate import fit_cost_model, gpu_step_samples

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("qwen3-0.6b", "llama3-8b", "qwen3-32b")
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU's memory
H200_BYTES = 141e9
ACTIVATION_RESERVE_BYTES = 4e9
BLOCK_SIZE = 16


def shape_bytes(meta: dict) -> tuple[int, float]:
    """KV bytes per token (bf16 K and V in every layer) and the weights' bytes (bf16) of a model shape."""
    layers, hidden, heads, kv_heads = meta["layers"], meta["hidden"], meta["heads"], meta["kv_heads"]
    head_dim, ffn, vocab = meta["head_dim"], meta["ffn"], meta["vocab"]
    per_layer = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden + 3 * hidden * ffn
    weights = 2 * (layers * per_layer + 2 * vocab * hidden)
    return 2 * layers * kv_heads * head_dim * 2, float(weights)


def errors(fit, samples) -> np.ndarray:
    return np.array([abs(fit.predict(s) / s.seconds - 1.0) for s in samples])


def profile(model: str, data: dict, fit, linear) -> dict:
    meta = data["meta"]
    kv_token, weights = shape_bytes(meta)
    kv_blocks = int((H200_BYTES * GPU_MEMORY_UTILIZATION - weights - ACTIVATION_RESERVE_BYTES) / kv_token / BLOCK_SIZE)
    rel = errors(fit, gpu_step_samples(data))
    old = errors(linear, gpu_step_samples(data))
    return {
        "name": f"h200-{model}",
        "description": (f"{meta['model']}: the step times of a plain PyTorch forward (CUDA graphs, bf16) of this "
                        f"model shape ({meta['layers']} layers, hidden {meta['hidden']}) on one NVIDIA H200. Not "
                        "vLLM's kernels: treat it as a GPU of this class running a model of this shape, within "
                        "perhaps 10-30%. Engine limits as the other packaged profiles (budget 1024, 256 seats), "
                        "not vLLM's GPU defaults."),
        "source": (f"Measured 2026-12-04 on an NVIDIA H200 (torch {meta['torch']}, random bf16 weights): "
                   f"{len(data['samples'])} step compositions (one prefill chunk on cached context plus decodes), "
                   "each the fastest of 10-20 CUDA-graph replays (../shared/calibration/gpu/, copied to "
                   f"tests/data/gpu/h200-{model}-steps.json). Fitted by benchmarks/gpu_profiles.py with "
                   "`prefillq calibrate`'s fit (non-negative least squares on relative error, roofline form: "
                   f"knee and exponent by grid and golden-section search): median / max relative error "
                   f"{np.median(rel):.1%} / {rel.max():.1%} (the linear form: {np.median(old):.1%} / "
                   f"{old.max():.1%}). KV capacity estimated: 90% of 141 GB less bf16 weights and a 4 GB "
                   "reserve; kv_transfer.link_bytes_per_s assumed (100 GB/s NVLink, effective), not measured."),
        **{k: (round(v, 6) if k == "knee_tokens" else v) for k, v in fit.cost_keys().items()},
        "defaults": {"max_num_batched_tokens": 1024, "max_num_seqs": 256, "block_size": BLOCK_SIZE,
                     "kv_blocks": kv_blocks, "long_prefill_token_threshold": 0},
        "kv_transfer": {"bytes_per_token": kv_token, "link_bytes_per_s": 100e9},
        "calibration": {"r2": round(fit.r2, 4), "batches_fitted": fit.samples_used,
                        "median_abs_rel_error": round(float(np.median(rel)), 4),
                        "max_abs_rel_error": round(float(rel.max()), 4), "timing": "graph_min_s"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "gpu")
    parser.add_argument("--write", action="store_true", help="write the profiles into src/prefillq/sim/profiles")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    print("| profile | form | median rel err | max rel err | knee tokens | exponent |")
    print("|---|---|---|---|---|---|")
    for model in MODELS:
        data = json.loads((args.data / f"h200-{model}-steps.json").read_text())
        samples = gpu_step_samples(data)
        fits = {form: fit_cost_model(samples, form=form, trim=False) for form in ("linear", "roofline")}
        for form, fit in fits.items():
            rel = errors(fit, samples)
            knee, exponent = fit.shape or ("-", "-")
            print(f"| h200-{model} | {form} | {np.median(rel):.1%} | {rel.max():.1%} | "
                  f"{knee if isinstance(knee, str) else f'{knee:.0f}'} | {exponent} |")
            rows.append({"profile": f"h200-{model}", "form": form, "median": float(np.median(rel)),
                         "max": float(rel.max()), "shape": fit.shape})
        multi = args.data / f"h200-{model}-multichunk-steps.json"
        if multi.exists():
            for form, fit in fits.items():
                by_chunks: dict[int, list[float]] = {}
                for s in gpu_step_samples(json.loads(multi.read_text())):
                    by_chunks.setdefault(len(s.prefill_chunks), []).append(s.seconds / fit.predict(s) - 1.0)
                text = ", ".join(f"{n}: {np.median(v):+.0%} ({min(v):+.0%}..{max(v):+.0%})"
                                 for n, v in sorted(by_chunks.items()))
                print(f"|   multichunk, {form}: measured/predicted - 1 by chunks | {text} |")
                rows.append({"profile": f"h200-{model}", "form": form, "multichunk": {
                    str(n): [float(np.median(v)), float(min(v)), float(max(v))] for n, v in by_chunks.items()}})
        if args.write:
            out = ROOT / "src" / "prefillq" / "sim" / "profiles" / f"h200-{model}.json"
            out.write_text(json.dumps(profile(model, data, fits["roofline"], fits["linear"]), indent=2) + "\n")
            print(f"wrote {out}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
