"""Readers for the standard on-disk formats of the torchvision datasets.

We read the files directly instead of through ``torchvision.datasets`` because
torchvision insists on MD5 checksums of the full official archives, which rules
out testing on small files written in the same format. Formats:

* CIFAR-10/100 "python version": pickled dicts with ``b"data"`` (N x 3072 uint8,
  channel-major) and ``b"labels"`` / ``b"fine_labels"``.
* MNIST / Fashion-MNIST: IDX files (optionally gzipped), magic 2051 for images
  and 2049 for labels.
* SVHN "cropped digits": MATLAB files ``train_32x32.mat`` / ``test_32x32.mat`` with
  ``X`` (32 x 32 x 3 x N) and ``y`` (N x 1, digit 0 stored as 10).
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np


class DatasetNotFoundError(FileNotFoundError):
    """Raised when a dataset's files are missing, naming where we looked."""


def _require(paths: list[Path], dataset: str, how_to_get: str) -> None:
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise DatasetNotFoundError(
            f"dataset {dataset!r}: missing file(s) {', '.join(missing)}. {how_to_get}"
        )


def cifar_files(root: Path, num_classes: int) -> tuple[list[Path], list[Path], bytes]:
    """CIFAR-10/100's train and test batch files below ``root`` and their label key; raises
    :class:`DatasetNotFoundError` when one is missing."""
    if num_classes == 10:
        folder = root / "cifar-10-batches-py"
        train_files = [folder / f"data_batch_{i}" for i in range(1, 6)]
        test_files = [folder / "test_batch"]
        label_key = b"labels"
        name, url_name = "cifar10", "cifar-10-python.tar.gz"
    else:
        folder = root / "cifar-100-python"
        train_files = [folder / "train"]
        test_files = [folder / "test"]
        label_key = b"fine_labels"
        name, url_name = "cifar100", "cifar-100-python.tar.gz"
    _require(
        train_files + test_files,
        name,
        f"Download {url_name} from the CIFAR page and extract it into data-dir ({root}).",
    )
    return train_files, test_files, label_key


def read_cifar(root: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read CIFAR-10 or CIFAR-100 (python version) below ``root``.

    Returns ``x_train, y_train, x_test, y_test`` with images as N x 3 x 32 x 32 uint8.
    """
    train_files, test_files, label_key = cifar_files(root, num_classes)

    def load(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for file in files:
            with open(file, "rb") as handle:
                batch = pickle.load(handle, encoding="bytes")
            xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(batch[label_key], dtype=np.int64))
        return np.concatenate(xs), np.concatenate(ys)

    x_train, y_train = load(train_files)
    x_test, y_test = load(test_files)
    return x_train, y_train, x_test, y_test


def _open_maybe_gz(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (images: magic 2051, labels: magic 2049)."""
    with _open_maybe_gz(path) as handle:
        magic, count = struct.unpack(">II", handle.read(8))
        if magic == 2051:
            rows, cols = struct.unpack(">II", handle.read(8))
            data = np.frombuffer(handle.read(), dtype=np.uint8)
            return data.reshape(count, 1, rows, cols)
        if magic == 2049:
            return np.frombuffer(handle.read(), dtype=np.uint8).astype(np.int64)
    raise ValueError(f"{path}: not an IDX image (2051) or label (2049) file, magic number {magic}")


def _find_idx(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    return folder / stem


IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
#: Where Debian's data packages put the IDX files (``apt-get install dataset-fashion-mnist``).
DEBIAN_FOLDERS = {"FashionMNIST": (Path("/usr/share/datasets/fashion-mnist"), "dataset-fashion-mnist")}


def mnist_like_files(root: Path | None, folder_name: str) -> list[Path]:
    """The four IDX files of MNIST or Fashion-MNIST: in the first of ``root/<folder_name>/raw`` (torchvision's
    layout), ``root`` itself (the files side by side) and, for Fashion-MNIST, Debian's
    ``/usr/share/datasets/fashion-mnist`` that holds all four (``root`` None: Debian's only).

    Raises
    ------
    DatasetNotFoundError
        Naming every folder looked in, and the Debian package where there is one.
    """
    debian = DEBIAN_FOLDERS.get(folder_name)
    folders = [root / folder_name / "raw", root] if root is not None else []
    folders += [debian[0]] if debian is not None else []
    for folder in folders:
        paths = [_find_idx(folder, stem) for stem in IDX_STEMS]
        if all(p.exists() for p in paths):
            return paths
    install = f" On Debian or Ubuntu: apt-get install {debian[1]} (puts them in {debian[0]})." if debian else ""
    raise DatasetNotFoundError(
        f"dataset {folder_name.lower()!r}: the four IDX files ({', '.join(IDX_STEMS)}, optionally .gz) are in none "
        f"of {', '.join(str(f) for f in folders)}.{install} Or set data-dir to a folder holding them "
        f"(as they are, or in {folder_name}/raw/).")


def read_mnist_like(root: Path | None, folder_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read MNIST or Fashion-MNIST IDX files (see :func:`mnist_like_files` for where)."""
    x_train, y_train, x_test, y_test = (read_idx(p) for p in mnist_like_files(root, folder_name))
    return x_train, y_train, x_test, y_test


def svhn_files(root: Path) -> list[Path]:
    """SVHN's two MATLAB files below ``root``; raises :class:`DatasetNotFoundError` when one is missing."""
    paths = [root / "train_32x32.mat", root / "test_32x32.mat"]
    _require(paths, "svhn", f"Download train_32x32.mat and test_32x32.mat from the SVHN page into {root}.")
    return paths


def read_svhn(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read SVHN cropped digits from ``root/train_32x32.mat`` and ``root/test_32x32.mat``."""
    from scipy.io import loadmat

    paths = svhn_files(root)

    def load(path: Path) -> tuple[np.ndarray, np.ndarray]:
        mat = loadmat(str(path))
        x = np.transpose(mat["X"], (3, 2, 0, 1)).astype(np.uint8)
        y = mat["y"].astype(np.int64).reshape(-1)
        y[y == 10] = 0
        return x, y

    x_train, y_train = load(paths[0])
    x_test, y_test = load(paths[1])
    return x_train, y_train, x_test, y_test
