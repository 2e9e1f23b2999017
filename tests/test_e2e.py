"""Real `flwr run` end-to-end runs through a private simulation SuperLink (slow: a few only)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asyncfl.client_app.training import evaluate_per_class
from asyncfl.data import load_dataset
from asyncfl.deploy.app_copy import write_app_copy
from asyncfl.models import build_model

ROOT = Path(__file__).resolve().parents[1]
SMALL = "dataset='digits' model='mlp' local-steps=10 lr=0.01 concurrency=3 evaluate-every-time=1.0 progress=false"

pytestmark = pytest.mark.e2e


def asyncfl_run(app: Path, overrides: str, supernodes: int = 6) -> str:
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(app), "--num-supernodes", str(supernodes),
               "-c", overrides]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.terminate()  # the wrapper stops its SuperLink and the simulation on SIGTERM
        output, _ = process.communicate(timeout=60)
        pytest.fail("flwr run did not finish in 300 s:\n" + output[-3000:])
    assert process.returncode == 0, output[-3000:]
    return output


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def asyncfl_run_killed(app: Path, overrides: str, folder: Path, version: int, supernodes: int = 6) -> None:
    """Start a run that checkpoints every version and SIGKILL its ServerApp process (Flower's simulation
    process, which runs the ServerApp) once the checkpoint of ``version`` is on disk; then stop the rest."""
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(app), "--num-supernodes", str(supernodes),
               "-c", f"{overrides} checkpoint-every=1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    checkpoints = folder / "checkpoints"
    deadline = time.monotonic() + 240
    while not list(checkpoints.glob(f"checkpoint-v{version:06d}-*.npz")):
        assert process.poll() is None, "the run ended before its checkpoint of version %d" % version
        assert time.monotonic() < deadline, "no checkpoint of version %d within 240 s" % version
        time.sleep(0.02)
    simulation = [pid for pid in _descendants(process.pid)
                  if b"flwr-simulation" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert simulation, "no flwr-simulation process under the run"
    groups = {os.getpgid(pid) for pid in simulation}
    for pid in simulation:
        os.kill(pid, signal.SIGKILL)
    time.sleep(1.0)
    process.terminate()  # the wrapper stops its SuperLink on SIGTERM
    process.communicate(timeout=60)
    for group in groups:  # Ray helpers the killed process left behind (all started by this test)
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def asyncfl_run_resumed(folder: Path) -> str:
    """``asyncfl run --resume folder`` (the run's own run-config and node count); returns its output."""
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(ROOT), "--resume", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout + result.stderr


def interop_app(tmp_path: Path, serverapp: str, clientapp: str) -> Path:
    """A copy of our Flower app whose components are swapped for the interop modules."""
    modules = [ROOT / "tests" / "interop" / name for name in ("stock_client.py", "flower_fedavg_server.py")]
    return write_app_copy(tmp_path / "app", ROOT, modules, serverapp=serverapp, clientapp=clientapp)


def _check_run_folder(run: Path, seed: int) -> dict:
    """A finished run's folder: its files, summary keys, ordered rows, and the final and best models, each scoring
    the summary's accuracy on the test split of ``seed``; returns the summary."""
    assert {p.name for p in run.iterdir()} >= {"config.json", "metrics.csv", "summary.json", "accuracy.png",
                                               "final_model.pt", "best_model.pt"}
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary) >= {"final-accuracy", "time-to-target", "staleness-histogram", "staleness-mean",
                            "staleness-max", "rejected-updates", "server-ms-per-arrival", "wall-seconds"}
    splits = load_dataset("digits", test_fraction=0.2, seed=seed)
    model = build_model("mlp", splits.input_shape, splits.num_classes)
    for name, key in (("best_model.pt", "best-accuracy"), ("final_model.pt", "final-accuracy")):
        model.load_state_dict(torch.load(run / name))
        _, accuracy, _ = evaluate_per_class(model, splits.x_test, splits.y_test, splits.num_classes)
        assert accuracy == pytest.approx(summary[key], abs=1e-6), name
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [float(r["time"]) for r in rows] == sorted(float(r["time"]) for r in rows)
    return summary


