"""A deployment in containers: :mod:`asyncfl.deploy.topology` started through the Docker Engine API.

Every container runs as the images' non-root user ``app`` on a read-only root
filesystem; what it may write is a tmpfs at ``/tmp`` (Flower's home, caches),
the SuperLink's state volume and, for the ServerApp, the results folder, a host
folder mounted at ``/app/outputs``. The containers share a bridge network of
their own and find each other by service name (``superlink``, ``supernode-3``);
only the SuperLink's port is published, on the host's loopback, where ``flwr
run`` submits the app. Everything carries the label ``asyncfl.deployment=<name>``,
by which :func:`remove_deployment` (``asyncfl docker down``) finds it.

Closed unless ``insecure``: TLS (certificates of the user's, or written here),
SuperNode authentication (each key registered from the host before its
SuperNode starts) and SuperExec authentication; the key material stays in
``<workdir>/certificates`` (mode 700, files 600, the host user's) and reaches
each container through a volume of its own (:mod:`asyncfl.deploy.topology`).

Why the Docker SDK and not ``docker-compose``: the Compose v2 plugin is not
installable here and Compose 1.29 ignores per-service CPU limits outside swarm
mode without ``--compatibility``; the SDK gives the CPU limits, ``kill``/``start``
of one container (the fault drills) and cleanup by label with no extra binary.
The same topology is also written as Compose files (:mod:`asyncfl.deploy.compose`).
"""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import time
from pathlib import Path

from asyncfl.deploy.images import FLOWER_IMAGE, SUPEREXEC_IMAGE
from asyncfl.deploy.keys import private_folder, register_node_key, write_private
from asyncfl.deploy.processes import write_connection
from asyncfl.deploy.material import TLS_FILES, ensure_material
from asyncfl.deploy.processes import flower_env, flower_tool, free_port
from asyncfl.deploy.topology import (
    APP_UID,
    MATERIAL_SOURCE,
    OUTPUT_DIR,
    PUBLISH_HOST,
    SUPERLINK_PORT,
    Images,
    Service,
    deployment_services,
    is_named_volume,
)
from asyncfl.errors import ConfigError

LABEL = "asyncfl.deployment"
CONNECTION = "asyncfl-docker"


def docker_client():
    """A Docker Engine API client (the API version negotiated with the daemon).

    Raises
    ------
    RuntimeError
        When the ``docker`` package is missing or no daemon answers.
    """
    try:
        import docker
    except ImportError as exc:
        raise RuntimeError("the docker package is missing: pip install 'asyncfl[docker]'") from exc
    try:
        client = docker.from_env(version="auto")
        client.ping()
    except Exception as exc:
        raise RuntimeError(f"no Docker daemon answers ({exc}); start dockerd or set DOCKER_HOST") from exc
    return client


def remove_deployment(client, name: str | None = None) -> dict[str, int]:
    """Remove the containers, networks and volumes labelled as deployment ``name`` (every deployment if None)."""
    label = f"{LABEL}={name}" if name else LABEL
    removed = {"containers": 0, "networks": 0, "volumes": 0}
    for container in client.containers.list(all=True, filters={"label": label}):
        container.remove(force=True)
        removed["containers"] += 1
    for network in client.networks.list(filters={"label": label}):
        network.remove()
        removed["networks"] += 1
    for volume in client.volumes.list(filters={"label": label}):
        volume.remove(force=True)
        removed["volumes"] += 1
    return removed


def _results_folder_for_app_user(path: Path) -> None:
    """Let the containers' user write the results folder (it holds no key: keys go through volumes)."""
    if os.geteuid() == 0:
        os.chown(path, APP_UID, APP_UID)
        path.chmod(0o755)
    else:  # a user of the docker group cannot give it away: let everyone write it
        path.chmod(0o777)


def check_security(insecure: bool, tls_dir: Path | None) -> None:
    """Refuse, before anything starts, security settings that contradict each other or are incomplete.

    Raises
    ------
    ConfigError
        For certificates given with ``insecure`` (they would be ignored) or a ``tls_dir`` without
        ``ca.crt``, ``server.pem`` and ``server.key``.
    """
    if tls_dir is None:
        return
    if insecure:
        raise ConfigError(f"--tls {tls_dir} with --insecure: an insecure deployment serves no TLS; drop one of them")
    missing = [name for name in TLS_FILES if not (tls_dir / name).is_file()]
    if missing:
        raise ConfigError(f"--tls {tls_dir}: missing {', '.join(missing)} (leave --tls out to have a CA and "
                          "certificate written for this deployment)")


