"""``asyncfl run``'s process lifecycle: a private simulation SuperLink, ``flwr run`` against it, its verdict.

The SuperLink runs with runtime dependency installation disabled (the installed
environment is used) and a ``FLWR_HOME`` the project owns; it is stopped by PID with
all its descendants. The command-line parsing stays in :mod:`asyncfl.cli`.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import sys
from pathlib import Path

from asyncfl.deploy.processes import (FlowerProcess, flower_env, flower_tool, free_port, signals_held, superlink_command,
                                      wait_for_port, write_connection)
from asyncfl.errors import ConfigError

CONNECTION = "asyncfl-local"


def write_flower_config(flwr_home: Path, port: int) -> None:
    """Write ``$FLWR_HOME/config.toml`` with one insecure loopback connection."""
    write_connection(flwr_home, CONNECTION, f"127.0.0.1:{port}")


class LocalSuperLink:
    """A simulation SuperLink on loopback, stopped by PID (with all its descendants) on exit.

    Each one gets a ``FLWR_HOME`` of its own under ``base`` (connection config,
    state database, installed app), removed on exit: ``flwr run`` reads the
    SuperLink address from ``$FLWR_HOME/config.toml``, and with one shared
    folder, runs started side by side from the same app folder could read
    another run's address and run on (and be stopped with) its SuperLink.
    Its log stays next to the homes, ``superlink-<port>-<suffix>.log``.
    """

    def __init__(self, workdir: Path, base: Path, extra_env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.extra_env = dict(extra_env or {})
        self.port = free_port()
        # a folder no other run can have: two runs handed the same free port (a race between the check and the
        # bind) must not share, nor delete, each other's state
        base.mkdir(parents=True, exist_ok=True)
        self.flwr_home = Path(tempfile.mkdtemp(prefix=f"link-{self.port}-", dir=base))
        self.log_path = base / f"superlink-{self.flwr_home.name.removeprefix('link-')}.log"
        self.process: FlowerProcess | None = None

    def __enter__(self) -> "LocalSuperLink":
        write_flower_config(self.flwr_home, self.port)
        command = superlink_command("127.0.0.1", self.port, self.flwr_home / "state.db", simulation=True)
        self.process = FlowerProcess(command, self.log_path, self.workdir, self.env()).start()
        try:
            wait_for_port("127.0.0.1", self.port, self.process.process, 60.0, "flower-superlink")
        except BaseException:
            self.process.stop()
            raise
        return self

    def env(self) -> dict[str, str]:
        return {**flower_env(self.flwr_home), **self.extra_env}

    def __exit__(self, *exc) -> None:
        with signals_held():  # a second Ctrl-C or a SIGHUP must not leave the simulation and Ray running
            if self.process is not None:
                self.process.stop()
            shutil.rmtree(self.flwr_home, ignore_errors=True)


def run_app(app_dir: Path, run_config: list[str], num_supernodes: int, cpus_per_client: int, extra_env=None,
            ray_address: str | None = None, workdir: Path | None = None, ray_cpus: int | None = None) -> int:
    """``flwr run`` the app in ``app_dir`` on a private simulation SuperLink; returns the exit code.

    With ``ray_address`` the simulation attaches to that Ray cluster (``RAY_ADDRESS`` in the
    SuperLink's environment, which its simulation process inherits); without it, it starts a
    Ray of its own (``RAY_ADDRESS=local``) even where ``ray start`` left a cluster running,
    which Ray would otherwise attach to. The ServerApp works in ``workdir`` (default: the app
    folder), where relative output paths land. The SuperLink's log, ``<app>/.flwr/superlink-<port>.log``,
    is kept only when the run did not end well (a log per finished run filled the disk). ``ray_cpus``
    (Flower's ``init-args-num-cpus``) is how many CPUs the Ray it starts may hand out: with
    ``cpus_per_client`` 1, that many ClientApp actors, also more than the machine's cores (Flower's
    simulation runtime still runs at most ``min(32, cores + 4)`` ClientApps at once).
    """
    if ray_address:
        try:
            check_ray_address(ray_address)
        except ValueError as exc:
            print(f"asyncfl run: {exc}", file=sys.stderr)
            return 2
    app_dir = app_dir.resolve()
    ray_env = {"RAY_ADDRESS": ray_address or "local"}
    with LocalSuperLink((workdir or app_dir).resolve(), app_dir / ".flwr", ray_env) as link:
        federation = f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus_per_client}"
        if ray_cpus is not None:
            federation += f" init-args-num-cpus={ray_cpus}"
        command = [flower_tool("flwr"), "run", str(app_dir), CONNECTION, "--stream", "--federation-config", federation]
        for item in run_config:
            command += ["--run-config", item]
        env = link.env()
        env.update(extra_env or {})
        code = subprocess.call(command, cwd=app_dir, env=env)
        if code == 0 and run_failed(app_dir, env):
            print(f"asyncfl: the run failed on the SuperLink (see the ServerApp log above; the SuperLink's: "
                  f"{link.log_path})", file=sys.stderr)
            return 1
    if code == 0:
        link.log_path.unlink(missing_ok=True)
    return code


#: ``--ray-address`` values Ray resolves itself (a cluster this machine knows of; a new local one): not probed.
RAY_KEYWORDS = ("auto", "local")
#: Seconds a Ray head gets to accept a TCP connection before ``--ray-address`` is refused.
RAY_PROBE_S = 3.0


def check_ray_address(address: str, timeout: float = RAY_PROBE_S) -> None:
    """Refuse an ``--ray-address`` that no Ray head answers at, before the SuperLink and Ray start.

    Given an address nothing listens on, Ray retries its connection for minutes and
    Flower's simulation never starts a ClientApp, so the run would only wait for its nodes.

    Raises
    ------
    ValueError
        One line naming ``--ray-address``, what was wrong and what is expected.
    """
    if address in RAY_KEYWORDS:
        return
    expected = ("expected the HEAD:PORT of a running Ray cluster (`ray start --head` prints it; port 6379 by "
                "default), or leave --ray-address out to start Ray on this machine")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r} is not HOST:PORT; {expected}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"--ray-address {address}: nothing answers there ({reason}); {expected}") from None


def run_failed(app_dir: Path, env: dict[str, str]) -> bool:
    """True when the SuperLink reports the run as failed: ``flwr run --stream`` exits 0 even then."""
    listing = subprocess.run([flower_tool("flwr"), "ls", CONNECTION, "--format", "json"], cwd=app_dir, env=env,
                             capture_output=True, text=True)
    try:
        runs = json.loads(listing.stdout).get("runs", [])
    except (json.JSONDecodeError, AttributeError):
        return False  # no verdict available: trust flwr run's exit code
    return any("failed" in str(run.get("status", "")) for run in runs)


def stream_to_end(flwr: subprocess.Popen) -> int:
    """Print a ``flwr run --stream`` process's output as it comes; return its exit code (stopping it if we
    are interrupted)."""
    try:
        for line in flwr.stdout:
            print(line, end="", flush=True)
        return flwr.wait()
    finally:
        if flwr.poll() is None:
            flwr.terminate()
            flwr.wait(timeout=30)
