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


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file, then a rename): a reader never sees half of it."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)


def write_json(path: Path, data) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    write_text(path, json.dumps(data, indent=2, default=str))


def start_csv(path: Path, header: list[str]) -> None:
    """Create (or empty) ``path`` with its header row."""
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerow(header)


def append_csv(path: Path, row: list) -> None:
    """Append one row to ``path``."""
    with open(path, "a", newline="") as handle:
        csv.writer(handle).writerow(row)


#: The run-config a built-in app run was started with, as Flower handed it: what ``asyncfl run --resume`` reuses.
RUN_CONFIG_FILE = "run_config.toml"


def write_run_config(folder: Path, run_config: dict) -> None:
    """``run_config.toml``: Flower's flat run-config (dotted keys quoted), a TOML file ``flwr run`` accepts."""
    lines = [f"{toml_string(str(key))} = {toml_value(value)}" for key, value in sorted(run_config.items())]
    write_text(folder / RUN_CONFIG_FILE, "\n".join(lines) + "\n")


def read_run_config(folder: Path) -> dict:
    """The flat run-config :func:`write_run_config` wrote in ``folder``."""
    import tomllib

    with open(folder / RUN_CONFIG_FILE, "rb") as handle:
        return tomllib.load(handle)


def toml_value(value) -> str:
    """A run-config value (bool, number or string) as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return toml_string(str(value))


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: backslash, double quote and control characters escaped, every other
    character as it is (JSON's ``\ud83d`` surrogate escapes for characters past U+FFFF are not TOML)."""
    escaped = "".join("\\" + ch if ch in '"\\' else f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F
                      else ch for ch in text)
    return f'"{escaped}"'