def test_stock_flower_clientapp_works_with_our_engine_and_its_jobs_wait_in_no_queue(tmp_path):
    # Flower's own ClientApp (no train-seconds, no identity answer) under FedBuff on the wall clock, as a Flower
    # app's start() runs it: 4 jobs wanted on 4 nodes, Flower's simulation runs one ClientApp per CPU
    app = interop_app(tmp_path, "asyncfl.server_app.app:app", "stock_client:app")
    small = SMALL.replace("concurrency=3", "concurrency=4")
    asyncfl_run(app, f"{small} clock='wall' max-arrivals=12 output-dir='{tmp_path}' run-name='stock'", 4)
    summary = json.loads((tmp_path / "stock" / "summary.json").read_text())
    assert summary["arrivals"] == 12 and summary["rejected-updates"] == 0
    assert summary["server-versions"] == 12 // 2  # FedBuff's automatic buffer: 4 jobs in flight -> B = 2
    assert summary["best-accuracy"] > 0.2  # 12 updates of 10 steps (chance 0.1; 0.29-0.30 in three runs)
    # cap-in-flight with nothing reported: Flower's ClientApp actors counted (as many as Ray has CPUs here,
    # --cpus-per-client 1), one job more than them in flight, so none ages in Flower's queue
    actors = os.cpu_count() or 1
    if actors + 1 < 4:
        assert summary["in-flight-cap-min"] == actors + 1, summary


def test_our_clientapp_works_under_flowers_builtin_fedavg(tmp_path):
    app = interop_app(tmp_path, "flower_fedavg_server:app", "asyncfl.client_app.app:app")
    asyncfl_run(app, f"{SMALL} output-dir='{tmp_path}' run-name='flower'", 4)
    result = json.loads((tmp_path / "flower" / "flower_fedavg.json").read_text())
    assert len(result["train"]) == 2
    last_eval = result["evaluate"][max(result["evaluate"], key=int)]
    assert last_eval["eval-acc"] > 0.3


def test_gradient_inversion_compensation_in_the_intertwined_scenario(tmp_path):
    # 10 clients, the 2 biggest holders of class 5 are 2 rounds late; every stale update is inverted.
    overrides = ("dataset='digits' model='mlp' optimizer='sgd' lr=0.05 local-epochs=1 local-steps=0 batch-size=32 "
                 "concurrency=6 round-deadline=1.0 delay-model='intertwined' intertwined.clients=2 "
                 "intertwined.staleness=2 strategy='gi-compensation' gi.inversion-iterations=10 gi.warm-iterations=5 "
                 "gi.uniqueness=false max-arrivals=0 max-time=7.0 evaluate-every-time=1.0 progress=false "
                 f"output-dir='{tmp_path}' run-name='gi'")
    asyncfl_run(ROOT, overrides, supernodes=10)
    run = tmp_path / "gi"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == "gi-compensation" and summary["rounds"] == 7
    assert len(summary["delay-categories"]["delayed"]) == 2
    assert summary["staleness-max"] == 2 and summary["stale-arrivals"] >= 1
    assert summary["gi-inversions"] == summary["stale-arrivals"]  # uniqueness off: every stale update
    assert summary["affected-class"] == 5 and 0.0 <= summary["best-affected-class-accuracy"] <= 1.0
    assert len(summary["final-class-accuracy"]) == 10
    header = next(csv.reader(open(run / "metrics.csv")))
    assert header[-10:] == [f"acc_class_{k}" for k in range(10)]


