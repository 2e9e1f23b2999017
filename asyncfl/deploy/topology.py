"""The container topology of a deployment, written once and used twice.

One SuperLink; one SuperExec that runs the ServerApp against the SuperLink's
Runtime API; per client a SuperNode (its own ``partition-id``) and a SuperExec
that runs its ClientApps against the SuperNode's Runtime API. This is Flower's
``--isolation process`` layout, the one its own Docker guide uses. The same
:class:`Service` list becomes a Compose file (:mod:`asyncfl.deploy.compose`, for
users with Compose v2) and the containers that ``asyncfl docker up`` starts
through the Docker Engine API (:mod:`asyncfl.deploy.containers`).

Closed unless asked otherwise. In Flower 1.42 the SuperLink serves its Fleet,
Control and Runtime APIs on one ``--host/--port``, and its Control API (``flwr
run``) has no account authentication outside Flower's enterprise plugin: the
port is published on the host's loopback only, whatever the security, and the
SuperNodes reach it on the deployment's own network. A deployment that is not
``insecure`` serves TLS, admits only registered SuperNodes
(``--enable-supernode-auth``) and lets only a SuperExec that holds the shared
secret take work from a Runtime API (``--superexec-auth-secret-file``, on the
SuperLink and on every SuperNode). Its key material lies in one host folder
(:mod:`asyncfl.deploy.material`, mode 700, files 600); a one-shot container
running as root copies to each service its own files only, into a volume of its
own, owned by the containers' user ``app`` (uid 49999) and mode 600, so no file
needs to be readable by anyone else on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncfl.deploy.material import secret_file
from asyncfl.errors import ConfigError

FLOWER_VERSION = "1.42.0"
SUPERLINK_PORT = 9093
SUPERNODE_RUNTIME_PORT = 9094
#: Host address every published port binds to (see the module's docstring).
PUBLISH_HOST = "127.0.0.1"
APP_UID = 49999  # the images' `app` user (as in Flower's images)
SECRETS_DIR = "/app/secrets"
OUTPUT_DIR = "/app/outputs"
STATE_DIR = "/app/state"
STATE_VOLUME = "superlink-state"
#: The host folder with the key material, relative to the deployment's folder.
MATERIAL_SOURCE = "certificates"
SECRETS_VOLUME_PREFIX = "secrets-"
INSTALL_SERVICE = "install-secrets"
REGISTER_SERVICE = "register-supernodes"


def is_named_volume(source: str) -> bool:
    """Whether a volume source is a named volume (else a path under the deployment's folder)."""
    return source == STATE_VOLUME or source.startswith(SECRETS_VOLUME_PREFIX)


@dataclass(frozen=True)
class Images:
    """Image names of the three roles (SuperLink and SuperNode need Flower only; SuperExec runs the apps)."""

    superlink: str
    supernode: str
    superexec: str

    @classmethod
    def official(cls, flower_version: str = FLOWER_VERSION, superexec: str = "asyncfl-superexec:latest") -> "Images":
        """Flower's published images, and a SuperExec built ``FROM flwr/superexec`` (needs a registry)."""
        return cls(f"flwr/superlink:{flower_version}", f"flwr/supernode:{flower_version}", superexec)

    @classmethod
    def local(cls, flower: str, superexec: str) -> "Images":
        """Images built on this machine by ``asyncfl docker build`` (one Flower image for both servers)."""
        return cls(flower, flower, superexec)


@dataclass
class Service:
    """One container: what it runs and what it needs.

    ``entrypoint`` is set for images without one of their own (ours: one Flower
    image serves SuperLink and SuperNode) and for the one-shot helpers; Flower's
    images bring theirs.
    """

    name: str
    image: str
    command: list[str]
    entrypoint: str | None = None
    role: str = ""
    partition_id: int | None = None
    ports: list[int] = field(default_factory=list)
    # source -> container path; a source is a named volume (is_named_volume) or a path under the deployment folder
    volumes: dict[str, str] = field(default_factory=dict)
    #: Volume sources mounted read-write; every other one is read-only.
    writable: list[str] = field(default_factory=list)
    #: Files of the key material this service reads from ``SECRETS_DIR``.
    secrets: list[str] = field(default_factory=list)
    depends_on: list[str] = field(default_factory=list)
    #: Runs to completion before the services that depend on it start (the helpers).
    one_shot: bool = False
    user: str | None = None
    cpus: float | None = None
    gpu: bool = False
    build: dict | None = None


def cpu_tiers(text: str) -> list[float]:
    """``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]``: CPUs per ClientApp container, cycled over the clients.

    Raises
    ------
    ConfigError
        For a value that is not a positive number.
    """
    tiers = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"--cpus-per-client {text!r}: write comma-separated CPU counts such as '0.5,1,2'") from None
        if not value > 0:
            raise ConfigError(f"--cpus-per-client {text!r}: every CPU count must be > 0, got {value}")
        tiers.append(value)
    return tiers


