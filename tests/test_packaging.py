"""What installing asyncfl into someone's Flower app does: compatible ranges, exact pins only for our own runs."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _dependencies() -> dict[str, Requirement]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        project = tomllib.load(handle)["project"]
    return {Requirement(d).name: Requirement(d) for d in project["dependencies"]}


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_dependencies_are_ranges_that_keep_a_users_newer_torch_and_flower():
    deps = _dependencies()
    assert not [str(r) for r in deps.values() if any(s.operator == "==" for s in r.specifier)], \
        "exact pins belong in constraints.txt"
    # a Flower app on the newest torch (2.15.0 on 2026-11-25) and on Flower 1.42 keeps them
    assert deps["torch"].specifier.contains("2.15.0") and deps["torch"].specifier.contains("2.14.1")
    assert deps["flwr"].specifier.contains("1.42.0") and not deps["flwr"].specifier.contains("1.41.0")


def test_our_pinned_versions_satisfy_the_ranges():
    pins = _constraints()
    for name, requirement in _dependencies().items():
        assert name in pins, f"{name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pins[name]), f"constraints.txt pins {name}=={pins[name]}, " \
                                                           f"outside {requirement.specifier}"


def test_compare_refuses_a_folder_that_is_not_a_run_in_one_line(tmp_path, capsys):
    import pytest

    from asyncfl.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["compare", str(tmp_path)])
    assert stop.value.code == 2
    assert "is not a run folder (no metrics.csv or summary.json)" in capsys.readouterr().err


def test_a_wheel_carries_the_builtin_app_and_its_folder_builds_a_fab_from_the_installed_package(tmp_path):
    # the built-in app must run wherever asyncfl is pip-installed, not only in a clone
    import subprocess
    import sys
    import zipfile

    from asyncfl.deploy.builtin_app import builtin_app_folder, is_builtin_app

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(ROOT)], check=True, capture_output=True)
    wheel = zipfile.ZipFile(next((tmp_path / "wheel").glob("asyncfl-*.whl")))
    assert wheel.read("asyncfl/builtin_app/pyproject.toml") == (ROOT / "pyproject.toml").read_bytes()
    folder = builtin_app_folder(tmp_path / "home")
    assert is_builtin_app(folder) and [p.name for p in folder.iterdir()] == ["pyproject.toml"]
    text = (folder / "pyproject.toml").read_text()
    assert "fab-include" not in text and "[tool.flwr.app.config]" in text
    flwr = Path(sys.executable).parent / "flwr"
    built = subprocess.run([str(flwr), "build", "--app", "."], cwd=folder, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    fab = zipfile.ZipFile(next(folder.glob("*.fab")))
    assert not [n for n in fab.namelist() if n.endswith(".py")]  # the ServerApp comes from the installed package
