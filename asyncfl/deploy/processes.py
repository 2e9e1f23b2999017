"""Flower processes we start ourselves: SuperLink and SuperNodes, stopped by PID.

Every process is started in a session of its own with its output in a log
file, and with a mark in its environment (:data:`OWNER_ENV`) that everything it
starts inherits. Stopping sends SIGTERM to the process and to everything below
it: its live descendants (found through ``/proc``: a SuperLink starts SuperExec,
ServerApp, simulation and Ray processes in sessions of their own) and every
process that carries its mark (those whose parent died first, re-parented), then
SIGKILL, after a grace period, to what is left (Ray's agents ignore SIGTERM).
Several processes are stopped together, within one grace period, and the signals
that would stop this program are held back meanwhile (:func:`signals_held`), so
a second Ctrl-C, a SIGTERM or a closed terminal (SIGHUP) cannot cut the
teardown short. A process can be started inside a network namespace (``ip netns
exec``) to emulate a separate host.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

#: Environment variable marking a started process and everything below it (they inherit it) with its own token.
OWNER_ENV = "ASYNCFL_PROCESS_OWNER"
#: Seconds processes get to exit after SIGTERM before they are killed.
STOP_GRACE_S = 10.0
#: Seconds killed processes get to be gone before the teardown returns.
KILL_WAIT_S = 5.0
#: The signals that end this program (:func:`asyncfl.cli.main` turns each into ``KeyboardInterrupt``).
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to every pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):  # gone, or not ours to signal (a setuid helper): go on
            pass


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time)`` of ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie waiting for its parent to reap it has)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def marked(token: str) -> list[int]:
    """Every process whose environment carries ``OWNER_ENV=token`` (unreadable ones, other users', are skipped)."""
    mark = f"{OWNER_ENV}={token}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return found


def _identities(pids: Iterable[int]) -> dict[int, int]:
    """``{pid: start time}`` of the running ``pids``: a pid that later shows another start time was reused."""
    stats = {pid: _stat(pid) for pid in pids}
    return {pid: stat[1] for pid, stat in stats.items() if stat is not None and stat[0] not in ("Z", "X")}


def _still(identities: dict[int, int]) -> list[int]:
    """The pids of ``identities`` that still run as the same process."""
    return [pid for pid, started in identities.items() if _identities([pid]).get(pid) == started]


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold back SIGINT, SIGTERM and SIGHUP for the block (a teardown must not be cut short), then act on the
    first one that came as its handler would have. Outside the main thread (where handlers cannot be set) the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: came.append(signum)) for sig in ENDING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if came:
            _act_on(came[0], previous[came[0]])


def _act_on(signum: int, handler) -> None:
    """Do what ``handler`` (a signal's disposition) does with ``signum``, now."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # the default: this program ends by that signal


def stop_processes(processes: list["FlowerProcess"], grace: float | None = None) -> None:
    """Stop ``processes`` and everything they started, together: SIGTERM to all, up to ``grace`` seconds
    (default :data:`STOP_GRACE_S`) for all to exit, then SIGKILL to what is left (found again: what started
    meanwhile is included). Signals that would end this program wait until it is done."""
    grace = STOP_GRACE_S if grace is None else grace
    with signals_held():
        tracked = {}
        for process in processes:
            tracked.update(_identities(process.members()))
        signal_all(tracked, signal.SIGTERM)
        _wait_gone(tracked, processes, grace)
        for process in processes:
            tracked.update(_identities(process.members()))
        signal_all(_still(tracked), signal.SIGKILL)
        _wait_gone(tracked, processes, KILL_WAIT_S)
        for process in processes:
            process.reap()


def _wait_gone(tracked: dict[int, int], processes: list["FlowerProcess"], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for every tracked process to exit, reaping our own children meanwhile (or
    they would stay zombies)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _still(tracked):
        for process in processes:
            process.poll()
        time.sleep(0.05)


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
    """One Flower executable run in the background with its output in ``log_path``.

    Its environment carries :data:`OWNER_ENV` with a token of its own, so what it
    starts can be found (and stopped) even after being re-parented.
    """

    def __init__(self, command: list[str], log_path: Path, cwd: Path, env: dict[str, str],
                 netns: str | None = None) -> None:
        self.command = (["ip", "netns", "exec", netns] if netns else []) + command
        self.token = secrets.token_hex(8)
        self.log_path, self.cwd, self.env, self.netns = log_path, cwd, {**env, OWNER_ENV: self.token}, netns
        self.process: subprocess.Popen | None = None
        self._log = None

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

    def members(self) -> list[int]:
        """The running process, its descendants and every process that carries its mark."""
        if self.process is None:
            return []
        found = set(marked(self.token))
        if self.process.poll() is None:  # not reaped: its pid, and so its children, are still its own
            found |= {self.process.pid, *descendants(self.process.pid)}
        return sorted(pid for pid in found if running(pid))

    def poll(self) -> None:
        if self.process is not None:
            self.process.poll()

    def reap(self) -> None:
        """Wait for the process (it was killed) and close its log; a process stuck in the kernel past
        ``KILL_WAIT_S`` is left to the system rather than hang the teardown."""
        if self.process is not None:
            try:
                self.process.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the process and everything it started; ``SIGKILL`` simulates a crash (no clean shutdown)."""
        if self.process is None:
            return
        if sig == signal.SIGKILL:
            tracked = _identities(self.members())
            signal_all(tracked, signal.SIGKILL)
            _wait_gone(tracked, [self], KILL_WAIT_S)
            self.reap()
        else:
            stop_processes([self])


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
