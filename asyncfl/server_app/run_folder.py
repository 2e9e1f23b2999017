"""A run folder's files, written as the run goes: JSON replaced atomically, CSV rows appended.

The engine's recorder and the gossip relay both write through these, so a reader
(a plot, a progress tool, a resumed study) never sees half a ``summary.json``, and a
crash loses at most the row being written.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path


def write_json(path: Path, data) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically (a temporary file, then a rename)."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(data, indent=2, default=str))
    os.replace(partial, path)


def start_csv(path: Path, header: list[str]) -> None:
    """Create (or empty) ``path`` with its header row."""
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerow(header)


def append_csv(path: Path, row: list) -> None:
    """Append one row to ``path``."""
    with open(path, "a", newline="") as handle:
        csv.writer(handle).writerow(row)
