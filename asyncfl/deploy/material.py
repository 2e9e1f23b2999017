"""The key material of a closed deployment, written on first use and kept afterwards.

A deployment that is not asked to be insecure needs, in one folder (mode 700,
every private file mode 600):

* ``ca.crt``, ``server.pem``, ``server.key``: a development CA and the SuperLink's
  certificate (TLS for the Fleet, Control and Runtime APIs). The CA's own key is
  not kept: nobody can sign a second certificate with it. A user who brings
  certificates puts these three files in the folder first; they are kept.
* ``supernode-<i>`` and ``supernode-<i>.pub``: SuperNode ``i``'s key pair
  (Flower's SuperNode authentication, :mod:`asyncfl.deploy.keys`).
* ``superexec-<service>.secret``: the shared secret with which a SuperExec signs
  its requests to the Runtime API it serves (Flower's SuperExec authentication):
  one for the ServerApp's SuperExec and the SuperLink, one per ClientApp
  SuperExec and its SuperNode.

Files already there are reused, so a deployment started again keeps the keys its
SuperLink registered.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from asyncfl.deploy.keys import private_folder, write_node_keys, write_private
from asyncfl.errors import ConfigError

TLS_FILES = ("ca.crt", "server.pem", "server.key")
#: Names the SuperLink's certificate is valid for: the service name inside a deployment, the host's loopback.
SERVER_NAMES = ("localhost", "superlink", "127.0.0.1")
VALID_DAYS = 365


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _subject_alternative_names(names: tuple[str, ...]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _certificate(subject: x509.Name, public_key, issuer: x509.Name, issuer_key, extensions: list) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA384())


def write_tls_files(folder: Path, names: tuple[str, ...] = SERVER_NAMES) -> None:
    """A fresh CA (``ca.crt``) and a SuperLink certificate it signed for ``names`` (``server.pem``,
    ``server.key``), with the extensions strict verifiers require (Python >= 3.13's default context)."""
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("asyncfl-deployment-ca")
    ca_identifier = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = _certificate(ca_name, ca_key.public_key(), ca_name, ca_key, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                       encipher_only=False, decipher_only=False), True),
        (ca_identifier, False),
    ])
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _certificate(_name("superlink"), server_key.public_key(), ca_name, ca_key, [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                       encipher_only=False, decipher_only=False), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (_subject_alternative_names(names), False),
        (x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), False),
        (x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_identifier), False),
    ])
    write_private(folder / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    write_private(folder / "server.pem", server.public_bytes(serialization.Encoding.PEM))
    write_private(folder / "server.key", server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _incomplete_tls(folder: Path) -> str | None:
    """What is wrong with the TLS files in ``folder`` (some there, some not), or None."""
    present = [name for name in TLS_FILES if (folder / name).exists()]
    if not present or len(present) == len(TLS_FILES):
        return None
    missing = sorted(set(TLS_FILES) - set(present))
    return (f"{folder} has {', '.join(present)} but not {', '.join(missing)}: add them, or remove "
            f"{', '.join(present)} to have a new CA and SuperLink certificate written")


def _incomplete_pair(folder: Path, node: str) -> str | None:
    """What is wrong with ``node``'s key pair in ``folder`` (one half there without the other), or None."""
    private, public = folder / node, folder / f"{node}.pub"
    if private.exists() == public.exists():
        return None
    present = private if private.exists() else public
    return f"{present} is there without its other half: remove it to have a new key pair written"


def secret_file(service: str) -> str:
    """File name of the SuperExec shared secret of ``service`` (``serverapp``, ``clientapp-<i>``)."""
    return f"superexec-{service}.secret"


def _ensure_secret(folder: Path, service: str) -> None:
    """Keep ``superexec-<service>.secret`` if it is there and not empty, else write 32 random bytes (as hex)."""
    path = folder / secret_file(service)
    if not (path.exists() and path.stat().st_size > 0):
        write_private(path, secrets.token_hex(32).encode())


def ensure_material(folder: Path, num_supernodes: int) -> Path:
    """Everything a closed deployment of ``num_supernodes`` SuperNodes reads, in ``folder`` (mode 700).

    What is there is kept (and made mode 600), what is missing is written. Returns the folder.

    Raises
    ------
    ConfigError
        For an incomplete set (some TLS files, half a key pair), before anything is written: half of a
        user's own set would otherwise be replaced without a word.
    """
    folder = folder.resolve()
    nodes = [f"supernode-{i}" for i in range(num_supernodes)]
    problems = [_incomplete_tls(folder)] + [_incomplete_pair(folder, node) for node in nodes]
    if any(problems):
        raise ConfigError(next(p for p in problems if p))
    private_folder(folder)
    if not (folder / "server.key").exists():
        write_tls_files(folder)
    _ensure_secret(folder, "serverapp")
    for i, node in enumerate(nodes):
        if not (folder / node).exists():
            write_node_keys(folder, node)
        _ensure_secret(folder, f"clientapp-{i}")
    for path in folder.iterdir():
        if path.is_file() and path.suffix != ".pub":
            path.chmod(0o600)
    return folder
