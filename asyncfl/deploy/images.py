"""The images of a container deployment, built on this machine (``asyncfl docker base`` / ``build``).

Three images, from what changes least to what changes most, so that a code
change rebuilds one small layer:

* a base with ``python3``: ``python:3.11-slim`` where an image registry is
  reachable, or ``asyncfl-base:bookworm``, a Debian root filesystem made with
  ``debootstrap`` from the host's own Debian mirror and ``docker import``-ed
  (:func:`make_base_image`; the offline route);
* ``asyncfl-flower:<flwr version>`` (``docker/flower.Dockerfile``): Flower in a
  venv, user ``app``; it runs the SuperLink and the SuperNodes;
* ``asyncfl-superexec:<asyncfl version>`` (``docker/superexec.Dockerfile``):
  PyTorch, asyncfl's dependencies and asyncfl; it runs the ServerApp and the
  ClientApps. PyTorch comes from a local wheel when one is given (the CPU build
  is a tenth of the CUDA build the package index serves).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from asyncfl import __version__
from asyncfl.deploy.topology import FLOWER_VERSION

BASE_IMAGE = "asyncfl-base:bookworm"
FLOWER_IMAGE = f"asyncfl-flower:{FLOWER_VERSION}"
SUPEREXEC_IMAGE = f"asyncfl-superexec:{__version__}"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
#: The files a SuperExec image is built from (paths relative to the project root, as in the Dockerfiles).
CONTEXT_FILES = ("pyproject.toml", "README.md", "docker/requirements.txt", "docker/flower.Dockerfile",
                 "docker/superexec.Dockerfile", "docker/superexec-cuda.Dockerfile")


@dataclass(frozen=True)
class BuiltImage:
    """An image built or found: its tag, size and how long the build took."""

    tag: str
    size_mb: float
    seconds: float


def requirements(pyproject: Path) -> list[str]:
    """asyncfl's runtime requirements for the SuperExec image: ``pyproject.toml``'s, without Flower
    (the Flower image has it) and PyTorch (installed in a layer of its own)."""
    with open(pyproject, "rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    return [d for d in dependencies if re.split(r"[\[=<>~! ]", d, maxsplit=1)[0] not in ("flwr", "torch")]


def requirements_text(pyproject: Path) -> str:
    """``docker/requirements.txt`` as it must read for ``pyproject``."""
    return ("# Written from pyproject.toml by asyncfl.deploy.images (Flower and PyTorch are installed apart).\n"
            + "\n".join(requirements(pyproject)) + "\n")


def torch_wheels(folders: Iterable[Path]) -> list[Path]:
    """The ``torch-*.whl`` files in ``folders`` (missing folders are skipped)."""
    return sorted(w for folder in folders if folder.is_dir() for w in folder.glob("torch-*.whl"))


SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def ca_bundle_from_env(env: dict[str, str]) -> Path | None:
    """The CA bundle the host trusts: ``PIP_CERT``, ``REQUESTS_CA_BUNDLE`` or ``SSL_CERT_FILE`` if set, else
    the system's bundle (which holds a TLS-inspecting proxy's CA where the host was set up for one)."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if env.get(name) and Path(env[name]).is_file():
            return Path(env[name])
    return SYSTEM_CA_BUNDLE if SYSTEM_CA_BUNDLE.is_file() else None


def build_context(root: Path, destination: Path, wheels: list[Path], ca_bundle: Path | None = None) -> Path:
    """Copy what the Dockerfiles read (package sources, metadata, requirements, wheels, a CA bundle for pip)
    to ``destination``."""
    for name in CONTEXT_FILES:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    for source in (root / "asyncfl").rglob("*.py"):
        target = destination / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    (destination / "docker" / "wheels").mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, destination / "docker" / "wheels" / wheel.name)
    (destination / "docker" / "trust").mkdir(parents=True, exist_ok=True)
    if ca_bundle is not None:
        shutil.copy2(ca_bundle, destination / "docker" / "trust" / "ca-bundle.crt")
    return destination


