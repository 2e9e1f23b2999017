"""Real deployments: SuperLink and SuperNode processes over Flower's transport (slow; a few only).

One loopback run exercises the fault paths together: the SuperLink crashed and the
run resumed from its checkpoint, a SuperNode that returns NaN, one killed mid-run,
one that joins mid-run. Another puts the SuperLink and
the SuperNodes in separate network namespaces (emulated hosts) with TLS; one
checks that SuperNode authentication keeps out a node whose key is not registered.
"""

import csv
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from asyncfl.deploy.local import LocalDeployment
from asyncfl.deploy.processes import TlsFiles
from tests.netns import namespace_pair, netns_available

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("dataset='digits' model='mlp' local-steps=10 lr=0.01 evaluate-every-time=2.0 progress=false clock='wall' "
         "wait-for-nodes=60.0")

pytestmark = pytest.mark.e2e


def _collect(process: subprocess.Popen, lines: list[str]) -> threading.Thread:
    def read():
        for line in process.stdout:
            lines.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _arrivals_so_far(run: Path) -> int:
    metrics = run / "metrics.csv"
    if not metrics.exists():
        return 0
    rows = list(csv.DictReader(open(metrics)))
    return int(float(rows[-1]["arrivals"])) if rows else 0


def _wait_for_arrivals(run: Path, count: int, process: subprocess.Popen, seconds: float) -> float:
    """Wait until ``run`` has ``count`` arrivals (or the run ended, or time ran out); return the deadline."""
    deadline = time.monotonic() + seconds
    while _arrivals_so_far(run) < count and time.monotonic() < deadline and process.poll() is None:
        time.sleep(1.0)
    return deadline


def _finish(process: subprocess.Popen, lines: list[str], timeout: float) -> None:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)
        pytest.fail("flwr run did not finish in time:\n" + "".join(lines[-60:]))
    assert process.returncode == 0, "".join(lines[-60:])


def _wait_for_checkpoint(run: Path, process: subprocess.Popen, seconds: float) -> None:
    """Wait until ``run`` has a checkpoint on disk (or the run ended, or time ran out)."""
    deadline = time.monotonic() + seconds
    while not list((run / "checkpoints").glob("checkpoint-v*.npz")) and time.monotonic() < deadline \
            and process.poll() is None:
        time.sleep(1.0)


