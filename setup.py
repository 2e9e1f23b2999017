"""A wheel carries the built-in app's pyproject.toml as asyncfl/builtin_app/pyproject.toml, so `asyncfl run`
runs the built-in app wherever asyncfl is installed (asyncfl/deploy/builtin_app.py); the rest is pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithBuiltinApp(build_py):
    """build_py, then the project's pyproject.toml into the built package."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "asyncfl" / "builtin_app" / "pyproject.toml"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(__file__).resolve().parent / "pyproject.toml", target)


setup(cmdclass={"build_py": BuildWithBuiltinApp})
