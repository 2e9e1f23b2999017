"""A Flower app folder that reuses asyncfl's run-config with other components.

Interop checks (a stock Flower ClientApp under our engine, our ClientApp under
Flower's FedAvg) and the deployment benchmark's plain-Flower peer run the same
run-config as asyncfl with different ServerApp / ClientApp modules. The copy
holds those modules next to ``pyproject.toml``; asyncfl itself is imported from
the installed package.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path


def write_app_copy(dest: Path, source_app: Path, modules: list[Path], serverapp: str | None = None,
                   clientapp: str | None = None) -> Path:
    """Write ``dest`` as a Flower app: ``source_app``'s pyproject.toml with the components swapped, and ``modules``.

    Parameters
    ----------
    dest : Path
        New folder (created; must not exist).
    source_app : Path
        The asyncfl app folder whose ``pyproject.toml`` is copied.
    modules : list of Path
        Python files copied next to ``pyproject.toml`` (the swapped components live there).
    serverapp, clientapp : str, optional
        ``module:attribute`` of the components to use instead of asyncfl's.
    """
    text = (source_app / "pyproject.toml").read_text()
    if serverapp is not None:
        text = re.sub(r'^serverapp = ".*"$', f'serverapp = "{serverapp}"', text, flags=re.M)
    if clientapp is not None:
        text = re.sub(r'^clientapp = ".*"$', f'clientapp = "{clientapp}"', text, flags=re.M)
    # asyncfl's FAB rule ships its package folder, which the copy does not have (Flower refuses a pattern that
    # matches nothing); the copy's FAB is its own modules, picked by Flower's default rules
    text = re.sub(r"^fab-include = .*\n", "", text, flags=re.M)
    dest.mkdir(parents=True)
    (dest / "pyproject.toml").write_text(text)
    (dest / "README.md").write_text("a copy of the asyncfl Flower app with other components\n")
    for module in modules:
        shutil.copy(module, dest / module.name)
    return dest