def test_fedrevive_synthesises_and_distils_in_a_real_run_and_resumes_after_a_kill(tmp_path):
    # Tiny budget: synthesis from update 2 every 2 updates, KD from update 4, 2 KD steps, 4 teachers.
    overrides = (f"{SMALL} strategy='fedrevive' seed=3 max-arrivals=10 "
                 "fedrevive.synthesis-start=2 fedrevive.kd-start=4 "
                 "fedrevive.synthesis-every=2 fedrevive.kd-steps=2 fedrevive.teacher-buffer-size=4 fedrevive.synthesis-batch-size=16 "
                 "fedrevive.beta='constant' fedrevive.beta-constant=0.5 "
                 f"output-dir='{tmp_path}'")
    asyncfl_run(ROOT, f"{overrides} run-name='revive'")
    # killed (SIGKILL of the ServerApp process) after version 5, synthesis, pool and KD already under way, and
    # resumed: the same seed gives byte-identical metrics and final model whatever Ray did physically
    asyncfl_run_killed(ROOT, f"{overrides} run-name='killed'", tmp_path / "killed", version=5)
    assert not (tmp_path / "killed" / "final_model.pt").exists()
    asyncfl_run_resumed(tmp_path / "killed")
    # the run folder's own record, not the streamed log: `flwr run --stream` can end before the SuperLink has
    # handed over the ServerApp's last lines (a CI run lost "resumed at server version 5" that way)
    resumed = json.loads((tmp_path / "killed" / "summary.json").read_text())
    resumed_version = int(Path(resumed["resumed-from"]).name.split("-")[1][1:])  # checkpoint-v<version>-a<arrivals>
    assert 5 <= resumed_version < resumed["server-versions"]
    for name in ("metrics.csv", "final_model.pt", "best_model.pt"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "revive" / name).read_bytes()
    assert resumed["kd-updates"] == 6 and resumed["checkpoint-mb"] > 0
    # the uninterrupted run's folder is what every run writes (files, models that score the summary's figures)
    summary = _check_run_folder(tmp_path / "revive", seed=3)
    assert summary["strategy"] == "fedrevive" and summary["arrivals"] == 10
    assert summary["synthesis-rounds"] == 4  # updates 2, 4, 6, 8
    assert summary["kd-updates"] == 6  # updates 4..9, beta = 0.5 > 0
    assert summary["kd-pool-size"] == 4 * 16
    assert summary["distillation-ms-per-arrival"] > 0 and summary["best-accuracy"] > 0.2


def test_pushcen_gossip_through_the_relay(tmp_path):
    overrides = ("strategy='pushcen' dataset='digits' model='mlp' optimizer='sgd' lr=0.05 local-steps=5 "
                 "max-time=3.0 max-arrivals=0 gossip.eval-points=3 gossip.out-degree=3 pushcen.k=8 "
                 f"output-dir='{tmp_path}' run-name='gossip'")
    asyncfl_run(ROOT, overrides, supernodes=6)
    summary = json.loads((tmp_path / "gossip" / "summary.json").read_text())
    assert summary["strategy"] == "pushcen" and summary["peers"] == 6
    assert summary["pushes"] > 6 and summary["rejected-by-reason"] == {}
    # peers keep state between messages: their accuracy climbs above chance on the 10 digit classes
    assert summary["final-mean-accuracy"] > 0.3
    rows = list(csv.DictReader(open(tmp_path / "gossip" / "metrics.csv")))
    assert len(rows) == 3 and float(rows[-1]["time"]) == 3.0


def test_a_run_that_fails_on_the_superlink_exits_non_zero(tmp_path):
    # Valid config and the files are there, but the ServerApp cannot read them (damaged): `flwr run --stream`
    # itself exits 0 here.
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(b"not a pickle")
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--num-supernodes", "2", "-c",
               f"dataset='cifar10' data-dir='{tmp_path}' model='mlp' concurrency=2 max-arrivals=4 output-dir='{tmp_path}'"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "the run failed on the SuperLink" in result.stderr
