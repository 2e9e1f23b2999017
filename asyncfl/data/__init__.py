"""Datasets, on-disk readers and partitioning."""

from asyncfl.data.datasets import DATASETS, DatasetSplits, load_dataset
from asyncfl.data.partition import PARTITIONINGS, partition_indices

__all__ = ["DATASETS", "PARTITIONINGS", "DatasetSplits", "load_dataset", "partition_indices"]
