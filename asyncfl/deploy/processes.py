"""Flower processes we start ourselves: SuperLink and SuperNodes, stopped by PID.

Every process is started in a session of its own with its output in a log
file. Stopping sends SIGTERM to the process and to every live descendant
(found through ``/proc``: a SuperLink starts SuperExec, ServerApp, simulation
and Ray processes in sessions of their own), then SIGKILL to what is left.
A process can be started inside a network namespace (``ip netns exec``) to
emulate a separate host.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
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


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower processes: our ``FLWR_HOME`` and this venv's scripts first on PATH
    (the SuperLink and SuperNodes start ``flower-superexec``, ``flwr-serverapp``... by name)."""
    env = dict(os.environ)
    env["FLWR_HOME"] = str(flwr_home)
    env["PATH"] = f"{flower_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    return env


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (Linux ``/proc``), children first."""
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


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to every pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_family(process: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM ``process`` and all its descendants, wait, then SIGKILL whatever is left."""
    if process.poll() is not None and not descendants(process.pid):
        return
    family = descendants(process.pid)
    signal_all(family + [process.pid], signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in family):
        time.sleep(0.2)
    signal_all([p for p in family if Path(f"/proc/{p}").exists()], signal.SIGKILL)


def wait_for_port(host: str, port: int, process: subprocess.Popen, timeout: float, what: str,
                  netns: str | None = None) -> None:
    """Block until ``host:port`` accepts TCP connections (probed from inside ``netns`` if given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited early with code {process.returncode}")
        if _port_open(host, port, netns):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout:.0f}s")


def _port_open(host: str, port: int, netns: str | None) -> bool:
    if netns is None:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=0.5)"
    return subprocess.call(["ip", "netns", "exec", netns, sys.executable, "-c", probe],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS SuperLink: its certificate and key, and the CA that signed it."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


class FlowerProcess:
    """One Flower executable run in the background with its output in ``log_path``."""

    def __init__(self, command: list[str], log_path: Path, cwd: Path, env: dict[str, str],
                 netns: str | None = None) -> None:
        self.command = (["ip", "netns", "exec", netns] if netns else []) + command
        self.log_path, self.cwd, self.env, self.netns = log_path, cwd, env, netns
        self.process: subprocess.Popen | None = None

    def start(self) -> "FlowerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the process and its descendants; ``SIGKILL`` simulates a crash (no clean shutdown)."""
        if self.process is None:
            return
        if sig == signal.SIGKILL:
            family = descendants(self.process.pid)
            signal_all([self.process.pid] + family, signal.SIGKILL)
            self.process.wait()
        else:
            stop_family(self.process)
        self._log.close()


def superlink_command(host: str, port: int, database: Path, simulation: bool = False,
                      tls: TlsFiles | None = None, supernode_auth: bool = False) -> list[str]:
    """``flower-superlink`` serving Fleet, Control and Runtime APIs on ``host:port``."""
    command = [flower_tool("flower-superlink"), "--isolation", "subprocess", "--disable-runtime-dependency-installation",
               "--host", host, "--port", str(port), "--database", str(database)]
    if simulation:
        command.append("--simulation")
    if tls is None:
        command.append("--insecure")
    else:
        command += ["--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert),
                    "--ssl-keyfile", str(tls.server_key)]
    if supernode_auth:
        command.append("--enable-supernode-auth")
    return command


def supernode_command(superlink: str, partition_id: int, num_partitions: int, clientappio_port: int,
                      ca_cert: Path | None = None, extra_node_config: str = "", host: str = "127.0.0.1",
                      auth_private_key: Path | None = None) -> list[str]:
    """``flower-supernode`` for partition ``partition_id`` of ``num_partitions``."""
    node_config = f"partition-id={partition_id} num-partitions={num_partitions} {extra_node_config}".strip()
    command = [flower_tool("flower-supernode"), "--superlink", superlink, "--isolation", "subprocess",
               "--host", host, "--port", str(clientappio_port), "--node-config", node_config]
    command += ["--insecure"] if ca_cert is None else ["--root-certificates", str(ca_cert)]
    if auth_private_key is not None:
        command += ["--auth-supernode-private-key", str(auth_private_key)]
    return command


def write_connection(flwr_home: Path, name: str, address: str, ca_cert: Path | None = None) -> None:
    """Write ``$FLWR_HOME/config.toml`` with one SuperLink connection (insecure unless ``ca_cert``)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    security = "insecure = true\n" if ca_cert is None else f'root-certificates = "{ca_cert.resolve()}"\n'
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{security}'
    )