def deployment_services(num_supernodes: int, images: Images, insecure: bool = False, cuda: bool = False,
                        num_partitions: int | None = None, cpus_per_client: list[float] | None = None,
                        entrypoints: bool = False, build: dict | None = None,
                        register: bool = False) -> list[Service]:
    """The services of a deployment with ``num_supernodes`` clients.

    Parameters
    ----------
    num_supernodes : int
        SuperNodes (and ClientApp SuperExecs), partitions ``0..N-1``.
    images : Images
        Which image each role runs.
    insecure : bool
        Plain HTTP, any SuperNode admitted, no SuperExec authentication (Flower's ``--insecure``). Default:
        TLS, SuperNode authentication and SuperExec authentication, with the key material of
        :func:`asyncfl.deploy.material.ensure_material` installed by a one-shot service.
    cuda : bool
        ClientApp SuperExecs reserve a GPU each.
    num_partitions : int, optional
        ``num-partitions`` if it should differ from ``num_supernodes`` (nodes may join later).
    cpus_per_client : list of float, optional
        CPU limit of each ClientApp SuperExec, cycled over the clients (client ``i`` gets
        ``tiers[i % len(tiers)]``): physically slower and faster clients.
    entrypoints : bool
        Name the Flower executable of each container (images without entrypoints of their own).
    build : dict, optional
        Compose ``build`` section of the SuperExec image.
    register : bool
        Add a one-shot service that registers every SuperNode's public key with the SuperLink before the
        SuperNodes start (Compose; ``asyncfl docker up`` registers them from the host).

    Raises
    ------
    ConfigError
        For no SuperNode, fewer partitions than SuperNodes, or ``register`` with ``insecure``.
    """
    if num_supernodes < 1:
        raise ConfigError(f"num_supernodes must be >= 1, got {num_supernodes}")
    if register and insecure:
        raise ConfigError("register with insecure: an insecure SuperLink admits any SuperNode, there is nothing to "
                         "register")
    partitions = num_partitions or num_supernodes
    if partitions < num_supernodes:
        raise ConfigError(f"num-partitions ({partitions}) must be >= the number of SuperNodes ({num_supernodes})")

    def entry(executable: str) -> str | None:
        return executable if entrypoints else None

    services = [_superlink(images, insecure, entry("flower-superlink")),
                _serverapp(images, insecure, entry("flower-superexec"), build)]
    for i in range(num_supernodes):
        services.append(_supernode(i, partitions, images, insecure, entry("flower-supernode")))
        services.append(_clientapp(i, images, insecure, entry("flower-superexec"), build, cuda,
                                   cpus_per_client[i % len(cpus_per_client)] if cpus_per_client else None))
    if insecure:
        return services
    if register:
        services.insert(2, _register(num_supernodes, images, build))
        for service in services:
            if service.role == "supernode":
                service.depends_on = [REGISTER_SERVICE]
    return [_install(services, images)] + services


def _secret(name: str) -> str:
    return f"{SECRETS_DIR}/{name}"


def _superlink(images: Images, insecure: bool, entrypoint: str | None) -> Service:
    link = Service("superlink", images.superlink, [
        "--isolation", "process", "--disable-runtime-dependency-installation",
        # inside its container: the deployment's network reaches it there; the host, through PUBLISH_HOST only
        "--host", "0.0.0.0", "--port", str(SUPERLINK_PORT), "--database", f"{STATE_DIR}/superlink.db"],
        entrypoint, role="superlink", ports=[SUPERLINK_PORT], volumes={STATE_VOLUME: STATE_DIR},
        writable=[STATE_VOLUME])
    if insecure:
        link.command.insert(0, "--insecure")
        return link
    link.secrets = ["ca.crt", "server.pem", "server.key", secret_file("serverapp")]
    link.command = [f"--ssl-ca-certfile={_secret('ca.crt')}", f"--ssl-certfile={_secret('server.pem')}",
                    f"--ssl-keyfile={_secret('server.key')}"] + link.command + [
        "--enable-supernode-auth", f"--superexec-auth-secret-file={_secret(secret_file('serverapp'))}"]
    link.depends_on = [INSTALL_SERVICE]
    return link


