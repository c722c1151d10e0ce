"""Sample traces shipped inside the package, named ``sample:<name>`` wherever a trace path is read.

They are Microsoft's Azure LLM inference trace 2023 (Azure/AzurePublicDataset, CC-BY 4.0, collected for
the Splitwise paper, ISCA 2024), in the processed form distributed with microsoft/vidur (MIT), stored
gzip-compressed under ``prefillq/data/traces/`` with their credit (``README.md`` there).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from prefillq.workload.scenarios import WorkloadError

SAMPLE_PREFIX = "sample:"
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"

SOURCE = "Azure LLM inference trace 2023 (Azure/AzurePublicDataset), processed by microsoft/vidur"
LICENCE = "CC-BY 4.0 (data), MIT (vidur's processing)"
CREDIT = ("Sample traces: Microsoft Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset), "
          "CC-BY 4.0; Patel et al., 'Splitwise', ISCA 2024; processed form from microsoft/vidur (MIT).")


@dataclass(frozen=True)
class Sample:
    name: str
    file: str
    what: str

    @property
    def path(self) -> Path:
        return DATA_DIR / self.file


SAMPLES: dict[str, Sample] = {
    "azure-conv": Sample("azure-conv", "azure-2023-conv.csv.gz", "conversation service, one hour"),
    "azure-code": Sample("azure-code", "azure-2023-code.csv.gz", "code-completion service, one hour"),
}


def resolve_trace(path: str | Path) -> Path:
    """The file a trace argument names: ``sample:<name>`` is a shipped sample, anything else a path."""
    text = str(path)
    if not text.startswith(SAMPLE_PREFIX):
        return Path(path)
    name = text[len(SAMPLE_PREFIX):]
    if name not in SAMPLES:
        choices = ", ".join(SAMPLE_PREFIX + n for n in SAMPLES)
        raise WorkloadError(f"unknown sample trace {text!r}; samples: {choices} (list them: prefillq traces)")
    return SAMPLES[name].path


def trace_name(path: str | Path) -> str:
    """A short name for a trace argument: the sample's name, else the file's stem (without ``.csv.gz``)."""
    text = str(path)
    if text.startswith(SAMPLE_PREFIX):
        return text[len(SAMPLE_PREFIX):]
    name = Path(path).name
    for suffix in (".gz", ".csv", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def open_text(path: Path) -> IO[str]:
    """The file for reading as UTF-8 text, decompressed on the fly when its name ends in ``.gz``."""
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")

