"""Containers for real: images built here, SuperLink + SuperNodes + SuperExecs in containers, a FedBuff run.

The images come from the offline route (a debootstrap base, PyTorch from a local
wheel when PIP_FIND_LINKS has one), as ``asyncfl docker base`` and ``asyncfl docker
build`` make them; the deployment is what ``asyncfl docker up`` starts.
"""

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from asyncfl.deploy import images
from asyncfl.deploy.containers import DockerDeployment
from tests.docker_engine import DockerEngine
from tests.deploy.test_deploy_e2e import SMALL, _collect, _finish, _wait_for_arrivals

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.docker]


def _asyncfl(*args: str, **popen) -> subprocess.Popen:
    """The ``asyncfl`` command of this environment, as the README gives it."""
    return subprocess.Popen([str(Path(os.sys.executable).parent / "asyncfl"), *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def _check(process: subprocess.Popen, timeout: float) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-3000:]
    return output


@pytest.fixture(scope="module")
def docker_images():
    """The engine (started here if need be) and the images, made with the README's commands."""
    engine = DockerEngine().start()
    if engine.skip_reason:
        pytest.skip(engine.skip_reason)
    try:
        client = engine.client
        try:
            client.images.get(images.BASE_IMAGE)
        except Exception:
            print(_check(_asyncfl("docker", "base"), 900).strip().splitlines()[-1])
        print(_check(_asyncfl("docker", "build"), 1800).strip().splitlines()[-2:])
        yield client
    finally:
        engine.stop()


def _runs(deployment: DockerDeployment) -> list[dict]:
    """``flwr ls`` of the deployment's SuperLink (the runs and their status)."""
    listing = subprocess.run([str(Path(os.sys.executable).parent / "flwr"), "ls", "asyncfl-docker", "--format", "json"],
                             env={**os.environ, "FLWR_HOME": str(deployment.workdir / "flwr-home")},
                             capture_output=True, text=True)
    try:
        return json.loads(listing.stdout)["runs"] or [{"status": "none"}]
    except (ValueError, KeyError):
        return [{"status": f"unreadable: {listing.stdout[-300:]}"}]


def test_fedbuff_in_containers_survives_a_killed_supernode_that_rejoins(docker_images, tmp_path):
    # Prepare: `asyncfl docker up --insecure` with 3 clients (a SuperNode + a ClientApp SuperExec container each,
    # CPU limits 1, 0.5, 1), all busy; jobs last 3 s (emulated) and count as lost after 45 s without a reply (a
    # job's round trip, a fresh flwr-clientapp process each, took 12.6 s on an idle machine and over 20 s on a
    # loaded one; the killed node's job is lost at once, node-offline, whatever the timeout).
    # Insecure, asked for by name: this drill is about the engine and a lost node. Under SuperNode authentication
    # Flower 1.42 refuses to activate a key again while its previous session may still be alive (2 heartbeat
    # intervals, 60 s), so a node killed and started again at once would be refused (docs/deployment.md).
    name = f"asyncfl-e2e-{uuid.uuid4().hex[:6]}"
    workdir = tmp_path / "docker"
    run_config = (f"{SMALL} strategy='fedbuff' concurrency=3 max-arrivals=18 timeout=45.0 "
                  "delay-model='uniform-speed' emulate-delay-scale=3.0 run-name='docker'")
    up = _asyncfl("docker", "up", "--insecure", "--supernodes", "3", "--cpus-per-client", "1,0.5,1", "--name", name,
                  "--workdir", str(workdir), "-c", run_config, start_new_session=True)
    lines: list[str] = []
    _collect(up, lines)
    node = f"{name}-supernode-1"
    try:
        # Act: once the run is under way, `docker kill` client 1's SuperNode, then start the same container.
        run = workdir / "outputs" / "docker"
        deadline = _wait_for_arrivals(run, 3, up, 600)
        limits = {c.name: c.attrs["HostConfig"]["NanoCpus"]
                  for c in docker_images.containers.list(filters={"label": f"asyncfl.deployment={name}"})}
        bindings = docker_images.api.inspect_container(f"{name}-superlink")["HostConfig"]["PortBindings"]["9093/tcp"]
        docker_images.api.kill(node)
        time.sleep(3.0)
        restarted = time.time()
        docker_images.api.start(node)
        _finish(up, lines, timeout=max(120.0, deadline - time.monotonic() + 300))
        rejoined = [line for line in docker_images.api.logs(node, since=int(restarted)).decode().splitlines()
                    if "Receiving: train message" in line]
    finally:
        _check(_asyncfl("docker", "down", "--name", name), 120)
    # Assert: the run completed, the killed node's job was counted, the restarted node got work again.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["arrivals"] == 18
    reasons = summary["rejected-by-reason"]
    assert reasons.get("node-offline", 0) + reasons.get("lost", 0) + reasons.get("error-reply", 0) >= 1
    assert rejoined, "the restarted SuperNode container received no train message"
    assert json.loads((run / "config.json").read_text())["engine"]["clock"] == "wall"
    assert limits[f"{name}-superexec-clientapp-1"] == 500_000_000 and limits[node] == 0
    # every container ran as the images' non-root user (the results are theirs); `down` removed them all
    assert (run / "metrics.csv").stat().st_uid == 49999
    # the insecure deployment was published on the host's loopback only
    assert bindings == [{"HostIp": "127.0.0.1", "HostPort": bindings[0]["HostPort"]}]
    assert (run / "clients.csv").exists()
    assert not docker_images.containers.list(all=True, filters={"label": f"asyncfl.deployment={name}"})


def test_tls_and_supernode_auth_in_containers_and_a_superlink_restart_mid_run(docker_images, tmp_path):
    # Prepare: the default deployment, closed: a CA and certificate written for it, 2 clients whose keys are
    # registered before they start, SuperExec secrets; every key reaches its container through a volume of its own.
    run_config = (f"{SMALL} strategy='fedbuff' concurrency=2 max-arrivals=12 timeout=30.0 "
                  "delay-model='uniform-speed' emulate-delay-scale=2.0 run-name='restart'")
    name = f"asyncfl-e2e-{uuid.uuid4().hex[:6]}"
    with DockerDeployment(2, name=name, workdir=tmp_path / "docker", client=docker_images) as deployment:
        superlink_command = docker_images.api.inspect_container(deployment.container_name("superlink"))["Args"]
        flwr = deployment.submit(ROOT, [run_config])
        lines: list[str] = []
        _collect(flwr, lines)
        run = deployment.outputs / "restart"
        _wait_for_arrivals(run, 3, flwr, 400)
        # Act: kill the SuperLink container and start it again on its state volume, mid-run.
        deployment.restart_superlink()
        # `flwr run --stream` loses its log stream with the SuperLink; the run itself goes on (below).
        deadline = time.monotonic() + 400
        while not _runs(deployment)[0]["status"].startswith("finished") and time.monotonic() < deadline:
            time.sleep(3.0)
        runs = _runs(deployment)
    # Assert: the ServerApp (in its own container) kept its state and finished the run over TLS, with the
    # SuperNodes the restarted SuperLink still knew (their registrations are in the state volume).
    assert "--enable-supernode-auth" in superlink_command and not any(a == "--insecure" for a in superlink_command)
    assert any(a.startswith("--superexec-auth-secret-file=") for a in superlink_command)
    assert all(p.stat().st_mode & 0o077 == 0 for p in deployment.material.iterdir() if p.suffix != ".pub")
    summary = json.loads((run / "summary.json").read_text())
    said = {key: summary.get(key) for key in ("arrivals", "clients", "stop-reason", "rejected-by-reason",
                                                "superlink-outages", "superlink-outage-seconds", "jobs-lost-to-outage",
                                                "jobs-resent-after-outage")}
    assert summary["arrivals"] == 12 and summary["clients"] == 2, (said, runs, "".join(lines[-40:]))
    assert len(runs) == 1 and runs[0]["status"] == "finished:completed", (said, runs)
