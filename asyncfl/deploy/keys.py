"""SuperNode authentication keys and their registration with the SuperLink.

Flower 1.41 authenticates SuperNodes with elliptic-curve key pairs on a NIST
curve, both halves in OpenSSH format: the SuperNode signs its requests with the
private key (``--auth-supernode-private-key``), and the SuperLink, started with
``--enable-supernode-auth`` (TLS only), admits only nodes whose public key an
operator added with ``flwr supernode register KEY.pub CONNECTION``. We write the
keys ourselves (``cryptography``, which Flower already needs) so that no
``ssh-keygen`` is required on the host.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


@dataclass(frozen=True)
class NodeKeys:
    """A SuperNode's key pair on disk."""

    private_key: Path
    public_key: Path


def write_node_keys(folder: Path, name: str) -> NodeKeys:
    """Write a fresh P-384 key pair ``folder/name`` (private, mode 600) and ``folder/name.pub``."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = folder / name
    public = folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    private.chmod(0o600)
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
