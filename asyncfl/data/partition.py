"""Seeded partitioning of a training set over clients, through flwr-datasets.

flwr-datasets' partitioners work offline on an in-memory ``datasets.Dataset``;
we give them only the labels and read back each partition's row indices.
``sampled`` is ours: each client draws its rows with replacement, seeded by its
partition id, so there can be more clients than examples (scale tests) and a
client's rows cost O(its own size) to compute, whatever the number of clients.
``dirichlet-sampled`` is ours too: each client draws its own class mix from a
Dirichlet and then a fixed number of rows with that mix, independently of the
other clients (clients may share rows), as FedRevive's reference code gives each
of its 1,000 CIFAR clients 350 examples, more than a disjoint split allows.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from asyncfl.errors import ConfigError

PARTITIONINGS = ("dirichlet", "iid", "shards", "sampled", "dirichlet-sampled")


def _label_dataset(labels: np.ndarray):
    from datasets import Dataset

    return Dataset.from_dict({"row": np.arange(len(labels)), "label": labels})


def _make_partitioner(kind: str, num_partitions: int, alpha: float, shards_per_client: int, seed: int):
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    if kind == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_partitions, partition_by="label", alpha=alpha, min_partition_size=0, seed=seed
        )
    if kind == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if kind == "shards":
        return ShardPartitioner(
            num_partitions=num_partitions, partition_by="label", num_shards_per_partition=shards_per_client, seed=seed
        )
    raise ConfigError(f"unknown partitioning {kind!r}; valid: {', '.join(PARTITIONINGS)}")


@lru_cache(maxsize=8)
def _rows_by_class(labels_key: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(classes, rows sorted by class, where each class starts in them)`` of an int64 label array."""
    labels = np.frombuffer(labels_key, dtype=np.int64)
    order = np.argsort(labels, kind="stable")
    classes, starts = np.unique(labels[order], return_index=True)
    return classes, order, np.append(starts, len(labels))


def dirichlet_sampled_rows(labels: np.ndarray, partition_id: int, alpha: float, samples: int, seed: int) -> np.ndarray:
    """``samples`` rows for client ``partition_id``: its class mix ``p ~ Dir(alpha)``, class counts
    ``~ Multinomial(samples, p)``, and within a class distinct rows (with replacement only when the class has
    fewer rows than its count); seeded by ``(seed, partition_id)``, independent of the other clients."""
    classes, order, bounds = _rows_by_class(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    rng = np.random.default_rng([seed, 31, partition_id])
    counts = rng.multinomial(samples, rng.dirichlet(np.full(len(classes), alpha)))
    rows = []
    for k, count in enumerate(counts):
        if count:
            pool = order[bounds[k]:bounds[k + 1]]
            rows.append(rng.choice(pool, size=count, replace=count > len(pool)))
    return np.sort(np.concatenate(rows))


@lru_cache(maxsize=8)
def _partitioner(labels_key: bytes, kind: str, num_partitions: int, alpha: float, shards: int, seed: int):
    labels = np.frombuffer(labels_key, dtype=np.int64)
    if num_partitions > len(labels):
        raise ConfigError(f"cannot split {len(labels)} examples into {num_partitions} partitions")
    partitioner = _make_partitioner(kind, num_partitions, alpha, shards, seed)
    dataset = _label_dataset(labels)
    if kind == "iid":  # IidPartitioner splits contiguously: shuffle first, with our seed
        dataset = dataset.shuffle(seed=seed)
    partitioner.dataset = dataset
    return partitioner


def partition_indices(
    labels: np.ndarray,
    partition_id: int,
    num_partitions: int,
    kind: str = "dirichlet",
    alpha: float = 0.5,
    shards_per_client: int = 2,
    seed: int = 42,
    samples_per_client: int = 32,
    max_samples: int = 0,
) -> np.ndarray:
    """Row indices of partition ``partition_id`` out of ``num_partitions``.

    The partitioner is built once per process and cached, so every client in a
    simulation worker shares one seeded partitioning. ``sampled``: ``samples_per_client``
    rows drawn uniformly with replacement from a generator seeded by ``(seed, partition_id)``.
    ``max_samples > 0`` keeps a seeded subsample of at most that many of the partition's rows
    (same label mix in expectation): few examples per client, as in the papers' CIFAR setups
    (e.g. 500 per peer with 100 peers), where learning alone is not enough; ``sampled`` ignores it.
    ``dirichlet-sampled``: ``samples_per_client`` rows with a class mix drawn from ``Dir(alpha)`` for this
    client alone (:func:`dirichlet_sampled_rows`); clients may share rows, so any number of clients fits.
    """
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition-id {partition_id} is outside [0, {num_partitions})")
    if kind == "sampled":
        return np.random.default_rng([seed, 19, partition_id]).integers(0, len(labels), size=samples_per_client)
    if kind == "dirichlet-sampled":
        return dirichlet_sampled_rows(labels, partition_id, alpha, samples_per_client, seed)
    partitioner = _partitioner(
        np.ascontiguousarray(labels, dtype=np.int64).tobytes(), kind, num_partitions, alpha, shards_per_client, seed
    )
    rows = np.asarray(partitioner.load_partition(partition_id)["row"], dtype=np.int64)
    if 0 < max_samples < len(rows):
        rows = np.sort(np.random.default_rng([seed, 29, partition_id]).choice(rows, size=max_samples, replace=False))
    return rows