def test_loopback_deployment_survives_a_superlink_restart_nan_a_crash_and_a_late_joiner(tmp_path):
    # Prepare: 4 SuperNodes of 5 partitions, all busy; partition 3 returns NaN weights; a checkpoint every version.
    # Every job trains for 4 s (emulated), but on this 2-core machine a deployed job's round trip is 10-20 s
    # (Flower spawns a ClientApp process per message: imports, 4 at once), so a job counts as lost only after
    # 60 s without a reply. One deployment for all the faults: a SuperLink and its nodes take a minute to start.
    out = tmp_path / "outputs"
    run = out / "faults"
    overrides = (f"{SMALL} strategy='fedbuff' concurrency=4 max-arrivals=26 timeout=60.0 checkpoint-every=1 "
                 "delay-model='uniform-speed' emulate-delay-scale=4.0 "
                 f"output-dir='{out}' run-name='faults'")
    with LocalDeployment(ROOT, 4, num_partitions=5, node_config={3: "fault=nan"}, workdir=tmp_path / "deploy") as dep:
        flwr = dep.submit([overrides])
        lines: list[str] = []
        _collect(flwr, lines)
        # Act 1: once the run has arrivals and a checkpoint, crash the SuperLink (its ServerApp dies with it) and
        # bring it back on the same database; the same run submitted again with resume-from goes on from its
        # newest checkpoint and its journal, with the nodes the checkpoint knows.
        _wait_for_arrivals(run, 3, flwr, 400)
        _wait_for_checkpoint(run, flwr, 120)
        assert _arrivals_so_far(run) >= 3 and list((run / "checkpoints").glob("checkpoint-v*.npz")), \
            "".join(lines[-40:])
        dep.restart_superlink()
        written = list(csv.DictReader(open(run / "metrics.csv")))
        if flwr.poll() is None:  # the streaming client of the dead run is of no further use
            os.killpg(flwr.pid, 15)
            flwr.wait(timeout=30)
        second = dep.submit([f"{overrides} resume-from='{run}'"])
        lines2: list[str] = []
        _collect(second, lines2)
        # Act 2: once the resumed run is under way, crash partition 1 and start partition 4. Flower notices a
        # SIGKILLed SuperNode once its heartbeats stop (about a minute); the 20 or so arrivals after the crash take
        # longer than that, so the crashed node's job is counted either way.
        restarted_at = int(float(written[-1]["arrivals"])) if written else 0
        _wait_for_arrivals(run, restarted_at + 3, second, 400)
        dep.kill_supernode(1)
        dep.add_supernode(4)
        _finish(second, lines2, timeout=600)
    # Assert: the run completed in its folder from a checkpoint; nothing accepted before the restart was lost (its
    # rows are still there); NaN updates were rejected; the crashed node's job was counted (every node is busy at
    # concurrency 4: lost whichever way, dropped off the SuperLink's list, or its half-uploaded reply expired into
    # an error); the joiner became a client.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["arrivals"] == 26 and summary["resumed-from"].startswith(str(run))
    # (the folder's own record above, not the streamed log, which can end before the ServerApp's last lines)
    assert Path(summary["resumed-from"]).name.startswith("checkpoint-v"), "".join(lines2)[-3000:]
    reasons = summary["rejected-by-reason"]
    assert reasons.get("non-finite", 0) >= 1
    assert reasons.get("node-offline", 0) + reasons.get("lost", 0) + reasons.get("error-reply", 0) >= 1, reasons
    assert summary["clients"] == 5
    assert summary["best-accuracy"] > 0.2
    assert json.loads((run / "config.json").read_text())["engine"]["clock"] == "wall"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    arrivals = [int(float(r["arrivals"])) for r in rows]
    assert arrivals == sorted(arrivals) and arrivals[-1] == 26
    before = [(r["time"], r["arrivals"], r["accuracy"]) for r in written]
    assert [(r["time"], r["arrivals"], r["accuracy"]) for r in rows][: len(before)] == before
    assert dep.database.exists()


@pytest.fixture
def two_hosts():
    """Namespaces 'link' (10.77.0.1) and 'nodes' (10.77.0.2) joined by a veth pair; removed afterwards."""
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    with namespace_pair(("link", "nodes"), ("10.77.0.1", "10.77.0.2")) as (link, nodes):
        yield link, nodes


def test_separate_hosts_over_tls_with_supernode_auth_admit_registered_nodes_only(tmp_path, two_hosts):
    # Prepare: a TLS SuperLink with SuperNode authentication in namespace 'link'; in namespace 'nodes', two
    # registered SuperNodes and one whose key nobody registered.
    link_ns, nodes_ns = two_hosts
    certs = tmp_path / "certs"
    subprocess.run(["bash", str(ROOT / "scripts" / "make-certs.sh"), str(certs)], check=True, capture_output=True)
    tls = TlsFiles(certs / "ca.crt", certs / "server.pem", certs / "server.key")
    out = tmp_path / "outputs"
    overrides = f"{SMALL} strategy='fedasync' concurrency=2 max-arrivals=6 output-dir='{out}' run-name='hosts'"
    with LocalDeployment(ROOT, 2, num_partitions=3, tls=tls, supernode_auth=True, link_netns=link_ns,
                         nodes_netns=nodes_ns, link_host="10.77.0.1", workdir=tmp_path / "deploy") as dep:
        intruder = dep.add_supernode(2, register=False)
        # Act: the unregistered node tries to join; the run goes to the registered ones.
        intruder.process.wait(timeout=120)
        flwr = dep.submit([overrides])
        lines: list[str] = []
        _collect(flwr, lines)
        _finish(flwr, lines, timeout=400)
    # Assert: the SuperLink refused the unregistered key; the registered nodes did the work.
    assert intruder.process.returncode != 0
    assert "Failed to activate SuperNode" in (tmp_path / "deploy" / "supernode-2.log").read_text()
    summary = json.loads((out / "hosts" / "summary.json").read_text())
    assert summary["arrivals"] == 6 and summary["clients"] == 2
    # The SuperNodes really were in the other namespace: the SuperLink saw them connect from 10.77.0.2.
    assert "10.77.0.2" in (tmp_path / "deploy" / "superlink.log").read_text()