def _serverapp(images: Images, insecure: bool, entrypoint: str | None, build: dict | None) -> Service:
    command = ["--runtime-api-address", f"superlink:{SUPERLINK_PORT}"]
    service = Service("superexec-serverapp", images.superexec, command, entrypoint, role="serverapp",
                      volumes={"outputs": OUTPUT_DIR}, writable=["outputs"], depends_on=["superlink"], build=build)
    if insecure:
        command.append("--insecure")
    else:
        service.secrets = ["ca.crt", secret_file("serverapp")]
        command += [f"--root-certificates={_secret('ca.crt')}",
                    f"--superexec-auth-secret-file={_secret(secret_file('serverapp'))}"]
    return service


def _supernode(i: int, partitions: int, images: Images, insecure: bool, entrypoint: str | None) -> Service:
    node = f"supernode-{i}"
    command = ["--superlink", f"superlink:{SUPERLINK_PORT}"]
    command += ["--insecure"] if insecure else [f"--root-certificates={_secret('ca.crt')}"]
    command += ["--isolation", "process", "--host", "0.0.0.0", "--port", str(SUPERNODE_RUNTIME_PORT),
                "--node-config", f"partition-id={i} num-partitions={partitions}"]
    service = Service(node, images.supernode, command, entrypoint, role="supernode", partition_id=i,
                      depends_on=["superlink"])
    if not insecure:
        service.secrets = ["ca.crt", node, secret_file(f"clientapp-{i}")]
        command += [f"--auth-supernode-private-key={_secret(node)}",
                    f"--superexec-auth-secret-file={_secret(secret_file(f'clientapp-{i}'))}"]
    return service


def _clientapp(i: int, images: Images, insecure: bool, entrypoint: str | None, build: dict | None, cuda: bool,
               cpus: float | None) -> Service:
    # The SuperNode's Runtime API stays plain HTTP on the deployment's network; the secret authenticates it.
    command = ["--runtime-api-address", f"supernode-{i}:{SUPERNODE_RUNTIME_PORT}", "--insecure"]
    service = Service(f"superexec-clientapp-{i}", images.superexec, command, entrypoint, role="clientapp",
                      partition_id=i, depends_on=[f"supernode-{i}"], cpus=cpus, gpu=cuda, build=build)
    if not insecure:
        service.secrets = [secret_file(f"clientapp-{i}")]
        command.append(f"--superexec-auth-secret-file={_secret(secret_file(f'clientapp-{i}'))}")
    return service


def _register(num_supernodes: int, images: Images, build: dict | None) -> Service:
    keys = [f"supernode-{i}.pub" for i in range(num_supernodes)]
    return Service(REGISTER_SERVICE, images.superexec, [
        "-m", "asyncfl.deploy.keys", "--superlink", f"superlink:{SUPERLINK_PORT}",
        "--root-certificates", _secret("ca.crt")] + [_secret(key) for key in keys],
        "python", role="register", secrets=["ca.crt"] + keys, depends_on=["superlink"], one_shot=True, build=build)


def _install(services: list[Service], images: Images) -> Service:
    """The one-shot service that gives each service its own secrets volume with its own files."""
    install = Service(INSTALL_SERVICE, images.superlink, ["-c", install_script(services)], "/bin/sh",
                      role="install", volumes={MATERIAL_SOURCE: "/material"}, one_shot=True, user="root")
    for service in services:
        if service.secrets:
            volume = f"{SECRETS_VOLUME_PREFIX}{service.name}"
            service.volumes[volume] = SECRETS_DIR
            install.volumes[volume] = f"/install/{service.name}"
            install.writable.append(volume)
    return install


def install_script(services: list[Service]) -> str:
    """Shell commands that copy each service's secrets into its volume, owned by the containers' user, mode 600.

    The material folder on the host stays its owner's, mode 700: the helper runs as root to read it.
    """
    needed = sorted({name for service in services for name in service.secrets})
    lines = ["set -eu", "umask 077", "cd /material",
             f"for f in {' '.join(needed)}; do",
             '  [ -s "$f" ] || { echo "$f is missing from the key material folder: write it with asyncfl compose '
             '(or asyncfl docker up)" >&2; exit 1; }',
             "done"]
    for service in services:
        if service.secrets:
            target = f"/install/{service.name}"
            lines += [f"cp {' '.join(service.secrets)} {target}/",
                      f"chown -R {APP_UID}:{APP_UID} {target}", f"chmod 700 {target}",
                      f"chmod 600 {' '.join(f'{target}/{name}' for name in service.secrets)}"]
    return "\n".join(lines) + "\n"
