"""Datasets (embedded and on-disk readers on small files we write) and partitioning."""

import gzip
import pickle
import struct

import numpy as np
import pytest

from asyncfl.data import load_dataset, partition_indices
from asyncfl.data.readers import DatasetNotFoundError


def test_mnist5k_ships_and_is_split_per_class():
    data = load_dataset("mnist5k", "", 0.2, 0)
    assert data.x_train.shape == (4000, 1, 28, 28) and data.x_test.shape == (1000, 1, 28, 28)
    assert data.num_classes == 10
    assert np.bincount(data.y_test).tolist() == [100] * 10
    assert abs(float(data.x_train.mean())) < 1e-3


def test_digits_ships():
    data = load_dataset("digits", "", 0.2, 0)
    assert data.input_shape == (1, 8, 8) and data.num_classes == 10


def test_unknown_dataset_names_valid_ones():
    with pytest.raises(ValueError, match="mnist5k, digits, mnist"):
        load_dataset("imagenet")


def test_missing_files_say_where_we_looked(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path)):
        load_dataset("cifar10", str(tmp_path))


def _write_idx(path, array, magic):
    with gzip.open(path, "wb") as handle:
        handle.write(struct.pack(">II", magic, len(array)))
        if magic == 2051:
            handle.write(struct.pack(">II", *array.shape[1:]))
        handle.write(array.astype(np.uint8).tobytes())


def test_mnist_idx_reader(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (20, 28, 28))
    labels = np.arange(20) % 10
    _write_idx(raw / "train-images-idx3-ubyte.gz", images, 2051)
    _write_idx(raw / "train-labels-idx1-ubyte.gz", labels, 2049)
    _write_idx(raw / "t10k-images-idx3-ubyte.gz", images[:10], 2051)
    _write_idx(raw / "t10k-labels-idx1-ubyte.gz", labels[:10], 2049)
    data = load_dataset("mnist", str(tmp_path))
    assert data.x_train.shape == (20, 1, 28, 28) and data.y_test.tolist() == list(range(10))


def test_cifar10_pickle_reader(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 9]}
        with open(folder / name, "wb") as handle:
            pickle.dump(batch, handle)
    data = load_dataset("cifar10", str(tmp_path))
    assert data.x_train.shape == (20, 3, 32, 32) and data.num_classes == 10


def test_svhn_mat_reader(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    for name, n in (("train_32x32.mat", 6), ("test_32x32.mat", 3)):
        savemat(tmp_path / name, {"X": rng.integers(0, 255, (32, 32, 3, n), dtype=np.uint8),
                                  "y": np.array([[10], [1], [2], [3], [4], [5]][:n])})
    data = load_dataset("svhn", str(tmp_path))
    assert data.x_train.shape == (6, 3, 32, 32)
    assert data.y_train[0] == 0  # SVHN stores digit 0 as label 10


@pytest.mark.parametrize("kind", ["dirichlet", "iid", "shards"])
def test_partitions_are_disjoint_seeded_and_cover(kind):
    labels = np.repeat(np.arange(10), 100)
    parts = [partition_indices(labels, i, 10, kind, 0.5, 2, seed=1) for i in range(10)]
    again = [partition_indices(labels, i, 10, kind, 0.5, 2, seed=1) for i in range(10)]
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist()))
    assert all((a == b).all() for a, b in zip(parts, again))
    if kind != "shards":
        assert len(flat) == 1000


