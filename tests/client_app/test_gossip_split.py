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


def test_a_peer_smaller_than_twice_its_test_size_holds_out_half_of_its_examples():
    x, y = np.zeros((7, 2), np.float32), np.arange(7)
    _, y_train, _, y_test = held_out_split(x, y, 100, 0, seed=1, partition_id=0)
    assert (len(y_train), len(y_test)) == (4, 3)
    assert [len(held_out_split(x, y, 100, 2, seed=1, partition_id=0)[i]) for i in (1, 3)] == [2, 3]  # cap after
    assert len(local_split(x[:3], y[:3], 0.2, seed=1)[3]) == 1  # the fraction's split: at least one test example


def test_the_test_size_and_a_changed_fraction_are_refused_together_and_a_negative_size_alone():
    gossip = {"strategy": "pushcen", "clock": "virtual", "max-time": 10.0}
    assert parse_run_config(defaults(**gossip, **{"gossip.local-test-size": 100})).gossip.local_test_size == 100
    with pytest.raises(ConfigError, match="local-test-fraction=0.3 would be ignored"):
        parse_run_config(defaults(**gossip, **{"gossip.local-test-size": 100, "gossip.local-test-fraction": 0.3}))
    with pytest.raises(ConfigError, match=r"local_test_size=-1 must be >= 0 \(run-config gossip.local-test-size\)"):
        parse_run_config(defaults(**gossip, **{"gossip.local-test-size": -1}))
    for odd in (100.5, True, "100"):
        with pytest.raises(ConfigError,
                           match=f"local_test_size={odd!r} must be int \\(run-config gossip.local-test-size"):
            parse_run_config(defaults(**gossip, **{"gossip.local-test-size": odd}))


def test_a_peer_that_holds_its_test_examples_out_reports_the_examples_it_trains_on():
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from asyncfl import protocol
    from asyncfl.client_app.app import gossip_data, identify
    from asyncfl.client_app.gossip import peer_split

    run_config = defaults(**{"strategy": "pushcen", "clock": "virtual", "max-time": 10.0, "dataset": "digits",
                             "model": "mlp", "gossip.local-test-size": 40, "max-samples-per-client": 30})
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 2, "num-partitions": 4},
                      state=RecordDict(), run_config=run_config)
    query = Message(RecordDict({"config": ConfigRecord({protocol.IDENTIFY: True, protocol.WANT_LABEL_COUNTS: True})}),
                    dst_node_id=7, message_type="query")
    answer = identify(query, context).content.config_records["config"]
    cfg = parse_run_config(run_config, strategy_settings=False)
    trained = peer_split(cfg, gossip_data(cfg, 2, 4), 2)[1]
    assert answer[protocol.NUM_EXAMPLES] == len(trained) == 30
    assert list(answer[protocol.LABEL_COUNTS]) == np.bincount(trained, minlength=10).tolist()
