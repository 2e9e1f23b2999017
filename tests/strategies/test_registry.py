"""The strategy registry: a method names itself once, beside its class, and everything else reads that name."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncfl.strategies import registry
from asyncfl.strategies.base import Strategy
from asyncfl.strategies.registry import STRATEGY_CLASSES, declared_strategies, strategy_class

ROOT = Path(__file__).resolve().parents[2]

TOY = '''"""A toy method: the server model becomes the latest update as it comes."""

from asyncfl.strategies.base import Strategy


class LatestWins(Strategy):
    """Each arrival replaces the model."""

    run_config_name = "latest-wins"

    def on_arrival(self, arrival):
        return arrival.weights
'''


def test_every_registered_name_is_the_one_its_class_declares_and_every_declaring_class_is_registered():
    for name in STRATEGY_CLASSES:
        assert strategy_class(name).run_config_name == name
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)
    declaring = {cls.run_config_name for cls in subclasses(Strategy)
                 if cls.__module__.startswith("asyncfl.") and "run_config_name" in vars(cls)}
    assert declaring == set(STRATEGY_CLASSES)
    assert Strategy.run_config_name is None


def _parsed_declarations(folder: Path, package: str) -> dict[str, str]:
    """What the line scan must find, by Python's own parser: a top-level class whose body assigns a string to
    ``run_config_name`` (with any annotation)."""
    import ast

    found = {}
    for path in sorted(folder.rglob("*.py")):
        if path.name.startswith(".") or not path.is_file():
            continue
        module = ".".join((package, *path.relative_to(folder).with_suffix("").parts))
        for node in ast.parse(path.read_bytes()).body:
            for statement in getattr(node, "body", []) if isinstance(node, ast.ClassDef) else []:
                target = statement.targets[0] if isinstance(statement, ast.Assign) \
                    else getattr(statement, "target", None)
                if isinstance(target, ast.Name) and target.id == registry.NAME_ATTRIBUTE \
                        and isinstance(getattr(statement, "value", None), ast.Constant) \
                        and isinstance(statement.value.value, str):
                    found[statement.value.value] = f"{module}:{node.name}"
    return found


def test_the_line_scan_finds_what_pythons_parser_finds_in_the_package():
    folder = Path(registry.__file__).parent
    assert declared_strategies(folder, "asyncfl.strategies") == _parsed_declarations(folder, "asyncfl.strategies")


def test_the_scan_takes_any_annotation_and_skips_strings_functions_and_stray_files(tmp_path):
    (tmp_path / "annotated.py").write_text(TOY.replace('run_config_name = "latest-wins"',
                                                       'run_config_name: ClassVar[str] = "latest-wins"'))
    (tmp_path / "later.py").write_text('class A:\n    """Doc."""\n\n\ndef f():\n    run_config_name = "not-a-method"\n')
    (tmp_path / ".#annotated.py").symlink_to(tmp_path / "gone")  # an editor's lock file: a dangling link
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n")
    assert declared_strategies(tmp_path, "pkg") == {"latest-wins": "pkg.annotated:LatestWins"}
    assert _parsed_declarations(tmp_path, "pkg") == {"latest-wins": "pkg.annotated:LatestWins"}


def test_the_scan_reads_names_from_source_and_refuses_a_name_claimed_twice(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "other.py").write_text('class Helper:\n    """Not a method."""\n\n    x = 1\n')
    assert declared_strategies(tmp_path, "pkg") == {"latest-wins": "pkg.toy:LatestWins"}
    (tmp_path / "nested" / "twin.py").write_text(TOY.replace("LatestWins", "Twin"))
    with pytest.raises(RuntimeError, match="'latest-wins' is claimed by pkg.nested.twin:Twin and pkg.toy:LatestWins"):
        declared_strategies(tmp_path, "pkg")


def test_a_new_method_is_its_own_module_and_nothing_else(tmp_path):
    # A copy of the package with one file added: the toy is exported, parsed from the run-config, listed by
    # `asyncfl run --help` and runs as the built-in app's strategy, with no other file changed.
    package = tmp_path / "asyncfl"
    shutil.copytree(ROOT / "asyncfl", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "strategies" / "latest_wins.py").write_text(TOY)
    check = '''
import tomllib
from flwr.common.config import flatten_dict
import asyncfl
from asyncfl.config import parse_run_config
from asyncfl.cli import _run_epilog
from asyncfl.strategies.registry import strategy_class
assert asyncfl.__file__.startswith(PACKAGE), asyncfl.__file__
defaults = flatten_dict(tomllib.load(open(PYPROJECT, "rb"))["tool"]["flwr"]["app"]["config"])
assert parse_run_config({**defaults, "strategy": "latest-wins"}).strategy == "latest-wins"
assert strategy_class("latest-wins") is asyncfl.LatestWins and "LatestWins" in asyncfl.__all__
assert "latest-wins" in _run_epilog()
import ast
from asyncfl.strategies.registry import class_modules
tree = ast.parse(open(asyncfl.__file__).read())
block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
assert {a.name for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names} == \
    set(asyncfl._PUBLIC) - set(class_modules())  # the names type checkers see hold without the toy
print("ok")
'''.replace("PACKAGE", repr(str(package))).replace("PYPROJECT", repr(str(ROOT / "pyproject.toml")))
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


GOSSIP_TOY = '''"""A toy gossip method: a peer keeps the mean of its own model and the first one that arrived, untrained."""

import numpy as np

from asyncfl.decentralized.method import GossipEvent, GossipMethod, Outgoing


class FirstHalf(GossipMethod):
    """Half-way to the first neighbour model that arrived; nothing trained, the whole model sent."""

    run_config_name = "first-half"

    def event(self, event: GossipEvent) -> Outgoing:
        for name in event.shared if event.received else ():
            first = event.received[0].message[name].reshape(event.layout.shapes[name])
            event.peer.state[name] = ((event.peer.state[name] + first) / 2).astype(event.peer.state[name].dtype)
        return Outgoing(0.0, push={n: event.peer.state[n].astype(np.float32) for n in event.shared})
'''


def test_gossip_methods_are_named_beside_their_classes_and_found_by_the_same_scan():
    from asyncfl.decentralized import settings
    from asyncfl.decentralized.method import GossipMethod, gossip_method

    folder = Path(settings.__file__).parent
    assert settings.GOSSIP_CLASSES == _parsed_declarations(folder, "asyncfl.decentralized")
    assert settings.GOSSIP_METHODS == ("async-dfedavg", "divshare", "independent", "pushcen", "swift")
    for name in settings.GOSSIP_METHODS:
        method = gossip_method(name)
        assert isinstance(method, GossipMethod) and type(method).run_config_name == name
    assert not set(settings.GOSSIP_CLASSES) & set(STRATEGY_CLASSES)


def test_a_new_gossip_method_is_its_own_module_and_nothing_else(tmp_path):
    # A copy of the package with one gossip module added: the run-config takes it, `asyncfl run --help` lists it and
    # the gossip relay runs it on fake peers (the peers' ClientApp builds it by name), with no other file changed.
    package = tmp_path / "asyncfl"
    shutil.copytree(ROOT / "asyncfl", package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")  # the relay test reads the app's defaults
    (package / "decentralized" / "first_half.py").write_text(GOSSIP_TOY)
    check = '''
import tempfile
from pathlib import Path
from flwr.supercore.task_identity import TaskIdentity
TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
import asyncfl
from asyncfl.cli import _run_epilog
from tests.server_app.test_relay import run_relay
assert asyncfl.__file__.startswith(PACKAGE), asyncfl.__file__
assert "first-half" in _run_epilog()
relay, contexts, grid = run_relay(Path(tempfile.mkdtemp()), "first-half")
assert len(grid.pushed) > 6 and all(c.state.array_records for c in contexts.values())  # every peer ran events
print("ok")
'''.replace("PACKAGE", repr(str(package)))
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


TOY_WITH_A_KNOB = '''"""A toy method with one knob: the model moves part of the way to each update."""

from dataclasses import dataclass
from typing import Any, ClassVar

from asyncfl.strategies.base import Strategy
from asyncfl.strategies.settings import StrategyConfig, knob


@dataclass(frozen=True)
class HalfwayConfig(StrategyConfig):
    """Halfway's knobs (run-config ``halfway.*``).

    Parameters
    ----------
    share : float
        How far the model moves toward each update.
    """

    label: ClassVar[str] = "Halfway"
    prefix: ClassVar[str] = "halfway"

    share: float = knob(0.5, above=0, maximum=1)


class Halfway(Strategy):
    """Moves the model part of the way to each update."""

    run_config_name = "halfway"
    config_class = HalfwayConfig

    def __init__(self, share: float = 0.5, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = HalfwayConfig.from_arguments(locals())

    def on_arrival(self, arrival, current):
        return current + self.config.share * (arrival.weights - current)
'''


def test_a_new_method_with_a_knob_is_its_module_and_the_generator(tmp_path):
    # A copy of the project with one method module added: the generator writes its knob into the app's pyproject
    # and the knobs page, and the run-config then takes and checks it
    for part in ("asyncfl", "scripts", "docs"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "asyncfl" / "strategies" / "halfway.py").write_text(TOY_WITH_A_KNOB)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    wrote = subprocess.run([sys.executable, str(tmp_path / "scripts" / "knobs_doc.py"), "--write"], cwd=tmp_path,
                           capture_output=True, text=True, env=env)
    assert wrote.returncode == 0, wrote.stderr[-2000:]
    assert '"halfway.share" = 0.5' in (tmp_path / "pyproject.toml").read_text()
    assert "`halfway.share`" in (tmp_path / "docs" / "knobs.md").read_text()
    check = '''
import tomllib
from flwr.common.config import flatten_dict
from asyncfl.config import ConfigError, parse_run_config
defaults = flatten_dict(tomllib.load(open("pyproject.toml", "rb"))["tool"]["flwr"]["app"]["config"])
assert parse_run_config({**defaults, "strategy": "halfway", "halfway.share": 0.25}).strategy_config.share == 0.25
try:
    parse_run_config({**defaults, "strategy": "halfway", "halfway.share": 2.0})
except ConfigError as exc:
    assert "halfway.share" in str(exc), exc
else:
    raise AssertionError("share=2 taken")
print("ok")
'''
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