def test_dirichlet_sampled_gives_every_client_its_own_skewed_mix_of_a_fixed_size_beyond_a_disjoint_split():
    labels = np.repeat(np.arange(10), 100)  # 1,000 rows; 50 clients x 350 rows needs 17,500
    parts = [partition_indices(labels, i, 50, "dirichlet-sampled", 0.1, seed=1, samples_per_client=350)
             for i in range(50)]
    again = partition_indices(labels, 7, 50, "dirichlet-sampled", 0.1, seed=1, samples_per_client=350)
    other_seed = partition_indices(labels, 7, 50, "dirichlet-sampled", 0.1, seed=2, samples_per_client=350)

    assert all(len(rows) == 350 for rows in parts)
    assert (parts[7] == again).all() and not np.array_equal(parts[7], other_seed)
    top_share = [np.bincount(labels[rows], minlength=10).max() / 350 for rows in parts]
    assert np.median(top_share) > 0.5  # Dir(0.1): most clients are dominated by one class
    mixes = {int(np.argmax(np.bincount(labels[rows], minlength=10))) for rows in parts}
    assert len(mixes) >= 5  # ... a different one for different clients
    # within a class a client's rows are distinct while the class has enough of them (100 here)
    for rows in parts:
        for k in range(10):
            mine = rows[labels[rows] == k]
            if 0 < len(mine) <= 100:
                assert len(set(mine.tolist())) == len(mine)


def test_dirichlet_is_label_skewed_and_iid_is_not():
    labels = np.repeat(np.arange(10), 100)
    skewed = partition_indices(labels, 0, 10, "dirichlet", 0.1, 2, seed=3)
    iid = partition_indices(labels, 0, 10, "iid", 0.1, 2, seed=3)
    assert np.bincount(labels[skewed], minlength=10).max() > 0.5 * len(skewed)
    assert np.bincount(labels[iid], minlength=10).max() < 0.3 * len(iid)


def test_partition_id_out_of_range():
    with pytest.raises(ValueError, match="outside"):
        partition_indices(np.zeros(10, np.int64), 5, 5)


def test_server_holdout_rows_never_reach_a_client():
    from dataclasses import replace

    from asyncfl.client_app.task import node_data
    from asyncfl.config import parse_run_config
    from asyncfl.data.holdout import holdout_rows
    from tests.test_config import defaults

    data = replace(parse_run_config(defaults()).data, server_holdout=0.05)
    splits = load_dataset("mnist5k", "", 0.2, 42)
    held = splits.x_train[holdout_rows(splits.y_train, 0.05, 42)]
    seen = np.concatenate([node_data(data, pid, 5, 42).x_train for pid in range(5)])
    assert len(seen) + len(held) == len(splits.y_train)
    held_keys = {row.tobytes() for row in held}
    assert not any(row.tobytes() in held_keys for row in seen)


def test_node_data_is_cached_on_disk_for_fresh_clientapp_processes(tmp_path, monkeypatch):
    from asyncfl.client_app import task
    from asyncfl.config import parse_run_config
    from tests.test_config import defaults

    monkeypatch.setenv("ASYNCFL_CACHE_DIR", str(tmp_path))
    data = parse_run_config(defaults()).data
    task.node_data.cache_clear()
    first = task.node_data(data, 1, 4, 42)
    assert len(list(tmp_path.glob("node-*.npz"))) == 1
    # A new process has an empty lru_cache and must not recompute.
    task.node_data.cache_clear()
    monkeypatch.setattr(task, "_compute", lambda *a: pytest.fail("recomputed despite the disk cache"))
    again = task.node_data(data, 1, 4, 42)
    assert np.array_equal(first.x_train, again.x_train) and np.array_equal(first.y_test, again.y_test)
    assert again.input_shape == (1, 28, 28) and again.num_classes == 10
    task.node_data.cache_clear()


def test_sampled_partitions_allow_more_clients_than_examples_and_are_seeded():
    labels = np.arange(50) % 10
    first = partition_indices(labels, 9_999, 10_000, "sampled", seed=3, samples_per_client=8)
    assert len(first) == 8 and first.min() >= 0 and first.max() < 50
    assert np.array_equal(first, partition_indices(labels, 9_999, 10_000, "sampled", seed=3, samples_per_client=8))
    assert not np.array_equal(first, partition_indices(labels, 9_998, 10_000, "sampled", seed=3, samples_per_client=8))
    with pytest.raises(ValueError, match="cannot split"):
        partition_indices(labels, 0, 51, "iid")


