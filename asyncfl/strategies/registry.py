"""The built-in app's strategy names: run-config ``strategy`` -> class, found beside each class.

A method names itself once, in its class body (``run_config_name = "fedbuff"``). The registry
reads those names from the package's source, without importing it, so the run-config can
name-check ``strategy`` (and a ClientApp can parse the shared keys) without loading the
server-side methods and their torch models; a class is imported only when asked for. Adding a
method is its own module: the package's exports, the run-config parser, the built-in app and
``asyncfl run --help`` read this registry.
"""

from __future__ import annotations

import re
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from asyncfl.errors import ConfigError

if TYPE_CHECKING:
    from asyncfl.strategies.base import Strategy

#: the attribute a method's class body sets to its run-config name
NAME_ATTRIBUTE = "run_config_name"


def declared_strategies(folder: Path, package: str) -> dict[str, str]:
    """``{run-config name: "module:Class"}`` for every top-level class under ``folder`` (the package ``package``)
    whose body sets :data:`NAME_ATTRIBUTE` to a string literal on a line of its own (``    run_config_name =
    "fedbuff"``), sorted by name. A line scan, not an import or a parse: every process that reads a run-config
    pays for it (~ms).

    Raises
    ------
    RuntimeError
        When two classes claim one name.
    """
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        if path.name.startswith(".") or not path.is_file():  # an editor's lock file or backup link
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")  # only ASCII names are looked for
        if NAME_ATTRIBUTE not in text:
            continue
        module = ".".join((package, *path.relative_to(folder).with_suffix("").parts))
        owner = None
        for line in text.splitlines():
            if line.startswith("class "):
                owner = _CLASS.match(line).group(1)
            elif line[:1] not in ("", " ", "\t", "#", ")", "@"):  # back at module level: no class owns what follows
                owner = None
            elif owner is not None and (declared := _DECLARED.match(line)):
                name = declared.group(1)
                if name in found:
                    raise RuntimeError(f"strategy name {name!r} is claimed by {found[name]} and {module}:{owner}")
                found[name] = f"{module}:{owner}"
    return dict(sorted(found.items()))


_CLASS = re.compile(r"class (\w+)")
_DECLARED = re.compile(rf"    {NAME_ATTRIBUTE} *(?::[^=]+)?= *[\"']([^\"']+)[\"']")  # any annotation


STRATEGY_CLASSES: dict[str, str] = declared_strategies(Path(__file__).parent, __package__)
if not STRATEGY_CLASSES:  # the methods' sources are not installed (a .pyc-only or zipped package)
    raise ImportError(f"no strategy declares {NAME_ATTRIBUTE} under {Path(__file__).parent}: asyncfl needs its "
                      "strategies' .py sources installed")


def class_modules() -> dict[str, str]:
    """``{class name: module}`` of every registered class: what ``asyncfl`` and ``asyncfl.strategies``
    export, derived from :data:`STRATEGY_CLASSES` so a method is registered in one place."""
    return {spec.partition(":")[2]: spec.partition(":")[0] for spec in STRATEGY_CLASSES.values()}


def strategy_class(name: str) -> type["Strategy"]:
    """The class registered as ``name``.

    Raises
    ------
    ConfigError
        For a name that is not registered, listing the valid ones (a ``ValueError``, as the
        run-config parser raises for the same mistake).
    """
    if name not in STRATEGY_CLASSES:
        raise ConfigError(f"strategy={name!r} is not valid; choose one of: {', '.join(STRATEGY_CLASSES)}")
    module, _, attribute = STRATEGY_CLASSES[name].partition(":")
    return getattr(import_module(module), attribute)
