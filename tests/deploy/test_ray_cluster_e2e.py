"""The simulation on a real two-node Ray cluster: a head and a worker node, each in a network namespace.

``ray start --head`` in one namespace (10.79.0.1), ``ray start --address`` in the other
(10.79.0.2), joined by a veth pair: two Ray nodes that reach each other only over the
network, as on two machines. ``asyncfl run --ray-address`` runs from the head's
namespace, as Flower's docs say to run ``flwr run`` from the head. Stopping kills the
processes of the two namespaces (only what these tests started), then removes them.
"""

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.netns import namespace_pair, netns_available

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HEAD_IP, WORKER_IP, PORT = "10.79.0.1", "10.79.0.2", 6379
SMALL = "dataset='digits' model='mlp' local-steps=10 concurrency=2 evaluate-every-time=2.0 progress=false"

pytestmark = pytest.mark.e2e


def _in(namespace: str, *command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", namespace, *command], **kwargs)


def _kill_namespace(namespace: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    for pid in pids:
        subprocess.call(["kill", "-9", pid], stderr=subprocess.DEVNULL)


@pytest.fixture
def ray_cluster():
    """A Ray head (1 CPU) and a Ray worker node (1 CPU) in two namespaces; yields them and the address."""
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    env = {"RAY_DISABLE_USAGE_STATS": "1", "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin"}
    with namespace_pair(("rayhead", "raywk"), (HEAD_IP, WORKER_IP)) as (head, worker):
        try:
            _in(head, str(BIN / "ray"), "start", "--head", "--node-ip-address", HEAD_IP, "--port", str(PORT),
                "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats", check=True,
                capture_output=True, env=env)
            _in(worker, str(BIN / "ray"), "start", "--address", f"{HEAD_IP}:{PORT}", "--node-ip-address", WORKER_IP,
                "--num-cpus", "1", "--disable-usage-stats", check=True, capture_output=True, env=env)
            yield head, worker, f"{HEAD_IP}:{PORT}"
        finally:
            for namespace in (worker, head):
                _kill_namespace(namespace)
            time.sleep(1.0)
            # `ray start --head` points Ray's current-cluster file at this cluster; leave no pointer to a dead one
            current = Path("/tmp/ray/ray_current_cluster")
            if current.exists() and current.read_text().strip() == f"{HEAD_IP}:{PORT}":
                current.unlink()


def _asyncfl_run(overrides: str, namespace: str | None = None, ray_address: str | None = None,
                 background: bool = False):
    command = [str(BIN / "asyncfl"), "run", "--app", str(ROOT), "--num-supernodes", "6", "-c", overrides]
    if ray_address:
        command[2:2] = ["--ray-address", ray_address]
    if namespace:
        command = ["ip", "netns", "exec", namespace] + command
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if background:
        return process
    output, _ = process.communicate(timeout=400)
    assert process.returncode == 0, output[-3000:]
    return output


def _arrivals(run: Path) -> int:
    try:
        rows = list(csv.DictReader(open(run / "metrics.csv")))
    except FileNotFoundError:
        return 0
    return int(float(rows[-1]["arrivals"])) if rows else 0


def test_a_two_node_ray_cluster_runs_clientapps_on_both_nodes_and_survives_losing_the_worker(ray_cluster, tmp_path):
    head, worker, address = ray_cluster
    # 1. Same seed on the cluster and on this machine alone: the virtual clock, not Ray, orders the arrivals.
    _asyncfl_run(f"{SMALL} max-arrivals=20 output-dir='{tmp_path}' run-name='cluster'", head, address)
    _asyncfl_run(f"{SMALL} max-arrivals=20 output-dir='{tmp_path}' run-name='alone'")
    cluster = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    by_node = cluster["arrivals-by-ray-node"]
    assert len(by_node) == 2 and all(count > 0 for count in by_node.values()), by_node
    assert (tmp_path / "cluster" / "metrics.csv").read_bytes() == (tmp_path / "alone" / "metrics.csv").read_bytes()
    # 2. The worker node dies mid-run (its raylet and actors killed): the run still completes on the head.
    run = tmp_path / "loss"
    process = _asyncfl_run(f"concurrency=2 max-arrivals=24 evaluate-every-time=2.0 progress=false output-dir='{tmp_path}' "
                           "run-name='loss'", head, address, background=True)
    deadline = time.monotonic() + 300
    while _arrivals(run) < 8 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    _kill_namespace(worker)
    output, _ = process.communicate(timeout=400)
    assert process.returncode == 0, output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["arrivals"] == 24
    assert len(summary["arrivals-by-ray-node"]) == 2
    # Flower keeps the dead node's actor in its pool: jobs sent to it fail at once and are counted, not lost
    assert summary["rejected-by-reason"].get("error-reply", 0) >= 1