@pytest.mark.parametrize("length, parts", [(10, 3), (1000, 10_000), (7, 7), (0, 4)])
def test_split_slice_is_array_splits_piece(length, parts):
    from asyncfl.client_app.task import split_slice

    pieces = np.array_split(np.arange(length), parts)
    for index in {0, parts // 2, parts - 1}:
        assert np.array_equal(np.arange(length)[split_slice(length, parts, index)], pieces[index])


def _write_fashion(folder, n=20):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 255, (n, 28, 28)), np.arange(n) % 10
    _write_idx(folder / "train-images-idx3-ubyte.gz", images, 2051)
    _write_idx(folder / "train-labels-idx1-ubyte.gz", labels, 2049)
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", images[:10], 2051)
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", labels[:10], 2049)


@pytest.mark.parametrize("layout", ["debian (files side by side)", "torchvision (FashionMNIST/raw)"])
def test_fashion_mnist_is_read_in_debians_layout_and_torchvisions(tmp_path, layout):
    _write_fashion(tmp_path if layout.startswith("debian") else tmp_path / "FashionMNIST" / "raw")
    data = load_dataset("fashion-mnist", str(tmp_path))
    assert data.x_train.shape == (20, 1, 28, 28) and data.num_classes == 10


def test_missing_fashion_mnist_is_refused_before_anything_starts_naming_the_debian_package(tmp_path, monkeypatch):
    from asyncfl.config import ConfigError, parse_run_config
    from asyncfl.data.datasets import check_files
    from asyncfl.data.readers import DEBIAN_FOLDERS
    from tests.test_config import defaults

    # this machine may have the package installed: look in an empty stand-in for its folder
    monkeypatch.setitem(DEBIAN_FOLDERS, "FashionMNIST", (tmp_path / "debian", "dataset-fashion-mnist"))

    with pytest.raises(DatasetNotFoundError, match="apt-get install dataset-fashion-mnist"):
        check_files("fashion-mnist", str(tmp_path))
    with pytest.raises(ConfigError, match=f"none of {tmp_path / 'FashionMNIST' / 'raw'}, {tmp_path}, "
                                          f"{DEBIAN_FOLDERS['FashionMNIST'][0]}"):
        parse_run_config(defaults(**{"dataset": "fashion-mnist", "data-dir": str(tmp_path)}))
    _write_fashion(tmp_path)
    check_files("fashion-mnist", str(tmp_path))  # there now


def test_a_sample_cap_keeps_a_seeded_subset_of_each_partition():
    labels = np.repeat(np.arange(10), 100)
    for pid in range(4):
        whole = partition_indices(labels, pid, 4, "dirichlet", 0.5, 2, seed=1)
        capped = partition_indices(labels, pid, 4, "dirichlet", 0.5, 2, seed=1, max_samples=30)
        assert len(capped) == min(30, len(whole)) and set(capped.tolist()) <= set(whole.tolist())
        assert np.array_equal(capped, partition_indices(labels, pid, 4, "dirichlet", 0.5, 2, seed=1, max_samples=30))
    small = partition_indices(labels, 0, 4, "iid", seed=1)
    assert np.array_equal(partition_indices(labels, 0, 4, "iid", seed=1, max_samples=10_000), small)


def test_the_sample_cap_reaches_node_data_and_rejects_negative_values():
    from dataclasses import replace

    from asyncfl.client_app.task import node_data
    from asyncfl.config import ConfigError, parse_run_config
    from tests.test_config import defaults

    data = replace(parse_run_config(defaults()).data, max_samples_per_client=25)
    assert len(node_data(data, 2, 5, 42).x_train) == 25
    with pytest.raises(ConfigError, match="max-samples-per-client=-1 must be >= 0"):
        parse_run_config(defaults(**{"max-samples-per-client": -1}))
