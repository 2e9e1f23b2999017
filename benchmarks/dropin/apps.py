"""The apps of the drop-in study: Flower's quickstart shape, and a BatchNorm CNN.

Both are ordinary Flower apps: a ``ClientApp`` with ``@app.train`` / ``@app.evaluate``
that trains a torch model on its partition and replies with ``"arrays"`` and
``"metrics"`` (``train_loss``, ``num-examples``), and a server-side test set for the
``evaluate_fn``. The ClientApp never sees which strategy runs the server.

* ``quickstart``: Flower's ``quickstart-pytorch`` (its CNN for 3x32x32 images, IID
  partitions through flwr-datasets, one local epoch of batch 32), with the offline
  stand-in for CIFAR-10 of ``examples/quickstart-pytorch`` (sklearn's 1,797 real digits
  resized to 3x32x32; Flower's FedAvg learns it to ~0.9).
* ``bn-mnist5k``: asyncfl's model-zoo CNN with BatchNorm after each convolution on
  mnist5k (5,000 real MNIST digits), IID over the nodes, one local epoch of batch 32.

The methods that distill on the server (FedEcho: unlabelled inputs; FedADT: a small
labelled set) get ``server_set``; FedRevive synthesises its own data and GI
compensation inverts updates, so neither gets any.

The local optimizer is the run-config's ``optimizer`` (``sgdm``: SGD with momentum 0.9, as
Flower's examples; ``adam``) at ``lr``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "quickstart-pytorch"))

from pytorchexample.task import Net, load_centralized_dataset, load_data  # noqa: E402

OPTIMIZERS = ("sgdm", "adam")


@dataclass(frozen=True)
class AppSpec:
    """One app: its model, its server-side test data and how its nodes load their partitions."""

    name: str
    model_fn: Callable[[], nn.Module]
    test_set: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loaders: Callable[[int, int, int], DataLoader]  # (partition id, partitions, batch size) -> train loader
    server_set: Callable[[int], tuple[np.ndarray, np.ndarray]]  # (partitions) -> what the KD methods' server holds
    input_shape: tuple[int, int, int]
    num_classes: int = 10


@lru_cache(maxsize=1)
def _quickstart_test() -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*load_centralized_dataset("digits"))
    return torch.cat(xs), torch.cat(ys)


@lru_cache(maxsize=None)
def _quickstart_train_split(partition_id: int, partitions: int) -> TensorDataset:
    return load_data(partition_id, partitions, 1, "digits")[0].dataset


def _quickstart_loader(partition_id: int, partitions: int, batch_size: int) -> DataLoader:
    """The example's train loader (its partition, its shuffling seeded by partition id); the partition is
    cached per process, the loader built anew as the example does for every message."""
    return DataLoader(_quickstart_train_split(partition_id, partitions), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(partition_id))


@lru_cache(maxsize=None)
def _quickstart_server_set(partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodes' validation slices pooled (20 % of each partition, 288 images): data no client trains on and
    the server's test set does not contain; FedEcho uses its inputs, FedADT a labelled share of it."""
    xs, ys = [], []
    for partition_id in range(partitions):
        data = load_data(partition_id, partitions, 1, "digits")[1].dataset
        xs.append(data.tensors[0].numpy())
        ys.append(data.tensors[1].numpy())
    return np.concatenate(xs), np.concatenate(ys)


@lru_cache(maxsize=1)
def _mnist5k():
    from asyncfl.data import load_dataset

    return load_dataset("mnist5k", seed=0)


def _bn_model() -> nn.Module:
    from asyncfl.models import build_model

    return build_model("cnn", (1, 28, 28), 10, batchnorm=True)


def _bn_test() -> tuple[torch.Tensor, torch.Tensor]:
    splits = _mnist5k()
    return torch.from_numpy(splits.x_test), torch.from_numpy(splits.y_test).long()


def _bn_server_set(partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """288 training images (every 14th of the IID order): mnist5k has no unused split, so these are also in
    some client's partition (never in the test set)."""
    splits = _mnist5k()
    rows = np.random.default_rng(0).permutation(len(splits.y_train))[::14][:288]
    return splits.x_train[rows], splits.y_train[rows].astype(np.int64)


def _bn_loader(partition_id: int, partitions: int, batch_size: int) -> DataLoader:
    splits = _mnist5k()
    rows = np.random.default_rng(0).permutation(len(splits.y_train))[partition_id::partitions]  # IID
    data = TensorDataset(torch.from_numpy(splits.x_train[rows]), torch.from_numpy(splits.y_train[rows]).long())
    return DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(partition_id))


APPS = {
    "quickstart": AppSpec("quickstart", Net, _quickstart_test, _quickstart_loader, _quickstart_server_set, (3, 32, 32)),
    "bn-mnist5k": AppSpec("bn-mnist5k", _bn_model, _bn_test, _bn_loader, _bn_server_set, (1, 28, 28)),
}


def local_train(model: nn.Module, loader: DataLoader, epochs: int, optimizer: str, lr: float) -> float:
    """``epochs`` over ``loader`` with SGD momentum 0.9 or Adam; the mean training loss."""
    model.train()
    opt = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if optimizer == "sgdm"
           else torch.optim.Adam(model.parameters(), lr=lr))
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def trusted_program(app: AppSpec, optimizer: str, lr: float, partitions: int) -> Callable[[int, ArrayRecord],
                                                                                         ArrayRecord]:
    """The server's ``trusted_train_fn`` (issue 56): one epoch of the clients' program (batch 32, ``optimizer``,
    ``lr``) on the server's set (``server_set``: data no client trains on), shuffled by the version's seed."""
    x, y = app.server_set(partitions)
    data = TensorDataset(torch.as_tensor(x), torch.as_tensor(y).long())

    def train(version: int, arrays: ArrayRecord) -> ArrayRecord:
        net = app.model_fn()
        net.load_state_dict(arrays.to_torch_state_dict())
        loader = DataLoader(data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(version))
        local_train(net, loader, 1, optimizer, lr)
        return ArrayRecord(net.state_dict())

    return train


def test_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(x[i:i + 256]) for i in range(0, len(x), 256)])
    return float(F.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on this node's partition (a stock Flower ClientApp: no asyncfl import)."""
    torch.manual_seed(int(msg.content["config"].get("job-seed", 0)))  # asyncfl's engine sends one per job
    cfg = context.run_config
    app = APPS[cfg["app"]]
    model = app.model_fn()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loader = app.loaders(context.node_config["partition-id"], context.node_config["num-partitions"],
                         cfg["batch-size"])
    loss = local_train(model, loader, cfg["local-epochs"], cfg["optimizer"], float(msg.content["config"]["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(loader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)
