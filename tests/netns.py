"""Emulated hosts for the tests: two network namespaces joined by a veth pair (root and iproute2 needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager


def netns_available() -> str | None:
    """None where namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip tool (iproute2) is not installed"
    probe = f"asyncfl-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.call(["ip", "netns", "add", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if made != 0:
        return "this machine does not allow creating network namespaces"
    subprocess.call(["ip", "netns", "del", probe])
    return None


@contextmanager
def namespace_pair(names: tuple[str, str], addresses: tuple[str, str]):
    """Namespaces ``names`` with ``addresses`` (a /24 between them) on a veth pair; yields the names and
    removes both afterwards (and with them the veth pair)."""
    tag = uuid.uuid4().hex[:6]
    first, second = (f"asyncfl-{tag}-{name}" for name in names)
    ends = (f"afl{tag}a", f"afl{tag}b")
    commands = [["ip", "netns", "add", first], ["ip", "netns", "add", second],
                ["ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1]]]
    for namespace, end, address in zip((first, second), ends, addresses):
        commands += [["ip", "link", "set", end, "netns", namespace],
                     ["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", end],
                     ["ip", "-n", namespace, "link", "set", end, "up"],
                     ["ip", "-n", namespace, "link", "set", "lo", "up"]]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True)
        yield first, second
    finally:
        for namespace in (first, second):
            subprocess.call(["ip", "netns", "del", namespace], stderr=subprocess.DEVNULL)
