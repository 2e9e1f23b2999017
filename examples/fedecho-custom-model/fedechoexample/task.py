"""fedechoexample: the user's own model and data (plain PyTorch and flwr-datasets; nothing from asyncfl).

sklearn's 1,797 handwritten 8x8 digits are split once, seeded: 70 % are partitioned across
the clients (Dirichlet over labels), 15 % are the server's *unlabeled* distillation inputs
(FedEcho's ``U``; their labels are never used) and 15 % the server's test set.
"""

from functools import lru_cache

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class DigitNet(nn.Module):
    """A small MLP with BatchNorm (running statistics and an int64 batch counter travel with the weights)."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(64, 64)
        self.norm = nn.BatchNorm1d(64)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        return self.out(F.relu(self.norm(self.hidden(x.flatten(1)))))


@lru_cache(maxsize=1)
def _splits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    a, b = int(0.7 * len(y)), int(0.85 * len(y))
    return {"x_clients": x[order[:a]], "y_clients": y[order[:a]], "x_unlabeled": x[order[a:b]],
            "x_test": x[order[b:]], "y_test": y[order[b:]]}


def client_data(partition_id: int, num_partitions: int, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """This client's Dirichlet(alpha) share of the client pool."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    splits = _splits()
    partitioner = DirichletPartitioner(num_partitions=num_partitions, partition_by="label", alpha=alpha, seed=42,
                                       min_partition_size=0)
    partitioner.dataset = Dataset.from_dict({"row": np.arange(len(splits["y_clients"])),
                                             "label": splits["y_clients"]})
    rows = np.asarray(partitioner.load_partition(partition_id)["row"], dtype=np.int64)
    return torch.from_numpy(splits["x_clients"][rows]), torch.from_numpy(splits["y_clients"][rows])


def unlabeled_inputs() -> torch.Tensor:
    """The server's unlabeled inputs (FedEcho distils on them)."""
    return torch.from_numpy(_splits()["x_unlabeled"])


def test_set() -> tuple[torch.Tensor, torch.Tensor]:
    splits = _splits()
    return torch.from_numpy(splits["x_test"]), torch.from_numpy(splits["y_test"])


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int) -> float:
    """Adam over shuffled batches of 16; returns the mean loss."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        for rows in torch.randperm(len(y), generator=generator).split(16):
            if len(rows) < 2:  # BatchNorm needs two samples
                continue
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[rows]), y[rows])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return float(np.mean(losses)) if losses else 0.0


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    logits = model(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()
