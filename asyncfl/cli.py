"""``asyncfl`` command: run the app through a local SuperLink, compare runs.

``asyncfl run`` is a thin wrapper over ``flwr run``: it starts a simulation
SuperLink of its own (with runtime dependency installation disabled, so the
already-installed environment is used), points ``FLWR_HOME`` at a folder the
project owns, streams the run and stops the SuperLink by PID.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CONNECTION = "asyncfl-local"


def free_port() -> int:
    """A TCP port on loopback that nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_bin_dir() -> Path:
    """Folder of this interpreter's console scripts (``flwr``, ``flower-superlink``)."""
    return Path(sys.executable).parent


def flower_tool(name: str) -> str:
    """Path of a Flower executable: next to this Python first (an unactivated venv), else on PATH."""
    found = shutil.which(name, path=str(flower_bin_dir())) or shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} not found next to {sys.executable} nor on PATH; install flwr[simulation]")
    return found


def write_flower_config(flwr_home: Path, port: int) -> None:
    """Write ``$FLWR_HOME/config.toml`` with one insecure loopback connection."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"flower-superlink exited early with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"flower-superlink did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (Linux ``/proc``), children first.

    The SuperLink starts a SuperExec in a session of its own, which starts the
    simulation and Ray; stopping only the SuperLink's process group would leave
    them running.
    """
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class LocalSuperLink:
    """A simulation SuperLink on loopback, stopped by PID on exit."""

    def __init__(self, workdir: Path, flwr_home: Path) -> None:
        self.workdir = workdir
        self.flwr_home = flwr_home
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LocalSuperLink":
        write_flower_config(self.flwr_home, self.port)
        log_path = self.flwr_home / "superlink.log"
        command = [
            flower_tool("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
            "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(self.port),
            "--database", str(self.flwr_home / f"state-{self.port}.db"),
        ]
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            command, cwd=self.workdir, env=self.env(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        _wait_for_port(self.port, self.process, timeout=60.0)
        return self

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(self.flwr_home)
        # The SuperLink starts flower-superexec and flwr-simulation by name.
        env["PATH"] = f"{flower_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
        return env

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            family = descendants(self.process.pid)
            _signal_all(family + [self.process.pid], signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in family):
                time.sleep(0.2)
            _signal_all([p for p in family if Path(f"/proc/{p}").exists()], signal.SIGKILL)
        self._log.close()
        for db in self.flwr_home.glob(f"state-{self.port}.db*"):
            db.unlink(missing_ok=True)


def run_app(app_dir: Path, run_config: list[str], num_supernodes: int, cpus_per_client: int, extra_env=None) -> int:
    """``flwr run`` the app in ``app_dir`` on a private simulation SuperLink; returns the exit code."""
    app_dir = app_dir.resolve()
    flwr_home = app_dir / ".flwr"
    with LocalSuperLink(app_dir, flwr_home) as link:
        command = [flower_tool("flwr"), "run", str(app_dir), CONNECTION, "--stream",
                   "--federation-config", f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus_per_client:g}"]
        for item in run_config:
            command += ["--run-config", item]
        env = link.env()
        env.update(extra_env or {})
        return subprocess.call(command, cwd=app_dir, env=env)


def resolve_run_config(run_config: list[str]) -> list[str]:
    """Make TOML file arguments absolute (``flwr run`` is started from the app folder)."""
    return [str(Path(item).resolve()) if item.endswith(".toml") and Path(item).exists() else item for item in run_config]


def check_run_config(app_dir: Path, run_config: list[str]) -> None:
    """Validate the fused run-config here, before a SuperLink or Ray starts.

    Raises ``ValueError`` (unknown key, bad TOML) or
    :class:`asyncfl.config.ConfigError` (invalid value), naming what is valid.
    """
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    from asyncfl.config import parse_run_config

    overrides = parse_config_args(run_config) if run_config else {}
    parse_run_config(get_fused_config_from_dir(app_dir, overrides))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``asyncfl`` console script."""
    parser = argparse.ArgumentParser(prog="asyncfl", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the Flower app as a local Ray simulation (default: FedBuff on mnist5k)")
    run.add_argument("--app", type=Path, default=Path("."), help="Flower app folder (default: .)")
    run.add_argument("--num-supernodes", type=int, default=50, help="simulated clients (default: 50)")
    run.add_argument("--cpus-per-client", type=int, default=1, help="Ray CPUs per ClientApp (default: 1)")
    run.add_argument("--run-config", "-c", action="append", default=[],
                     help="run-config overrides, as for flwr run (repeatable), or a TOML file such as conf/x.toml")
    compare = commands.add_parser("compare", help="table and one plot of several run folders")
    compare.add_argument("runs", nargs="+", type=Path, help="run folders (each with metrics.csv, summary.json)")
    compare.add_argument("--out", type=Path, default=Path("comparison.png"), help="plot file (default: comparison.png)")
    compare.add_argument("--target", type=float, default=None, help="common target accuracy for time-to-target")
    args = parser.parse_args(argv)
    # SIGTERM (e.g. a test timeout) unwinds like Ctrl-C, so the SuperLink is stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.command == "run":
        if args.num_supernodes < 1:
            parser.error(f"--num-supernodes must be >= 1, got {args.num_supernodes}")
        if not (args.app / "pyproject.toml").exists():
            parser.error(f"{args.app.resolve()} has no pyproject.toml: pass the Flower app folder with --app")
        run_config = resolve_run_config(args.run_config)
        try:
            check_run_config(args.app, run_config)
        except ValueError as exc:
            parser.error(f"invalid run-config: {exc}")
        return run_app(args.app, run_config, args.num_supernodes, args.cpus_per_client)
    from asyncfl.simulation.compare import compare_runs

    print(compare_runs(args.runs, args.out, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
