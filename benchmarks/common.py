"""What the benchmark scripts share: the machine's description and writing results as JSON + Markdown."""

from __future__ import annotations

import json
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_results(out: str | Path, result: dict, markdown: str) -> None:
    """OUT.json and OUT.md (OUT is a path without suffix), and the Markdown on stdout."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
