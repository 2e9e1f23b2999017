"""advancedexample: the ServerApp of Flower's advanced-pytorch example, made asynchronous.

What Flower's example does by subclassing ``FedAvg`` and rewriting ``start``, asyncfl does with
the strategy's own hooks and callbacks, so the asynchronous engine keeps running it:

* a learning-rate schedule: ``configure_train`` halves ``lr`` from round 5 (the same hook, the same
  record every round, as under Flower's ``FedAvg``);
* the best global model saved whenever the server-side accuracy improves (a ``Callback``);
* every round's train, federated-evaluate and server-evaluate metrics appended to
  ``results.json`` as they come (a ``Callback``).

Overriding ``start`` with Flower's own loop would run FedBuff's math synchronously, a round at a
time (docs/library.md, "Flower's hooks"): the callbacks are the asynchronous way to the same files.
"""

import json
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from asyncfl import Callback, FedBuff
from advancedexample.task import Net, load_centralized_dataset
from advancedexample.task import test as test_fn

app = ServerApp()


class ScheduledFedBuff(FedBuff):
    """FedBuff whose clients' learning rate halves from round 5 on."""

    def configure_train(self, server_round, arrays, config, grid):
        if server_round == 5:
            config["lr"] = config["lr"] * 0.5
            log(20, "Adjusted the learning rate to %f", config["lr"])
        return super().configure_train(server_round, arrays, config, grid)


class SaveBestModel(Callback):
    """Write the global model to ``folder`` whenever the server-side accuracy beats the best so far."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.best = 0.0

    def on_evaluation(self, info, metrics):
        if metrics["accuracy"] > self.best:
            self.best = metrics["accuracy"]
            path = self.folder / f"model_state_acc_{self.best:.4f}_round_{info.round}.pt"
            torch.save(info.arrays.to_torch_state_dict(), path)
            log(20, "New best global model (accuracy %.4f) saved to %s", self.best, path)


class ResultsPerRound(Callback):
    """``results.json``: one entry per round with its train, federated-evaluate and server-evaluate metrics."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "results.json"
        self.rounds: dict[int, dict] = {}

    def _put(self, server_round: int, key: str, metrics: dict) -> None:
        entry = self.rounds.setdefault(server_round, {"round": server_round, "train_metrics": {},
                                                      "evaluate_metrics_clientapp": {},
                                                      "evaluate_metrics_serverapp": {}})
        entry[key] = dict(metrics)
        self.path.write_text(json.dumps([self.rounds[r] for r in sorted(self.rounds)], indent=1))

    def on_train_metrics(self, server_round, metrics):
        self._put(server_round, "train_metrics", metrics)

    def on_federated_evaluation(self, server_round, metrics):
        self._put(server_round, "evaluate_metrics_clientapp", metrics)

    def on_evaluation(self, info, metrics):
        self._put(info.round, "evaluate_metrics_serverapp", {k: metrics[k] for k in ("accuracy", "loss")})


def _save_dir(configured: str) -> Path:
    folder = Path(configured) if configured else Path.cwd() / "outputs" / time.strftime("%Y-%m-%d/%H-%M-%S")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train asynchronously with the schedule, the best-model files and results.json."""
    cfg = context.run_config
    testloader = load_centralized_dataset(cfg["data-dir"])  # first: without the data, fail before writing anything
    folder = _save_dir(cfg["save-dir"])
    (folder / "run_config.json").write_text(json.dumps(dict(cfg), indent=1))

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(model, testloader, "cpu")
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    strategy = ScheduledFedBuff(fraction_train=cfg["fraction-train"], fraction_evaluate=cfg["fraction-evaluate"])
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()),
                            train_config=ConfigRecord({"lr": cfg["learning-rate"]}),
                            num_rounds=cfg["num-server-rounds"], evaluate_fn=global_evaluate,
                            callbacks=[SaveBestModel(folder), ResultsPerRound(folder)])
    torch.save(result.arrays.to_torch_state_dict(), folder / "final_model.pt")
