"""Docker Compose files for a deployment: SuperLink, ServerApp SuperExec, N SuperNodes + ClientApp SuperExecs.

The layout follows Flower's own compose files with ``--isolation process``:
the SuperLink and every SuperNode run Flower's pinned images; a SuperExec
container next to each (built from ``docker/superexec.Dockerfile``, which adds
PyTorch and asyncfl) runs the ServerApp / ClientApps against their Runtime API.
Each SuperNode gets its own ``partition-id``. ``flwr run`` is then submitted
from the host to the SuperLink's published port.

In Flower 1.41 the SuperLink serves Fleet, Control and Runtime APIs over HTTP
on one ``--host/--port``; a SuperNode serves its Runtime API on its own
``--host/--port``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

FLOWER_VERSION = "1.41.0"
SUPERLINK_PORT = 9093
SUPERNODE_RUNTIME_PORT = 9094
CERT_DIR = "/app/certificates"


def compose_spec(num_supernodes: int, tls: bool = False, cuda: bool = False, flower_version: str = FLOWER_VERSION,
                 emulate_partitions: int | None = None) -> dict:
    """The compose document as a dict.

    Parameters
    ----------
    num_supernodes : int
        SuperNodes (and ClientApp SuperExecs), partitions ``0..N-1``.
    tls : bool
        Serve the SuperLink over TLS with ``certificates/`` (``scripts/make-certs.sh``)
        mounted read-only; SuperNodes and SuperExecs verify it with ``ca.crt``.
    cuda : bool
        Build ClientApp SuperExecs from the CUDA Dockerfile and reserve a GPU each.
    emulate_partitions : int, optional
        ``num-partitions`` if it should differ from ``num_supernodes`` (nodes may join later).
    """
    if num_supernodes < 1:
        raise ValueError(f"num_supernodes must be >= 1, got {num_supernodes}")
    partitions = emulate_partitions or num_supernodes
    if partitions < num_supernodes:
        raise ValueError(f"num-partitions ({partitions}) must be >= the number of SuperNodes ({num_supernodes})")
    certs = {"volumes": ["../certificates:" + CERT_DIR + ":ro"]} if tls else {}
    link_security = ([f"--ssl-ca-certfile={CERT_DIR}/ca.crt", f"--ssl-certfile={CERT_DIR}/server.pem",
                      f"--ssl-keyfile={CERT_DIR}/server.key"] if tls else ["--insecure"])
    client_security = [f"--root-certificates={CERT_DIR}/ca.crt"] if tls else ["--insecure"]
    superexec_build = {"context": "..", "dockerfile": "docker/superexec.Dockerfile",
                       "args": {"FLWR_VERSION": flower_version}}
    services: dict[str, dict] = {
        "superlink": {
            "image": f"flwr/superlink:{flower_version}",
            "command": link_security + ["--isolation", "process", "--disable-runtime-dependency-installation",
                                        "--host", "0.0.0.0", "--port", str(SUPERLINK_PORT),
                                        "--database", "/app/state/superlink.db"],
            "ports": [f"{SUPERLINK_PORT}:{SUPERLINK_PORT}"],
            "volumes": ["superlink-state:/app/state"] + certs.get("volumes", []),
        },
        "superexec-serverapp": {
            "build": superexec_build,
            "image": "asyncfl-superexec:latest",
            "command": ["--runtime-api-address", f"superlink:{SUPERLINK_PORT}"] + client_security,
            "volumes": ["./outputs:/app/outputs"] + certs.get("volumes", []),
            "depends_on": ["superlink"],
        },
    }
    for i in range(num_supernodes):
        node = f"supernode-{i}"
        services[node] = {
            "image": f"flwr/supernode:{flower_version}",
            "command": ["--superlink", f"superlink:{SUPERLINK_PORT}"] + client_security + [
                "--isolation", "process", "--host", "0.0.0.0", "--port", str(SUPERNODE_RUNTIME_PORT),
                "--node-config", f"partition-id={i} num-partitions={partitions}"],
            "depends_on": ["superlink"],
            **certs,
        }
        clientapp = {
            "build": {**superexec_build, "dockerfile": "docker/superexec-cuda.Dockerfile"} if cuda else superexec_build,
            "image": "asyncfl-superexec-cuda:latest" if cuda else "asyncfl-superexec:latest",
            "command": ["--runtime-api-address", f"{node}:{SUPERNODE_RUNTIME_PORT}", "--insecure"],
            "depends_on": [node],
        }
        if cuda:
            clientapp["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]}}}
        services[f"superexec-clientapp-{i}"] = clientapp
    services = {name: copy.deepcopy(service) for name, service in services.items()}
    return {"name": "asyncfl", "services": services, "volumes": {"superlink-state": {}}}


def write_compose(path: Path, num_supernodes: int, **options) -> Path:
    """Write :func:`compose_spec` as YAML to ``path``, with a header saying how it was made."""
    spec = compose_spec(num_supernodes, **options)
    flags = " ".join(f"--{k.replace('_', '-')}" for k, v in options.items() if v is True)
    header = (f"# Generated by `asyncfl compose --supernodes {num_supernodes} {flags}`; do not edit by hand.\n"
              "# Build and start: docker compose -f <this file> up --build -d\n"
              "# Then submit from the host: flwr run . <connection to localhost:9093> --stream\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Deep copies: no YAML anchors/aliases, every service reads on its own.
    path.write_text(header + yaml.safe_dump(copy.deepcopy(spec), sort_keys=False))
    return path
