"""The container topology of a deployment, written once and used twice.

One SuperLink; one SuperExec that runs the ServerApp against the SuperLink's
Runtime API; per client a SuperNode (its own ``partition-id``) and a SuperExec
that runs its ClientApps against the SuperNode's Runtime API. This is Flower's
``--isolation process`` layout, the one its own Docker guide uses. The same
:class:`Service` list becomes a Compose file (:mod:`asyncfl.deploy.compose`, for
users with Compose v2) and the containers that ``asyncfl docker up`` starts
through the Docker Engine API (:mod:`asyncfl.deploy.containers`).

In Flower 1.41 the SuperLink serves Fleet, Control and Runtime APIs over HTTP on
one ``--host/--port``; a SuperNode serves its Runtime API on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FLOWER_VERSION = "1.42.0"
SUPERLINK_PORT = 9093
SUPERNODE_RUNTIME_PORT = 9094
CERT_DIR = "/app/certificates"
OUTPUT_DIR = "/app/outputs"
STATE_DIR = "/app/state"
KEY_DIR = "/app/keys"
#: Named volumes; every other volume source is a path relative to the deployment's folder.
NAMED_VOLUMES = ("superlink-state",)


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
    image serves SuperLink and SuperNode); Flower's images bring theirs.
    """

    name: str
    image: str
    command: list[str]
    entrypoint: str | None = None
    role: str = ""
    partition_id: int | None = None
    ports: list[int] = field(default_factory=list)
    # source -> container path; a source is a named volume (NAMED_VOLUMES) or a path under the deployment folder
    volumes: dict[str, str] = field(default_factory=dict)
    depends_on: list[str] = field(default_factory=list)
    cpus: float | None = None
    gpu: bool = False
    build: dict | None = None


def cpu_tiers(text: str) -> list[float]:
    """``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]``: CPUs per ClientApp container, cycled over the clients.

    Raises
    ------
    ValueError
        For a value that is not a positive number.
    """
    tiers = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"--cpus-per-client {text!r}: write comma-separated CPU counts such as '0.5,1,2'") from None
        if not value > 0:
            raise ValueError(f"--cpus-per-client {text!r}: every CPU count must be > 0, got {value}")
        tiers.append(value)
    return tiers


def deployment_services(num_supernodes: int, images: Images, tls: bool = False, cuda: bool = False,
                        num_partitions: int | None = None, cpus_per_client: list[float] | None = None,
                        entrypoints: bool = False, build: dict | None = None,
                        supernode_auth: bool = False) -> list[Service]:
    """The services of a deployment with ``num_supernodes`` clients.

    Parameters
    ----------
    num_supernodes : int
        SuperNodes (and ClientApp SuperExecs), partitions ``0..N-1``.
    images : Images
        Which image each role runs.
    tls : bool
        Serve the SuperLink over TLS with the certificates mounted at ``/app/certificates``;
        SuperNodes and the ServerApp SuperExec verify it with ``ca.crt``.
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
    supernode_auth : bool
        The SuperLink admits only registered SuperNodes (Flower requires TLS for it); SuperNode ``i``
        signs with the private key ``keys/supernode-i`` mounted at ``/app/keys/supernode-i``.
    """
    if supernode_auth and not tls:
        raise ValueError("supernode_auth needs tls: Flower's SuperLink authenticates SuperNodes only over TLS")
    if num_supernodes < 1:
        raise ValueError(f"num_supernodes must be >= 1, got {num_supernodes}")
    partitions = num_partitions or num_supernodes
    if partitions < num_supernodes:
        raise ValueError(f"num-partitions ({partitions}) must be >= the number of SuperNodes ({num_supernodes})")
    link_security = ([f"--ssl-ca-certfile={CERT_DIR}/ca.crt", f"--ssl-certfile={CERT_DIR}/server.pem",
                      f"--ssl-keyfile={CERT_DIR}/server.key"] if tls else ["--insecure"])
    client_security = [f"--root-certificates={CERT_DIR}/ca.crt"] if tls else ["--insecure"]
    certs = {"certificates": CERT_DIR} if tls else {}

    def entry(executable: str) -> str | None:
        return executable if entrypoints else None

    services = [
        Service("superlink", images.superlink, link_security + [
            "--isolation", "process", "--disable-runtime-dependency-installation", "--host", "0.0.0.0",
            "--port", str(SUPERLINK_PORT), "--database", f"{STATE_DIR}/superlink.db"]
            + (["--enable-supernode-auth"] if supernode_auth else []),
            entry("flower-superlink"), role="superlink", ports=[SUPERLINK_PORT],
            volumes={"superlink-state": STATE_DIR, **certs}),
        Service("superexec-serverapp", images.superexec,
                ["--runtime-api-address", f"superlink:{SUPERLINK_PORT}"] + client_security,
                entry("flower-superexec"), role="serverapp", volumes={"outputs": OUTPUT_DIR, **certs},
                depends_on=["superlink"], build=build),
    ]
    for i in range(num_supernodes):
        node = f"supernode-{i}"
        key = {f"keys/{node}": f"{KEY_DIR}/{node}"} if supernode_auth else {}
        services.append(Service(
            node, images.supernode, ["--superlink", f"superlink:{SUPERLINK_PORT}"] + client_security + [
                "--isolation", "process", "--host", "0.0.0.0", "--port", str(SUPERNODE_RUNTIME_PORT),
                "--node-config", f"partition-id={i} num-partitions={partitions}"]
            + ([f"--auth-supernode-private-key={KEY_DIR}/{node}"] if supernode_auth else []),
            entry("flower-supernode"), role="supernode", partition_id=i, volumes={**certs, **key},
            depends_on=["superlink"]))
        services.append(Service(
            f"superexec-clientapp-{i}", images.superexec,
            ["--runtime-api-address", f"{node}:{SUPERNODE_RUNTIME_PORT}", "--insecure"],
            entry("flower-superexec"), role="clientapp", partition_id=i, depends_on=[node],
            cpus=cpus_per_client[i % len(cpus_per_client)] if cpus_per_client else None, gpu=cuda, build=build))
    return services
