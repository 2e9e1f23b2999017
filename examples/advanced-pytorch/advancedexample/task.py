"""advancedexample: the model, the data and the train/test loops (plain PyTorch and flwr-datasets, no asyncfl).

Fashion-MNIST is read offline from its IDX files and split across nodes by flwr-datasets'
``DirichletPartitioner`` over the labels (alpha 1.0, seed 42, as Flower's example); each node keeps
80 % of its partition to train on (random 28x28 crops of the 4-pixel-padded image, random
horizontal flips) and 20 % to evaluate on. The server evaluates on Fashion-MNIST's test split.
"""

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's pixel mean and sd
HEAD = "fc2"  # the classification head each client keeps for itself


class Net(nn.Module):
    """Two 5x5 convolutions (16, 32 channels) with max-pooling, a hidden layer of 128, a 10-way head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path) if path.suffix == ".gz" else open(path, "rb") as handle:
        data = handle.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


@lru_cache(maxsize=2)
def fashion_mnist(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images N x 1 x 28 x 28 normalised, labels)`` of the ``train`` or ``t10k`` split."""
    folder = Path(data_dir) if data_dir else DEFAULT_DIR
    found = {p.name.split(".")[0]: p for p in folder.glob(f"{split}-*-idx*")}
    if len(found) < 2:
        raise FileNotFoundError(f"no Fashion-MNIST {split} files in {folder} (Debian: apt-get install "
                                "dataset-fashion-mnist; or set data-dir)")
    images = _read_idx(found[f"{split}-images-idx3-ubyte"]).astype(np.float32) / 255.0
    labels = _read_idx(found[f"{split}-labels-idx1-ubyte"]).astype(np.int64)
    return ((images - MEAN) / STD)[:, None], labels


def load_data(partition_id: int, num_partitions: int, batch_size: int, alpha: float = 1.0, data_dir: str = ""):
    """This node's train and validation loaders: its Dirichlet share of the training split, 80 / 20."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    images, labels = fashion_mnist(data_dir, "train")
    partitioner = DirichletPartitioner(num_partitions=num_partitions, partition_by="label", alpha=alpha, seed=42)
    partitioner.dataset = Dataset.from_dict({"row": np.arange(len(labels)), "label": labels})
    rows = np.asarray(partitioner.load_partition(partition_id)["row"])
    rows = rows[np.random.default_rng(42).permutation(len(rows))]
    cut = int(0.8 * len(rows))
    train = TensorDataset(torch.from_numpy(images[rows[:cut]]), torch.from_numpy(labels[rows[:cut]]))
    valid = TensorDataset(torch.from_numpy(images[rows[cut:]]), torch.from_numpy(labels[rows[cut:]]))
    generator = torch.Generator().manual_seed(partition_id)
    return (DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator),
            DataLoader(valid, batch_size=256))


def load_centralized_dataset(data_dir: str = "") -> DataLoader:
    """Fashion-MNIST's test split, for the server's evaluation."""
    images, labels = fashion_mnist(data_dir, "t10k")
    return DataLoader(TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)), batch_size=512)


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random 28x28 crop of each image padded by 4 pixels, and a horizontal flip with probability 1/2."""
    padded = F.pad(images, (4, 4, 4, 4), value=float(-MEAN / STD))
    offsets = torch.randint(0, 9, (len(images), 2), generator=generator).tolist()
    cropped = torch.stack([padded[i, :, y:y + 28, x:x + 28] for i, (x, y) in enumerate(offsets)])
    flip = torch.rand(len(images), generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], cropped.flip(-1), cropped)


def train(net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device, seed: int = 0) -> float:
    """SGD with momentum 0.9 on augmented batches for ``epochs``; returns the mean training loss."""
    net.to(device).train()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    total, batches = 0.0, 0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(augment(images, generator).to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def test(net: nn.Module, testloader: DataLoader, device) -> tuple[float, float]:
    """Mean loss and accuracy on ``testloader``."""
    net.to(device).eval()
    loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            loss += F.cross_entropy(outputs, labels.to(device), reduction="sum").item()
            correct += (outputs.argmax(1) == labels.to(device)).sum().item()
            seen += len(labels)
    return loss / max(seen, 1), correct / max(seen, 1)
