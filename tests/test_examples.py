"""The examples run for real through `flwr run` (slow: marked e2e): the quickstart as a Flower user runs it, with
Flower's own managed local SuperLink, the others through `asyncfl run`'s private simulation SuperLink."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.e2e


def run_example(name: str, tmp_path: Path, overrides: str, supernodes: int = 6) -> tuple[Path, str]:
    """Copy ``examples/<name>`` to ``tmp_path`` and ``asyncfl run`` it there; returns the copy and the output."""
    app = tmp_path / name
    shutil.copytree(ROOT / "examples" / name, app, ignore=shutil.ignore_patterns(".flwr", "final_model.pt"))
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(app), "--num-supernodes", str(supernodes),
               "-c", overrides]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"flwr run did not finish in 300 s:\n{(exc.stdout or '')[-3000:]}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return app, output


FLOWER_LOCAL_SUPERLINK_PORT = 39093  # the port Flower's managed local SuperLink serves on (flwr.cli.constant)


def processes_with_env(name: str, value: str) -> list[int]:
    """PIDs of the processes whose environment has ``name=value`` (what a test started, however detached)."""
    wanted, found = f"{name}={value}".encode(), []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def flower_local_superlink_run(app: Path, flwr_home: Path, overrides: str, supernodes: int) -> str:
    """``flwr run . --stream`` in ``app`` as the examples' README says, Flower's managed local SuperLink in
    ``flwr_home``; stops that SuperLink and everything it started (Flower leaves it running by design)."""
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'
                                           f'options.num-supernodes = {supernodes}\n')
    env = dict(os.environ, FLWR_HOME=str(flwr_home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        done = subprocess.run(["flwr", "run", ".", "--stream", "--run-config", overrides], cwd=app, env=env,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"flwr run did not finish in 300 s:\n{(exc.stdout or '')[-3000:]}")
    finally:
        for pid in processes_with_env("FLWR_HOME", str(flwr_home)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


def test_quickstart_pytorch_with_one_import_changed_learns_through_flowers_own_flwr_run(tmp_path):
    # Arrange: the example as a Flower user has it, run the way Flower's docs run an app: `flwr run .`, which
    # starts Flower's managed local SuperLink; asyncfl is installed in this environment, not on a package index,
    # so Flower's runtime installation of the app's dependencies is switched off by Flower's own variable
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", FLOWER_LOCAL_SUPERLINK_PORT)) == 0:
            pytest.skip("a Flower local SuperLink already runs on this machine (flwr run would use it)")
    app = tmp_path / "quickstart-pytorch"
    shutil.copytree(ROOT / "examples" / "quickstart-pytorch", app,
                    ignore=shutil.ignore_patterns(".flwr", "final_model.pt"))
    # Execute: Flower's quickstart shape (own CNN, own ClientApp with SGD momentum 0.9 at the example's lr 0.1,
    # own evaluate_fn) with FedBuff swapped in, 16 rounds on 6 nodes, Ray's real arrival order (wall clock)
    output = flower_local_superlink_run(app, tmp_path / "flwr-home", "num-server-rounds=16 fraction-evaluate=0.5", 6)
    # Assert: the final model is written by the user's own code, in the user's own layout
    state = torch.load(app / "final_model.pt")
    assert list(state) == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias",
                           "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    # ... and it learned: on the example's held-out digits (10 classes, chance 0.1). Measured in process on this
    # app at equal speeds (benchmarks/dropin e2e-shape, 10 seeds, 16 rounds of 6 updates): asyncfl's FedAvg ends
    # at 0.91-0.93, FedBuff's defaults (B = 2 for 6 jobs in flight, measured pace) at 0.86-0.93; the bar leaves
    # room for Ray's arrival order.
    sys.path.insert(0, str(app))
    try:
        from pytorchexample.task import Net, load_centralized_dataset, test
    finally:
        sys.path.remove(str(app))
    model = Net()
    model.load_state_dict(state)
    _, accuracy = test(model, load_centralized_dataset("digits"), "cpu")
    assert accuracy >= 0.7, output[-3000:]
    # server-side evaluation after every round, federated evaluation too; 16 rounds = 16 x 6 updates, as FedAvg
    for round_ in (0, 1, 16):
        assert f"server-side evaluation of round {round_} (server version" in output
    assert "federated evaluation of round 16 on 3 node(s)" in output
    assert "stop at 16 rounds = 96 accepted updates" in output
    assert "FedBuff finished" in output and "16 rounds (of 6 updates), 96 arrivals, 48 server versions" in output
    # a stock ClientApp: no identity query on the (default) wall clock, so no traceback per node
    assert "Traceback" not in output


def test_fedecho_with_a_user_model_writes_its_run_folder(tmp_path):
    # Execute: a seeded simulation (user model with BatchNorm, user ClientApp with asyncfl's identity answer,
    # FedEcho distilling on the user's unlabeled inputs, virtual clock). Same seed, same metrics through real
    # Flower and Ray is asserted once, for FedBuff (test_e2e.py); FedEcho's own seeding in test_fedecho.py.
    out = tmp_path / "out"
    app, _ = run_example("fedecho-custom-model", tmp_path / "a",
                              f"num-server-rounds=2 output-dir='{out}' run-name='run'", supernodes=8)
    assert (app / "final_model.pt").exists()
    summary = json.loads((out / "run" / "summary.json").read_text())
    # 2 rounds = 2 x 8 updates (FedAvg's cohort on 8 nodes), i.e. 5 buffers of 3 and one update left buffered
    assert summary["strategy"] == "FedEcho" and summary["rounds"] == 2 and summary["arrivals"] == 16
    assert summary["server-versions"] == 5 and summary["aggregations"] == 5 and summary["logit-clients"] >= 3
    assert summary["best-accuracy"] > 0.5
    assert "unidentified-nodes" not in summary  # every node answered the identity query
