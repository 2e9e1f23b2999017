"""A gossip peer's local train / test split: the fraction of what it keeps, or a test set held out of its whole
partition before the training cap (``gossip.local-test-size``)."""

import numpy as np
import pytest

from asyncfl.client_app.gossip import held_out_split, local_split
from asyncfl.config import ConfigError, parse_run_config
from tests.test_config import defaults


def test_a_held_out_test_set_comes_from_the_peer_s_own_rows_before_the_training_cap():
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10)
    x_train, y_train, x_test, y_test = held_out_split(x, y, 4, 3, seed=1, partition_id=7)
    assert (len(y_test), len(y_train)) == (4, 3)  # 4 held out, then 3 of the other 6 kept for training
    assert not set(y_test) & set(y_train) and set(y_test) | set(y_train) <= set(y)
    assert np.array_equal(x_train[:, 0], 2 * y_train) and np.array_equal(x_test[:, 0], 2 * y_test)  # rows intact
    again = held_out_split(x, y, 4, 3, seed=1, partition_id=7)
    assert all(np.array_equal(a, b) for a, b in zip((x_train, y_train, x_test, y_test), again))
    other_peer = held_out_split(x, y, 4, 3, seed=1, partition_id=8)[3]
    assert not np.array_equal(np.sort(other_peer), np.sort(y_test))  # each peer draws its own (this pair differs)
    assert held_out_split(x, y, 4, 0, seed=1, partition_id=7)[1].size == 6  # no cap: every other row trains


def test_a_peer_smaller_than_its_test_size_keeps_one_example_for_training():
    x, y = np.zeros((3, 2), np.float32), np.arange(3)
    _, y_train, _, y_test = held_out_split(x, y, 100, 0, seed=1, partition_id=0)
    assert (len(y_train), len(y_test)) == (1, 2)
    assert len(local_split(x, y, 0.2, seed=1)[3]) == 1  # the fraction's split: at least one test example


def test_the_test_size_and_a_changed_fraction_are_refused_together_and_a_negative_size_alone():
    gossip = {"strategy": "pushcen", "clock": "virtual", "max-time": 10.0}
    assert parse_run_config(defaults(**gossip, **{"gossip.local-test-size": 100})).gossip.local_test_size == 100
    with pytest.raises(ConfigError, match="local-test-fraction=0.3 would be ignored"):
        parse_run_config(defaults(**gossip, **{"gossip.local-test-size": 100, "gossip.local-test-fraction": 0.3}))
    with pytest.raises(ConfigError, match="local-test-size must be >= 0"):
        parse_run_config(defaults(**gossip, **{"gossip.local-test-size": -1}))
