"""A real Flower deployment on one machine: one SuperLink, N SuperNodes, ``flwr run``.

Unlike ``asyncfl run`` (Ray simulation), every client here is its own
``flower-supernode`` process talking to the SuperLink over Flower's Fleet API
(HTTP on ``--host/--port`` in Flower 1.41), the ServerApp runs in a process the
SuperLink's SuperExec starts, and the engine runs on the wall clock. The same
commands, with real host names, deploy across machines (docs/deployment.md).

Optionally TLS (certificates from ``scripts/make-certs.sh``), SuperNode
authentication (a key pair per SuperNode, registered with ``flwr supernode
register`` before the node starts) and, for tests, network namespaces that make
the SuperLink and the SuperNodes separate hosts.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from asyncfl.deploy.keys import register_node_key, write_node_keys
from asyncfl.deploy.processes import (
    FlowerProcess,
    TlsFiles,
    flower_env,
    flower_tool,
    free_port,
    stop_processes,
    superlink_command,
    supernode_command,
    wait_for_port,
    write_connection,
)
from asyncfl.errors import ConfigError

CONNECTION = "asyncfl-deploy"


class LocalDeployment:
    """SuperLink + SuperNodes as separate processes; a context manager that stops them all by PID.

    Parameters
    ----------
    app_dir : Path
        The Flower app (its pyproject.toml).
    num_supernodes : int
        SuperNodes started on entry, partitions ``0..num_supernodes-1``.
    num_partitions : int, optional
        Partitions the data is split into (default ``num_supernodes``); more
        lets SuperNodes join later with :meth:`add_supernode`.
    tls : TlsFiles, optional
        Serve the SuperLink over TLS; SuperNodes and ``flwr`` verify it with the CA.
    supernode_auth : bool
        Admit only registered SuperNodes (``--enable-supernode-auth``; Flower
        requires TLS for it). Each SuperNode gets a key pair under
        ``workdir/keys`` whose public half is registered before it starts.
    node_config : dict, optional
        Extra node-config per partition id (e.g. ``{2: "fault=nan"}``).
    link_netns, nodes_netns, link_host : str, optional
        Network namespaces of the SuperLink and of the SuperNodes and ``flwr``
        (emulated separate hosts) and the address the SuperLink listens on.
    """

    def __init__(self, app_dir: Path, num_supernodes: int, num_partitions: int | None = None,
                 tls: TlsFiles | None = None, supernode_auth: bool = False, node_config: dict[int, str] | None = None,
                 link_netns: str | None = None, nodes_netns: str | None = None, link_host: str = "127.0.0.1",
                 workdir: Path | None = None) -> None:
        if num_supernodes < 1:
            raise ConfigError(f"num_supernodes must be >= 1, got {num_supernodes}")
        self.app_dir = app_dir.resolve()
        self.num_supernodes = num_supernodes
        self.num_partitions = num_partitions or num_supernodes
        if self.num_partitions < num_supernodes:
            raise ConfigError(f"num_partitions ({self.num_partitions}) < num_supernodes ({num_supernodes})")
        if supernode_auth and tls is None:
            raise ConfigError("supernode_auth needs tls: Flower's SuperLink refuses --enable-supernode-auth "
                             "without TLS certificates (scripts/make-certs.sh writes development ones)")
        self.tls = tls
        self.supernode_auth = supernode_auth
        self.node_config = node_config or {}
        self.link_netns, self.nodes_netns, self.link_host = link_netns, nodes_netns, link_host
        self.workdir = (workdir or self.app_dir / ".flwr-deploy").resolve()
        self.flwr_home = self.workdir / "flwr-home"
        self.port = free_port() if link_netns is None else 9093
        self.superlink: FlowerProcess | None = None
        self.supernodes: dict[int, FlowerProcess] = {}

    @property
    def address(self) -> str:
        return f"{self.link_host}:{self.port}"

    def __enter__(self) -> "LocalDeployment":
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        write_connection(self.flwr_home, CONNECTION, self.address, self.tls.ca_cert if self.tls else None)
        self._start_superlink()
        for partition_id in range(self.num_supernodes):
            self.add_supernode(partition_id)

    @property
    def database(self) -> Path:
        """The SuperLink's state database (kept across :meth:`restart_superlink`)."""
        return self.workdir / f"superlink-{self.port}.db"

    def _start_superlink(self) -> None:
        command = superlink_command(self.link_host, self.port, self.database, tls=self.tls,
                                    supernode_auth=self.supernode_auth)
        self.superlink = FlowerProcess(command, self.workdir / "superlink.log", self.workdir,
                                       flower_env(self.flwr_home), netns=self.link_netns).start()
        wait_for_port(self.link_host, self.port, self.superlink.process, 60.0, "flower-superlink",
                      netns=self.nodes_netns or self.link_netns)

    def restart_superlink(self) -> None:
        """Crash the SuperLink (SIGKILL to it and its ServerApp) and start it again on the same port and database."""
        if self.superlink is not None:
            self.superlink.stop(signal.SIGKILL)
        self._start_superlink()

    def add_supernode(self, partition_id: int, register: bool = True) -> FlowerProcess:
        """Start the SuperNode of ``partition_id`` (also mid-run: it joins the federation).

        With ``supernode_auth`` the node gets a fresh key pair, registered with
        the SuperLink first unless ``register`` is false (an intruder, for tests).
        """
        if not 0 <= partition_id < self.num_partitions:
            raise ConfigError(f"partition-id {partition_id} outside [0, {self.num_partitions})")
        private_key = None
        if self.supernode_auth:
            keys = write_node_keys(self.workdir / "keys", f"supernode-{partition_id}")
            if register:
                register_node_key(flower_tool("flwr"), keys.public_key, CONNECTION, flower_env(self.flwr_home),
                                  netns=self.nodes_netns)
            private_key = keys.private_key
        command = supernode_command(
            self.address, partition_id, self.num_partitions, free_port(),
            ca_cert=self.tls.ca_cert if self.tls else None, extra_node_config=self.node_config.get(partition_id, ""),
            auth_private_key=private_key,
        )
        node = FlowerProcess(command, self.workdir / f"supernode-{partition_id}.log", self.workdir,
                             flower_env(self.workdir / f"home-{partition_id}"), netns=self.nodes_netns).start()
        self.supernodes[partition_id] = node
        return node

    def kill_supernode(self, partition_id: int) -> None:
        """Crash a SuperNode (SIGKILL to it and its ClientApp processes): no clean goodbye."""
        self.supernodes[partition_id].stop(signal.SIGKILL)

    def submit(self, run_config: list[str], stream: bool = True) -> subprocess.Popen:
        """``flwr run`` the app against this SuperLink; returns the ``flwr`` process (output piped)."""
        command = [flower_tool("flwr"), "run", str(self.app_dir), CONNECTION]
        if stream:
            command.append("--stream")
        for item in run_config:
            command += ["--run-config", item]
        if self.nodes_netns:
            command = ["ip", "netns", "exec", self.nodes_netns] + command
        return subprocess.Popen(command, cwd=self.app_dir, env=flower_env(self.flwr_home), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def __exit__(self, *exc) -> None:
        """Stop the SuperNodes and the SuperLink together, with all they started (a node killed before is
        searched too: its ClientApp processes may outlive it)."""
        started = list(self.supernodes.values()) + ([self.superlink] if self.superlink is not None else [])
        stop_processes(started)