def debian_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The host's Debian archive URI (from ``sources.list.d/*.sources`` or ``sources.list``).

    Raises
    ------
    RuntimeError
        When no Debian archive is configured.
    """
    for path in sorted(sources.glob("sources.list.d/*.sources")):
        for uri in re.findall(r"^URIs:\s*(\S+)", path.read_text(), flags=re.MULTILINE):
            if not uri.rstrip("/").endswith("-security"):
                return uri
    listing = sources / "sources.list"
    if listing.exists():
        for match in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", listing.read_text(), flags=re.MULTILINE):
            if "security" not in match.group(2):
                return match.group(1)
    raise RuntimeError("no Debian archive in /etc/apt: pass --mirror, or build with --base python:3.11-slim "
                       "where an image registry is reachable")


def make_base_image(client, tag: str = BASE_IMAGE, suite: str = "bookworm", mirror: str | None = None,
                    log: Callable[[str], None] = print) -> BuiltImage:
    """A Debian ``minbase`` root filesystem with python3, made by ``debootstrap`` and imported as ``tag``.

    Needs root and ``debootstrap`` (``apt-get install debootstrap``); about three minutes.
    """
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap), or build with "
                           "--base python:3.11-slim where an image registry is reachable")
    mirror = mirror or debian_mirror()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="asyncfl-base-") as work:
        root = Path(work) / "root"
        log(f"debootstrap {suite} ({', '.join(BASE_PACKAGES)}) into {root}")
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(root),
                        mirror], check=True, stdout=subprocess.DEVNULL)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (root / cache).glob("*"):
                if item.is_file():
                    item.unlink()
        archive = Path(work) / "root.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True)
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(str(archive), repository=repository, tag=version or "latest")
    return image_info(client, tag, time.monotonic() - started)


def image_info(client, tag: str, seconds: float = 0.0) -> BuiltImage:
    """Size of the local image ``tag``."""
    return BuiltImage(tag, round(client.images.get(tag).attrs["Size"] / 2**20, 1), round(seconds, 1))


def _build(client, context: Path, dockerfile: str, tag: str, buildargs: dict[str, str],
           log: Callable[[str], None]) -> BuiltImage:
    started = time.monotonic()
    for chunk in client.api.build(path=str(context), dockerfile=dockerfile, tag=tag, buildargs=buildargs,
                                  network_mode="host", rm=True, forcerm=True, decode=True):
        if "error" in chunk:
            raise RuntimeError(f"building {tag} from {dockerfile} failed: {chunk['error'].strip()}")
        text = chunk.get("stream", "").strip()
        if text:
            log(text)
    return image_info(client, tag, time.monotonic() - started)


def build_images(client, root: Path, base: str = BASE_IMAGE, wheels: list[Path] | None = None,
                 torch_index_url: str = "", ca_bundle: Path | None = None,
                 log: Callable[[str], None] = print) -> list[BuiltImage]:
    """Build the Flower image from ``base`` and the SuperExec image from it; returns both, with sizes.

    ``RUN`` steps use the host's network (``pip`` reaches the package index as the host does, trusting
    ``ca_bundle`` if given: the host's own bundle where a proxy inspects TLS).
    """
    stale = root / "docker" / "requirements.txt"
    if stale.read_text() != requirements_text(root / "pyproject.toml"):
        raise RuntimeError("docker/requirements.txt does not match pyproject.toml; rewrite it with "
                           "`asyncfl docker requirements`")
    try:
        client.images.get(base)
    except Exception as exc:  # docker.errors.ImageNotFound, without importing docker here
        raise RuntimeError(f"base image {base!r} is not on this machine: make it with `asyncfl docker base` "
                           "(debootstrap, no registry needed) or pass --base python:3.11-slim") from exc
    with tempfile.TemporaryDirectory(prefix="asyncfl-context-") as work:
        context = build_context(root, Path(work), wheels or [], ca_bundle)
        flower = _build(client, context, "docker/flower.Dockerfile", FLOWER_IMAGE,
                        {"BASE": base, "FLWR_VERSION": FLOWER_VERSION}, log)
        superexec = _build(client, context, "docker/superexec.Dockerfile", SUPEREXEC_IMAGE,
                           {"FLOWER_IMAGE": FLOWER_IMAGE, "TORCH_INDEX_URL": torch_index_url}, log)
    return [flower, superexec]
