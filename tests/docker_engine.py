"""A Docker engine for the container tests: the one that answers, or one these tests install and start.

Where no daemon answers and the tests run as root with apt (CI here), they install
Debian's ``docker.io`` and ``debootstrap`` and start ``dockerd`` themselves, and stop
it by its PID when done; elsewhere the tests skip, saying what is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from asyncfl.deploy.containers import docker_client

APT_PACKAGES = ("docker.io", "debootstrap")


class DockerEngine:
    """``client`` for an engine that answers; ``stop()`` ends the daemon only if this object started it."""

    def __init__(self) -> None:
        self.client = None
        self.process: subprocess.Popen | None = None
        self.skip_reason: str | None = None

    def start(self) -> "DockerEngine":
        try:
            self.client = docker_client()
            return self
        except RuntimeError as exc:
            first_error = str(exc)
        if os.geteuid() != 0:
            self.skip_reason = f"no Docker engine answers ({first_error}) and starting one needs root"
            return self
        missing = [p for p, tool in zip(APT_PACKAGES, ("dockerd", "debootstrap")) if shutil.which(tool) is None]
        if missing:
            if shutil.which("apt-get") is None:
                self.skip_reason = f"no Docker engine, and no apt-get to install {', '.join(missing)}"
                return self
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
            subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                           stdout=subprocess.DEVNULL)
        log = open(Path(tempfile.gettempdir()) / "asyncfl-test-dockerd.log", "ab")
        self.process = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.skip_reason = f"dockerd exited with {self.process.returncode} (see {log.name})"
                self.process = None
                return self
            try:
                self.client = docker_client()
                return self
            except RuntimeError:
                time.sleep(1.0)
        self.stop()
        self.skip_reason = f"dockerd did not answer within 60 s (see {log.name})"
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
