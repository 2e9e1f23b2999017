"""pytorchexample: the model, the data and the train/test loops (plain PyTorch, no Flower, no asyncfl)."""

from functools import lru_cache

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """The quickstart's small CNN for 3x32x32 images (two conv layers, three dense layers)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@lru_cache(maxsize=1)
def _digits_as_cifar() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's 8x8 digits blown up to 3x32x32 and scaled to [-1, 1], CIFAR's shape and normalisation."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images / 16.0, np.ones((4, 4)))  # 8x8 -> 32x32, nearest neighbour
    images = np.repeat(images[:, None], 3, axis=1).astype(np.float32) * 2.0 - 1.0
    return images, digits.target.astype(np.int64)


def _partition(dataset: str, partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """This node's IID share of the training data, through flwr-datasets' partitioner."""
    from flwr_datasets.partitioner import IidPartitioner

    if dataset == "cifar10":  # the original quickstart: downloads CIFAR-10
        from flwr_datasets import FederatedDataset

        fds = FederatedDataset(dataset="uoft-cs/cifar10", partitioners={"train": IidPartitioner(num_partitions)})
        part = fds.load_partition(partition_id).with_format("numpy")
        images = part["img"].astype(np.float32).transpose(0, 3, 1, 2) / 127.5 - 1.0
        return images, part["label"].astype(np.int64)
    from datasets import Dataset

    images, labels = _digits_as_cifar()
    train_rows = np.arange(len(labels))[: int(0.8 * len(labels))]  # the last 20 % are the server's test set
    partitioner = IidPartitioner(num_partitions)
    partitioner.dataset = Dataset.from_dict({"row": train_rows})
    rows = np.asarray(partitioner.load_partition(partition_id)["row"])
    return images[rows], labels[rows]


def load_data(partition_id: int, num_partitions: int, batch_size: int, dataset: str = "digits"):
    """Train and validation loaders of one partition (80 / 20, seeded)."""
    x, y = _partition(dataset, partition_id, num_partitions)
    order = np.random.default_rng(42).permutation(len(y))
    cut = int(0.8 * len(y))
    train = TensorDataset(torch.from_numpy(x[order[:cut]]), torch.from_numpy(y[order[:cut]]))
    test = TensorDataset(torch.from_numpy(x[order[cut:]]), torch.from_numpy(y[order[cut:]]))
    generator = torch.Generator().manual_seed(partition_id)
    return DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator), DataLoader(test, batch_size=batch_size)


def load_centralized_dataset(dataset: str = "digits") -> DataLoader:
    """The server's test set (digits: the 20 % no client holds; cifar10: its test split)."""
    if dataset == "cifar10":
        from flwr_datasets import FederatedDataset

        test = FederatedDataset(dataset="uoft-cs/cifar10", partitioners={}).load_split("test").with_format("numpy")
        x, y = test["img"].astype(np.float32).transpose(0, 3, 1, 2) / 127.5 - 1.0, test["label"].astype(np.int64)
    else:
        images, labels = _digits_as_cifar()
        cut = int(0.8 * len(labels))
        x, y = images[cut:], labels[cut:]
    return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=128)


def train(net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device) -> float:
    """SGD with momentum for ``epochs``; returns the mean training loss."""
    net.to(device).train()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    total, batches = 0.0, 0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(images.to(device)), labels.to(device))
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
