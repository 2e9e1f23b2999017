"""Flower's advanced-pytorch app made asynchronous (examples/advanced-pytorch), run in-process on a small
Fashion-MNIST-shaped set: schedule, best-model files, results per round and the personal heads all work
under FedBuff's asynchronous engine."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from asyncfl.simulation.inprocess import InProcessGrid
from tests.data.test_data import _write_idx

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "advanced-pytorch"


def _write_learnable_fashion(folder: Path, train: int = 2000, test: int = 300) -> None:
    """Fashion-MNIST's files and shapes, each class a bright centred square of its own size on a noisy background
    (sizes survive the example's random crops and flips)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 30, (n, 28, 28))
        for i, label in enumerate(labels):
            low, high = 12 - int(label), 16 + int(label)  # side 4 + 2 x label
            images[i, low:high, low:high] = 250
        _write_idx(folder / f"{split}-images-idx3-ubyte.gz", images, 2051)
        _write_idx(folder / f"{split}-labels-idx1-ubyte.gz", labels, 2049)


class RecordingGrid(InProcessGrid):
    """Also notes each train request's ``(server-round, lr)``."""

    requests: list

    def push_messages(self, messages):
        messages = list(messages)
        self.requests = getattr(self, "requests", []) + [
            (int(m.content["config"]["server-round"]), float(m.content["config"]["lr"]))
            for m in messages if m.metadata.message_type == "train"]
        return super().push_messages(messages)


@pytest.fixture()
def example_modules():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from advancedexample import client_app, server_app

        yield client_app, server_app
    finally:
        sys.path.remove(str(EXAMPLE))


def test_the_advanced_example_runs_asynchronously_with_its_schedule_files_and_personal_heads(tmp_path,
                                                                                                 example_modules):
    client_app, server_app = example_modules
    data, out = tmp_path / "fmnist", tmp_path / "out"
    _write_learnable_fashion(data)
    import tomllib

    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    # the example's lr 0.1 (SGD momentum 0.9) suits Fashion-MNIST; this small synthetic set wants less
    config.update({"num-server-rounds": 6, "data-dir": str(data), "save-dir": str(out), "learning-rate": 0.02,
                   "fraction-train": 1.0})
    grid = RecordingGrid(client_app.app, 4, config)
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))

    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results] == list(range(0, 7))  # round 0: the initial model, scored on the server
    first, last = results[0]["evaluate_metrics_serverapp"], results[-1]["evaluate_metrics_serverapp"]
    assert last["accuracy"] > 0.3 and last["loss"] < 0.8 * first["loss"]  # learning (chance: 0.1)
    assert "train_loss" in results[-1]["train_metrics"] and "eval_acc" in results[-2]["evaluate_metrics_clientapp"]
    assert any(p.name.startswith("model_state_acc_") for p in out.iterdir()) and (out / "final_model.pt").exists()
    # the schedule: the configured lr until round 5's first job, halved from then on, as Flower's example
    assert {lr for r, lr in grid.requests if r < 5} == {0.02} and {lr for r, lr in grid.requests if r >= 5} == {0.01}
    # every node that trained keeps its own head between jobs
    heads = [ctx.state.array_records.get(client_app.PERSONAL_HEAD) for ctx in grid._contexts.values()]
    assert all(h is not None and set(h) == {"weight", "bias"} for h in heads)


def test_without_its_data_the_advanced_example_fails_first_and_writes_nothing(tmp_path, monkeypatch, example_modules):
    client_app, server_app = example_modules
    import tomllib

    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    config.update({"data-dir": str(tmp_path / "no-data")})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no Fashion-MNIST t10k files in .*apt-get install dataset-fashion-mnist"):
        server_app.main(RecordingGrid(client_app.app, 2, config),
                        Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    assert list(tmp_path.iterdir()) == []  # no empty dated outputs/ folder


@pytest.mark.parametrize("example", ["quickstart-pytorch", "advanced-pytorch", "fedecho-custom-model"])
def test_flwr_run_leaves_the_examples_pyproject_as_it_is(example):
    # Flower >= 1.42 keeps federations in $FLWR_HOME/config.toml and, on the first flwr run, migrates a
    # [tool.flwr.federations] table away by rewriting the app's tracked pyproject.toml
    import tomllib

    project = tomllib.loads((EXAMPLE.parent / example / "pyproject.toml").read_text())
    assert "federations" not in project["tool"]["flwr"]