def test_compose_topology_runs_as_plain_processes(tmp_path):
    """The commands of docker/compose.yml, closed as generated, run as processes on loopback (no Docker here).

    Service names become 127.0.0.1, each SuperNode's Runtime API port a free one, the SuperLink's
    database a temporary file and every container's ``/app/secrets`` one key material folder written
    as ``asyncfl compose`` writes it; the SuperNodes' keys are registered as the file's one-shot
    service registers them. Every other flag is the file's: TLS, SuperNode and SuperExec authentication.
    """
    import yaml

    from asyncfl.deploy.keys import register_keys
    from asyncfl.deploy.processes import write_connection
    from asyncfl.deploy.material import ensure_material
    from asyncfl.deploy.processes import FlowerProcess, flower_env, flower_tool, free_port, wait_for_port

    services = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())["services"]
    link_port = free_port()
    node_ports = {name: free_port() for name in services if name.startswith("supernode-")}
    nodes_wanted = 2
    material = ensure_material(tmp_path / "certificates", nodes_wanted)

    def localise(command: list[str], own_port: int | None = None) -> list[str]:
        out = []
        for item in command:
            item = item.replace("superlink:9093", f"127.0.0.1:{link_port}").replace("/app/secrets/", f"{material}/")
            for name, port in node_ports.items():
                item = item.replace(f"{name}:9094", f"127.0.0.1:{port}")
            out.append(item.replace("/app/state/superlink.db", str(tmp_path / "link.db")))
        if "--host" in out:  # 0.0.0.0 inside a container; on this host, loopback
            out[out.index("--host") + 1] = "127.0.0.1"
        if own_port is not None:
            out[out.index("--port") + 1] = str(own_port)
        return out

    assert "--insecure" not in services["superlink"]["command"]
    home = tmp_path / "home"
    write_connection(home, "compose", f"127.0.0.1:{link_port}", material / "ca.crt")
    env = flower_env(home)
    started = []
    try:
        link = FlowerProcess([flower_tool("flower-superlink")] + localise(services["superlink"]["command"], link_port),
                             tmp_path / "link.log", tmp_path, env).start()
        started.append(link)
        wait_for_port("127.0.0.1", link_port, link.process, 60, "superlink")
        started.append(FlowerProcess([flower_tool("flower-superexec")] + localise(services["superexec-serverapp"]["command"]),
                                     tmp_path / "sx.log", tmp_path, env).start())
        register_keys([material / f"supernode-{i}.pub" for i in range(nodes_wanted)], f"127.0.0.1:{link_port}",
                      material / "ca.crt", wait=60.0)
        for i in range(nodes_wanted):
            name = f"supernode-{i}"
            command = localise(services[name]["command"], node_ports[name])
            command[command.index("--node-config") + 1] = f"partition-id={i} num-partitions={nodes_wanted}"
            started.append(FlowerProcess([flower_tool("flower-supernode")] + command, tmp_path / f"{name}.log",
                                         tmp_path, env).start())
            started.append(FlowerProcess(
                [flower_tool("flower-superexec")] + localise(services[f"superexec-clientapp-{i}"]["command"]),
                tmp_path / f"cx{i}.log", tmp_path, env).start())
        out = tmp_path / "outputs"
        flwr = subprocess.Popen(
            [flower_tool("flwr"), "run", str(ROOT), "compose", "--stream", "--run-config",
             f"{SMALL} strategy='fedbuff' fedbuff.buffer-size=2 concurrency=2 max-arrivals=4 output-dir='{out}' "
             "run-name='compose'"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list[str] = []
        _collect(flwr, lines)
        _finish(flwr, lines, timeout=400)
    finally:
        for process in reversed(started):
            process.stop()
    summary = json.loads((out / "compose" / "summary.json").read_text())
    assert summary["arrivals"] == 4 and summary["clients"] == 2