class DockerDeployment:
    """SuperLink, ServerApp SuperExec and per client a SuperNode + ClientApp SuperExec, as containers.

    A context manager: entering starts every container (the SuperLink first, and
    waits until it listens), leaving saves each container's log under
    ``workdir/logs`` and removes the containers, the network and the state volume.

    Parameters
    ----------
    num_supernodes : int
        Clients: SuperNodes with partitions ``0..N-1``, each with its ClientApp SuperExec.
    name : str
        Prefix of every container, network and volume name, and the label value.
    workdir : Path
        Host folder for the results (``outputs/``, mounted into the ServerApp's container), the
        ``flwr`` connection config, the certificates the containers read and the logs.
    images : Images, optional
        Default: the images ``asyncfl docker build`` makes.
    tls_dir : Path, optional
        Folder with ``ca.crt``, ``server.pem``, ``server.key`` to serve TLS with (their SANs must
        include ``superlink`` and ``127.0.0.1``); default: a CA and certificate written for this
        deployment. SuperNodes, the ServerApp SuperExec and ``flwr`` verify it with ``ca.crt``.
    cpus_per_client : list of float, optional
        CPU limit of each ClientApp container, cycled over the clients.
    num_partitions : int, optional
        ``num-partitions`` (default ``num_supernodes``).
    insecure : bool
        Plain HTTP, any SuperNode admitted, no SuperExec authentication (Flower's ``--insecure``), still
        published on the host's loopback only. Default: TLS, SuperNode authentication (each SuperNode's
        key pair registered with ``flwr supernode register`` before it starts) and SuperExec authentication.

    Raises
    ------
    ConfigError
        For ``tls_dir`` with ``insecure`` (it would be ignored) or a ``tls_dir`` without the three files.
    """

    def __init__(self, num_supernodes: int, name: str = "asyncfl", workdir: Path = Path(".flwr-docker"),
                 images: Images | None = None, tls_dir: Path | None = None,
                 cpus_per_client: list[float] | None = None, num_partitions: int | None = None,
                 insecure: bool = False, tmpfs_size: str = "2g", client=None) -> None:
        check_security(insecure, tls_dir)
        self.name = name
        self.workdir = workdir.resolve()
        self.images = images or Images.local(FLOWER_IMAGE, SUPEREXEC_IMAGE)
        self.tls_dir = tls_dir
        self.insecure = insecure
        self.services = deployment_services(num_supernodes, self.images, insecure=insecure,
                                            num_partitions=num_partitions, cpus_per_client=cpus_per_client,
                                            entrypoints=True)
        self.tmpfs_size = tmpfs_size
        self.client = client
        self.port = 0

    # ----------------------------------------------------------------- naming
    def container_name(self, service: str) -> str:
        return f"{self.name}-{service}"

    @property
    def network(self) -> str:
        return f"{self.name}-net"

    @property
    def outputs(self) -> Path:
        """Host folder the ServerApp writes its run folders to (``/app/outputs`` inside)."""
        return self.workdir / "outputs"

    @property
    def material(self) -> Path:
        """Host folder with the key material (mode 700; empty for an insecure deployment)."""
        return self.workdir / MATERIAL_SOURCE

    @property
    def address(self) -> str:
        return f"{PUBLISH_HOST}:{self.port}"

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> "DockerDeployment":
        self.client = self.client or docker_client()
        if self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.name}"}):
            raise RuntimeError(f"deployment {self.name!r} already has containers; remove them with "
                               f"`asyncfl docker down --name {self.name}`")
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        labels = {LABEL: self.name}
        self.outputs.mkdir(parents=True, exist_ok=True)
        _results_folder_for_app_user(self.outputs)
        self.client.networks.create(self.network, driver="bridge", labels=labels)
        for volume in sorted({v for s in self.services for v in s.volumes if is_named_volume(v)}):
            self.client.volumes.create(f"{self.name}-{volume}", labels=labels)
        if not self.insecure:
            self._write_material()
        self.port = free_port()
        write_connection(self.workdir / "flwr-home", CONNECTION, self.address,
                         None if self.insecure else self.material / "ca.crt")
        for service in self.services:
            if service.role == "supernode" and not self.insecure:
                self._register_key(service.name)
            if service.one_shot:
                self._run_to_completion(service, 120.0)
            else:
                self._run(service)
            if service.role == "superlink":
                self._wait_for_superlink(90.0)

    def _write_material(self) -> None:
        """The key material in :attr:`material`: the user's certificates copied there if given, the rest
        written if missing (mode 600; the folder 700)."""
        if self.tls_dir is not None:
            private_folder(self.material)
            for name in TLS_FILES:
                write_private(self.material / name, (self.tls_dir / name).read_bytes())
        ensure_material(self.material, sum(s.role == "supernode" for s in self.services))

    def _register_key(self, node: str) -> None:
        """Register ``node``'s public key with the SuperLink (before that SuperNode starts)."""
        register_node_key(flower_tool("flwr"), self.material / f"{node}.pub", CONNECTION,
                          flower_env(self.workdir / "flwr-home"))

    def _binds(self, service: Service) -> dict:
        binds = {}
        for source, target in service.volumes.items():
            host = f"{self.name}-{source}" if is_named_volume(source) else str(self.workdir / source)
            binds[host] = {"bind": target, "mode": "rw" if source in service.writable else "ro"}
        return binds

    def _create(self, service: Service) -> str:
        api = self.client.api
        host_config = api.create_host_config(
            binds=self._binds(service), read_only=True, tmpfs={"/tmp": f"size={self.tmpfs_size}"},
            nano_cpus=int(service.cpus * 1e9) if service.cpus else None,
            port_bindings={SUPERLINK_PORT: (PUBLISH_HOST, self.port)} if service.ports else None,
        )
        networking = api.create_networking_config({self.network: api.create_endpoint_config(aliases=[service.name])})
        labels = {LABEL: self.name, "asyncfl.service": service.name, "asyncfl.role": service.role}
        container = api.create_container(
            service.image, command=service.command, entrypoint=[service.entrypoint] if service.entrypoint else None,
            name=self.container_name(service.name), hostname=service.name, labels=labels, user=service.user,
            ports=list(service.ports) or None, host_config=host_config, networking_config=networking)
        return container["Id"]

    def _run(self, service: Service) -> None:
        self.client.api.start(self._create(service))

    def _run_to_completion(self, service: Service, seconds: float) -> None:
        """Start a helper and wait for it to exit; raise with its log unless it exited with 0."""
        container = self._create(service)
        self.client.api.start(container)
        status = self.client.api.wait(container, timeout=seconds)["StatusCode"]
        if status != 0:
            raise RuntimeError(f"{service.name} exited with {status}:\n" + self.logs(service.name)[-3000:])

    def _wait_for_superlink(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            state = self.client.api.inspect_container(self.container_name("superlink"))["State"]
            if not state["Running"]:
                raise RuntimeError("the SuperLink container exited:\n" + self.logs("superlink")[-3000:])
            if self._superlink_answers():
                return
            time.sleep(0.5)
        raise TimeoutError(f"the SuperLink container did not listen on {self.address} within {seconds:.0f} s")

    def _superlink_answers(self) -> bool:
        """Whether the SuperLink answers HTTP on the published port. (A bare TCP connect is not enough:
        Docker's port proxy accepts connections before the server in the container listens.)"""
        if self.insecure:
            connection = http.client.HTTPConnection(PUBLISH_HOST, self.port, timeout=2.0)
        else:
            connection = http.client.HTTPSConnection(PUBLISH_HOST, self.port, timeout=2.0,
                                                     context=ssl._create_unverified_context())
        try:
            connection.request("GET", "/")
            connection.getresponse().read()
            return True
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def __exit__(self, *exc) -> None:
        if self.client is None:
            return
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for service in self.services:
            try:
                (logs / f"{service.name}.log").write_text(self.logs(service.name))
            except Exception:  # a container that never started has no log
                continue
        remove_deployment(self.client, self.name)

    # ------------------------------------------------------------------ use
    def submit(self, app_dir: Path, run_config: list[str], stream: bool = True) -> subprocess.Popen:
        """``flwr run`` the app in ``app_dir`` against this SuperLink (wall clock, results in :attr:`outputs`).

        The user's overrides come after ours, so they win; ``output-dir`` must stay ``/app/outputs``
        for the results to reach the host.
        """
        command = [flower_tool("flwr"), "run", str(app_dir.resolve()), CONNECTION]
        if stream:
            command.append("--stream")
        for item in [f"clock='wall' output-dir='{OUTPUT_DIR}'"] + list(run_config):
            command += ["--run-config", item]
        return subprocess.Popen(command, cwd=app_dir, env=flower_env(self.workdir / "flwr-home"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def kill(self, service: str) -> None:
        """``docker kill`` one container (SIGKILL: no goodbye to the SuperLink)."""
        self.client.api.kill(self.container_name(service))

    def start(self, service: str) -> None:
        """Start a stopped or killed container again, with its configuration (a SuperNode rejoins)."""
        self.client.api.start(self.container_name(service))

    def restart_superlink(self) -> None:
        """Kill the SuperLink container and start it again on the same state volume."""
        self.kill("superlink")
        self.start("superlink")
        self._wait_for_superlink(90.0)

    def logs(self, service: str) -> str:
        return self.client.api.logs(self.container_name(service)).decode(errors="replace")

    def running(self) -> dict[str, bool]:
        """``{service: running}`` for every container of this deployment."""
        return {s.name: self.client.api.inspect_container(self.container_name(s.name))["State"]["Running"]
                for s in self.services}
