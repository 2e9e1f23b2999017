"""The built-in app as a Flower app folder, wherever asyncfl is installed.

``asyncfl run`` outside a Flower app folder runs asyncfl's own app (FedBuff on
mnist5k by default). Flower runs an app *folder* (``pyproject.toml`` with
``[tool.flwr.app]``); a clone has one at its root, and a wheel carries a copy of
that file as ``asyncfl/builtin_app/pyproject.toml`` (``setup.py`` puts it there).
The folder made from it holds that file alone: ``flwr run`` packs it into a FAB,
and the ServerApp and ClientApp it names are imported from the installed asyncfl
(``asyncfl run`` switches off Flower's runtime installation of dependencies).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

SERVERAPP = "asyncfl.server_app.app:app"
PACKAGE = Path(__file__).resolve().parents[1]
#: where a wheel carries the built-in app's pyproject.toml, and where a clone (an editable install) has it
CANDIDATES = (PACKAGE / "builtin_app" / "pyproject.toml", PACKAGE.parent / "pyproject.toml")


def _flower_app_table(app_dir: Path) -> dict | None:
    """``[tool.flwr.app]`` of ``app_dir``'s pyproject.toml, ``None`` where there is none (or no readable file)."""
    try:
        with open(app_dir / "pyproject.toml", "rb") as handle:
            project = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return None
    table = project.get("tool", {}).get("flwr", {}).get("app")
    return table if isinstance(table, dict) else None


def is_flower_app(app_dir: Path) -> bool:
    """Whether ``app_dir`` is a Flower app folder (a pyproject.toml with ``[tool.flwr.app]``), not just any
    Python project."""
    return _flower_app_table(app_dir) is not None


def is_builtin_app(app_dir: Path) -> bool:
    """Whether ``app_dir`` runs asyncfl's own ServerApp (other Flower apps bring their own run-config)."""
    components = (_flower_app_table(app_dir) or {}).get("components", {})
    return isinstance(components, dict) and components.get("serverapp") == SERVERAPP


def packaged_pyproject() -> Path:
    """The built-in app's ``pyproject.toml`` this installation has (a wheel's copy first, then a clone's)."""
    for candidate in CANDIDATES:
        if is_builtin_app(candidate.parent):
            return candidate
    raise FileNotFoundError(f"this asyncfl installation has no built-in app ({' or '.join(map(str, CANDIDATES))}):"
                            " reinstall asyncfl, or pass a Flower app folder with --app")


def builtin_app_folder(home: Path) -> Path:
    """Write the built-in app's folder under ``home`` (``home/builtin-app``) and return it.

    The copy drops ``fab-include`` (its pattern names the package's own files, which the folder
    does not hold: the installed package is imported instead). It is rewritten where it differs
    from this installation's (an upgraded asyncfl brings its own run-config keys and defaults),
    under a temporary name then renamed, so a run starting beside never reads half a file.
    """
    import os
    import tempfile

    folder = home / "builtin-app"
    folder.mkdir(parents=True, exist_ok=True)
    lines = packaged_pyproject().read_text().splitlines(keepends=True)
    text = "".join(line for line in lines if not line.startswith("fab-include"))
    target = folder / "pyproject.toml"
    if not target.exists() or target.read_text() != text:
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".pyproject-", suffix=".toml")
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, target)
    return folder
