"""benchmarks/published_study.py: its table block in docs/compare.md is what the script computes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("published_study", ROOT / "benchmarks" / "published_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_table_matches_the_model_for_the_deterministic_cells():
    # long-first and interleaved arrive on a fixed schedule: one run each, so the docs must match exactly.
    study = _script()
    text = (ROOT / "docs" / "compare.md").read_text(encoding="utf-8")
    block = text.split(study.BEGIN, 1)[1].split(study.END, 1)[0]
    assert block.count("\n| ") == 1 + 72  # header + one line per cell
    for name in ("long-first", "interleaved"):
        for budget in study.BUDGETS:
            rows = [{"scenario": name, "budget": budget, "topology": "mixed", "policy": policy,
                     **study.run_cell(name, budget, "mixed", policy, 1, {})} for policy in study.POLICIES]
            for line in study.markdown(rows).splitlines()[2:]:
                assert line in block


def test_write_docs_replaces_only_the_marked_block(tmp_path):
    study = _script()
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{study.BEGIN}\nold table\n{study.END}\nrest\n", encoding="utf-8")
    study.write_docs(doc, "| new |", "header")
    assert doc.read_text(encoding="utf-8") == f"intro\n{study.BEGIN}\nheader\n\n| new |\n{study.END}\nrest\n"
    doc.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no <!-- published-study:begin -->"):
        study.write_docs(doc, "| new |", "header")
