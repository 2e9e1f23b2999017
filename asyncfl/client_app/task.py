"""What a node works on: its data partition and a model, built from run-config."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from torch import nn

from asyncfl.config import DataConfig
from asyncfl.data import load_dataset, partition_indices
from asyncfl.data.holdout import client_pool
from asyncfl.models import build_model


@dataclass(frozen=True)
class NodeData:
    """A node's training partition and its slice of the test split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@lru_cache(maxsize=64)
def node_data(data: DataConfig, partition_id: int, num_partitions: int, seed: int) -> NodeData:
    """The node's partition of the training set (by ``data.partitioning``) and an
    IID slice of the test split, for ``evaluate`` requests.

    Rows the server holds out (``server-holdout``) are never partitioned.
    """
    splits = load_dataset(data.dataset, data.data_dir, data.test_fraction, seed)
    pool = client_pool(splits.y_train, data.server_holdout, seed)
    rows = pool[partition_indices(
        splits.y_train[pool], partition_id, num_partitions, data.partitioning, data.dirichlet_alpha,
        data.shards_per_client, seed,
    )]
    test_rows = np.array_split(np.random.default_rng(seed).permutation(len(splits.y_test)), num_partitions)[partition_id]
    return NodeData(splits.x_train[rows], splits.y_train[rows], splits.x_test[test_rows], splits.y_test[test_rows])


def node_model(data: DataConfig, seed: int) -> nn.Module:
    """A fresh model of the configured architecture for this dataset."""
    splits = load_dataset(data.dataset, data.data_dir, data.test_fraction, seed)
    return build_model(data.model, splits.input_shape, splits.num_classes, data.batchnorm, seed=seed)
