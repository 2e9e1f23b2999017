"""SuperNode authentication keys and their registration with the SuperLink.

Flower 1.41 authenticates SuperNodes with elliptic-curve key pairs on a NIST
curve, both halves in OpenSSH format: the SuperNode signs its requests with the
private key (``--auth-supernode-private-key``), and the SuperLink, started with
``--enable-supernode-auth`` (TLS only), admits only nodes whose public key an
operator added with ``flwr supernode register KEY.pub CONNECTION``. We write the
keys ourselves (``cryptography``, which Flower already needs) so that no
``ssh-keygen`` is required on the host.

``python -m asyncfl.deploy.keys --superlink HOST:PORT --root-certificates CA KEY.pub ...``
registers keys once the SuperLink answers: the one-shot service of a Compose
deployment runs it before the SuperNodes start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


@dataclass(frozen=True)
class NodeKeys:
    """A SuperNode's key pair on disk."""

    private_key: Path
    public_key: Path


def private_folder(folder: Path) -> Path:
    """Create ``folder`` (and its parents) and make it mode 700."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` with mode 600 from the first byte on (no moment where others may read it)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    path.chmod(0o600)  # O_CREAT's mode does not apply to a file that already existed
    return path


def write_node_keys(folder: Path, name: str) -> NodeKeys:
    """Write a fresh P-384 key pair ``folder/name`` (private, mode 600) and ``folder/name.pub`` (folder mode 700)."""
    private_folder(folder)
    key = ec.generate_private_key(ec.SECP384R1())
    private = write_private(folder / name, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    public = folder / f"{name}.pub"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return NodeKeys(private, public)


def register_node_key(flwr: str, public_key: Path, connection: str, env: dict[str, str],
                      netns: str | None = None, timeout: float = 60.0) -> int:
    """``flwr supernode register`` one public key; returns the node id the SuperLink assigned.

    Raises
    ------
    RuntimeError
        With Flower's output, when the SuperLink refuses the key.
    """
    command = [flwr, "supernode", "register", str(public_key), connection, "--format", "json"]
    if netns:
        command = ["ip", "netns", "exec", netns] + command
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    node_id = registered_node_id(done.stdout)
    if done.returncode != 0 or node_id is None:
        raise RuntimeError(f"registering {public_key} with {connection} failed (exit {done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return node_id


def registered_node_id(output: str) -> int | None:
    """The ``node-id`` of ``flwr supernode register --format json`` output, or None on failure."""
    try:
        document = json.loads(output)
        return int(document["node-id"]) if document.get("success") else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


#: What the SuperLink answers for a key it has registered already (a deployment started again).
ALREADY_REGISTERED = "Public key already in use"


def register_keys(public_keys: list[Path], superlink: str, root_certificates: Path, wait: float = 180.0,
                  log=print) -> None:
    """Register every key with the SuperLink at ``superlink`` (TLS, verified with ``root_certificates``).

    Retries for up to ``wait`` seconds while the SuperLink is not yet answering; a key the SuperLink has
    registered already counts as registered.

    Raises
    ------
    RuntimeError
        With Flower's output, when a key is still refused after ``wait`` seconds.
    """
    from asyncfl.deploy.processes import flower_env, flower_tool, write_connection

    home = Path(tempfile.mkdtemp(prefix="asyncfl-register-"))
    write_connection(home, "deployment", superlink, root_certificates)
    env, flwr = flower_env(home), flower_tool("flwr")
    deadline = time.monotonic() + wait
    for key in public_keys:
        while True:
            try:
                log(f"{key}: registered as SuperNode {register_node_key(flwr, key, 'deployment', env)}")
                break
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                if ALREADY_REGISTERED in str(exc):
                    log(f"{key}: registered already")
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{key} was not registered within {wait:.0f} s: {exc}") from exc
                time.sleep(2.0)


def main(argv: list[str] | None = None) -> int:
    """Command line of :func:`register_keys`; exit status 1, with Flower's answer, when a key is refused."""
    parser = argparse.ArgumentParser(prog="python -m asyncfl.deploy.keys",
                                     description="register SuperNode public keys with a SuperLink")
    parser.add_argument("--superlink", required=True, help="the SuperLink's address, HOST:PORT")
    parser.add_argument("--root-certificates", type=Path, required=True, help="CA certificate to verify it with")
    parser.add_argument("--wait", type=float, default=180.0, help="seconds to wait for the SuperLink (default 180)")
    parser.add_argument("keys", type=Path, nargs="+", help="public keys (OpenSSH format, NIST curve)")
    args = parser.parse_args(argv)
    try:
        register_keys(args.keys, args.superlink, args.root_certificates, args.wait)
    except RuntimeError as exc:
        print(f"register-supernodes: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
