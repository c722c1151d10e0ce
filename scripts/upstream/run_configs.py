"""Run vLLM's scheduler tests once per prefillq configuration in one process (scripts/vllm_upstream_tests.py).

    python run_configs.py CONFIG=REPORT [CONFIG=REPORT ...] -- PYTEST_ARGS...

Importing vLLM and torch and collecting the tests dominates a run; doing it once for all configurations
makes the every-policy runs of ``make upstream`` cheap. The configuration reaches the plug-in through
``PREFILLQ_CONFIG``, which it reads whenever a scheduler is built; each run writes its own JUnit report.
"""

from __future__ import annotations

import os
import sys

import pytest


def main(argv: list[str]) -> int:
    split = argv.index("--")
    runs, args = argv[:split], argv[split + 1:]
    worst = 0
    for run in runs:
        config, report = run.rsplit("=", 1)
        os.environ["PREFILLQ_CONFIG"] = config
        worst = max(worst, int(pytest.main([*args, f"--junitxml={report}"])))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
