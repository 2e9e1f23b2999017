"""Unlabeled server-side distillation inputs (FedEcho's set U).

FedEcho paper, Sec. 5: U is a dataset without labels that the clients do not
hold: CIFAR-100 for CIFAR-10 clients (and the reverse), STL10, or diffusion
samples; 2000 samples by default. The choices here:

* ``digits``: scikit-learn's 8x8 handwritten digits (1,797, ships in the
  package), bilinearly resized to the clients' input size and standardised on
  their own statistics: a different-resolution, different-writer set for the
  28x28 grayscale datasets.
* ``mnist5k``: the embedded MNIST sample's training images (4,000 after its
  test split): another 28x28 grayscale dataset for Fashion-MNIST clients, as
  CIFAR-100 is for the paper's CIFAR-10 clients.
* ``cifar10`` / ``cifar100``: the other CIFAR's training images, read from
  ``data-dir`` (the paper's own pairing).
* ``holdout``: the rows of the training split the server keeps
  (``server-holdout``), labels dropped; the clients never see them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from asyncfl.data.datasets import CHANNELS, load_dataset
from asyncfl.data.holdout import holdout_rows
from asyncfl.errors import ConfigError

#: The built-in app's unlabeled sets: a cross-dataset set or the server's hold-out rows.
DISTILL_SETS = ("digits", "mnist5k", "cifar10", "cifar100", "holdout")


def distill_set_problem(kind: str, dataset: str, server_holdout: float) -> str | None:
    """Why ``kind`` cannot serve clients of ``dataset`` (``None`` when it can); checked before any data is read."""
    channels = CHANNELS[dataset]
    if kind == "holdout" and not server_holdout > 0.0:
        return ("'holdout' needs server-holdout > 0 (the fraction of the training split the server keeps and "
                "the clients never see)")
    if kind == "digits" and channels != 1:
        return f"'digits' is grayscale; dataset {dataset!r} has {channels} channels: use cifar10/cifar100 or holdout"
    if kind in ("cifar10", "cifar100") and (channels != 3 or kind == dataset):
        return f"{kind!r} needs another 3-channel 32x32 dataset (cifar10, cifar100, svhn), not {dataset!r}"
    if kind == "digits" and dataset == "digits":
        return "'digits' with dataset 'digits' would distil on the clients' own data: use holdout"
    if kind == "mnist5k" and dataset not in ("fashion-mnist",):
        return (f"'mnist5k' needs 28x28 grayscale clients of another dataset (fashion-mnist), not {dataset!r}: "
                "its images are the clients' own for mnist5k and mnist")
    return None


def resized_digits_with_labels(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits resized to ``height x width`` (N x 1 x H x W, own statistics) and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    resized = F.interpolate(images, size=(height, width), mode="bilinear", align_corners=False)
    resized = (resized - resized.mean()) / (resized.std() + 1e-6)
    return resized.numpy(), digits.target.astype(np.int64)


def _resized_digits(height: int, width: int) -> np.ndarray:
    return resized_digits_with_labels(height, width)[0]


def distillation_inputs(kind: str, x_train: np.ndarray, y_train: np.ndarray, size: int, seed: int, *,
                        data_dir: str = "", holdout_fraction: float = 0.0) -> np.ndarray:
    """Up to ``size`` unlabeled inputs shaped like the clients' inputs (``x_train``), a seeded subsample.

    Raises
    ------
    ConfigError
        When ``kind`` is unknown or does not fit the clients' input shape.
    """
    input_shape = tuple(x_train.shape[1:])
    channels, height, width = input_shape
    if kind == "digits":
        if channels != 1:
            raise ConfigError(f"distill-set 'digits' is grayscale; the clients' inputs have {channels} channels")
        pool = _resized_digits(height, width)
    elif kind == "mnist5k":
        pool = load_dataset("mnist5k").x_train
        if tuple(pool.shape[1:]) != input_shape:
            raise ConfigError(f"distill-set 'mnist5k' has inputs {pool.shape[1:]}, the clients {input_shape}")
    elif kind in ("cifar10", "cifar100"):
        pool = load_dataset(kind, data_dir).x_train
        if tuple(pool.shape[1:]) != input_shape:
            raise ConfigError(f"distill-set {kind!r} has inputs {pool.shape[1:]}, the clients {input_shape}")
    elif kind == "holdout":
        rows = holdout_rows(y_train, holdout_fraction, seed)
        if len(rows) == 0:
            raise ConfigError("distill-set 'holdout' needs server-holdout > 0")
        pool = x_train[rows]
    else:
        raise ConfigError(f"unknown distill-set {kind!r}; valid: {', '.join(DISTILL_SETS)}")
    return np.ascontiguousarray(pool[_subsample(len(pool), size, seed)], dtype=np.float32)


def _subsample(count: int, size: int, seed: int) -> np.ndarray | slice:
    """The seeded rows :func:`distillation_inputs` keeps of a pool of ``count`` (all when it is small enough)."""
    if count <= size:
        return slice(None)
    return np.sort(np.random.default_rng([seed, 8]).choice(count, size=size, replace=False))


def distillation_labels(kind: str, y_train: np.ndarray, size: int, seed: int, *,
                        holdout_fraction: float = 0.0) -> np.ndarray | None:
    """The task's labels of :func:`distillation_inputs`' rows where ``U`` is the task's own data (``holdout``);
    ``None`` for another dataset, whose labels are not the clients' classes."""
    if kind != "holdout":
        return None
    rows = holdout_rows(y_train, holdout_fraction, seed)
    return np.asarray(y_train[rows][_subsample(len(rows), size, seed)], dtype=np.int64)
