"""What a node works on: its data partition and a model, built from run-config.

A deployed SuperNode starts a fresh ClientApp process for every message, so
loading the dataset and partitioning it (seconds of imports and work) would be
paid per job. The node's own arrays are therefore cached on disk, keyed by
everything they depend on, in ``$ASYNCFL_CACHE_DIR`` (default
``~/.cache/asyncfl``; ``off`` disables it); later processes load them in
milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from torch import nn

from asyncfl.config import DataConfig
from asyncfl.models import build_model

_CACHE_FORMAT = 1  # bump when partitioning or preprocessing changes


@dataclass(frozen=True)
class NodeData:
    """A node's training partition, its slice of the test split, and the dataset's shape."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    input_shape: tuple[int, int, int]
    num_classes: int


def _cache_file(data: DataConfig, partition_id: int, num_partitions: int, seed: int) -> Path | None:
    root = os.environ.get("ASYNCFL_CACHE_DIR", str(Path.home() / ".cache" / "asyncfl"))
    if not root or root == "off":
        return None
    key = json.dumps([_CACHE_FORMAT, asdict(data), partition_id, num_partitions, seed], sort_keys=True)
    return Path(root) / f"node-{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"


def _compute(data: DataConfig, partition_id: int, num_partitions: int, seed: int) -> NodeData:
    from asyncfl.data import load_dataset, partition_indices
    from asyncfl.data.holdout import client_pool

    splits = load_dataset(data.dataset, data.data_dir, data.test_fraction, seed)
    pool = client_pool(splits.y_train, data.server_holdout, seed)
    rows = pool[partition_indices(
        splits.y_train[pool], partition_id, num_partitions, data.partitioning, data.dirichlet_alpha,
        data.shards_per_client, seed, data.samples_per_client, data.max_samples_per_client,
    )]
    test_rows = np.random.default_rng(seed).permutation(len(splits.y_test))[split_slice(len(splits.y_test),
                                                                                          num_partitions, partition_id)]
    return NodeData(splits.x_train[rows], splits.y_train[rows], splits.x_test[test_rows], splits.y_test[test_rows],
                    splits.input_shape, splits.num_classes)


def split_slice(length: int, parts: int, index: int) -> slice:
    """Part ``index`` of ``np.array_split(range(length), parts)``, without making the other parts (O(1) in
    ``parts``: with 10,000 clients every node used to build all 10,000 pieces to take its own)."""
    size, extra = divmod(length, parts)
    start = index * size + min(index, extra)
    return slice(start, start + size + (1 if index < extra else 0))


@lru_cache(maxsize=64)
def node_data(data: DataConfig, partition_id: int, num_partitions: int, seed: int) -> NodeData:
    """The node's partition of the training set (by ``data.partitioning``) and an
    IID slice of the test split, for ``evaluate`` requests.

    Rows the server holds out (``server-holdout``) are never partitioned.
    """
    # sampled rows cost less to draw than a cache file to read (and 10,000 clients would mean 10,000 files)
    path = (None if data.partitioning in ("sampled", "dirichlet-sampled")
            else _cache_file(data, partition_id, num_partitions, seed))
    if path is not None and path.exists():
        try:
            with np.load(path) as stored:
                return NodeData(stored["x_train"], stored["y_train"], stored["x_test"], stored["y_test"],
                                tuple(int(v) for v in stored["input_shape"]), int(stored["num_classes"]))
        except (OSError, KeyError, ValueError):
            pass  # unreadable (e.g. a concurrent writer died): recompute and rewrite
    node = _compute(data, partition_id, num_partitions, seed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(partial, x_train=node.x_train, y_train=node.y_train, x_test=node.x_test, y_test=node.y_test,
                 input_shape=np.array(node.input_shape), num_classes=np.array(node.num_classes))
        os.replace(partial, path)  # atomic: concurrent readers see the old state or the whole file
    return node


def node_model(data: DataConfig, node: NodeData, seed: int) -> nn.Module:
    """A fresh model of the configured architecture for this node's dataset."""
    return build_model(data.model, node.input_shape, node.num_classes, data.batchnorm, seed=seed,
                       track_statistics=data.track_statistics)
