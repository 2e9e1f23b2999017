"""Loading the benchmark scripts (not a package) as modules, for tests of their tables and rules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str):
    """The script at ``ROOT / relative`` as module ``name``, its own folder importable while it loads (scripts
    import their siblings); registered in ``sys.modules`` (dataclasses look their module up while built)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
