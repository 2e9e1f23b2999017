"""An asyncfl strategy in a Flower app's own loop (Flower's Strategy.start, as advanced-pytorch overrides it)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp.strategy import Strategy as FlowerStrategy

from asyncfl.strategies import FedAsync, FedAvg, FedBuff
from tests.fake_grid import FakeGrid, trained_reply


def _plus_one(node, message):
    """Every node returns the model it got plus 1 (a delta of +1)."""
    w = message.content.array_records["arrays"]["w"].numpy()
    return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(1.0))}), num_examples=10, loss=0.25)


def test_flowers_own_loop_runs_the_methods_math_synchronously_on_flowers_sample():
    # Prepare: 8 nodes; FedBuff B = 2, server step 1, half the nodes per round as FedAvg(fraction_train=0.5)
    grid = FakeGrid(8, _plus_one)
    strategy = FedBuff(buffer_size=2, server_lr=1.0, fraction_train=0.5, fraction_evaluate=0.0)
    train_config = ConfigRecord({"lr": 0.1})
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    # Execute: Flower's Strategy.start, the loop a Flower app's custom start copies
    assert isinstance(strategy, FlowerStrategy)
    result = FlowerStrategy.start(strategy, grid, initial, num_rounds=3, train_config=train_config,
                                  evaluate_fn=lambda r, arrays: MetricRecord({"w": float(arrays["w"].numpy()[0])}))
    # Assert: 4 of 8 nodes per round; each round's 4 replies (delta +1 from the round's model) make two FedBuff
    # steps of +1 from that model: +2 a round
    trains = [m for m in grid.pushed if m.metadata.message_type == "train"]
    assert len(trains) == 12 and len({m.metadata.dst_node_id for m in trains[:4]}) == 4
    assert [m.content["config"]["server-round"] for m in trains[::4]] == [1, 2, 3]
    assert dict(train_config) == {"lr": 0.1}  # the caller's record is not written into
    assert np.allclose(result.arrays["w"].numpy(), 6.0)
    assert [result.evaluate_metrics_serverapp[r]["w"] for r in (0, 1, 2, 3)] == [0.0, 2.0, 4.0, 6.0]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert result.train_metrics_clientapp[1]["train-loss"] == pytest.approx(0.25)
    assert not [m for m in grid.pushed if m.metadata.message_type == "evaluate"]  # fraction_evaluate = 0


def test_a_malformed_reply_in_a_custom_loop_is_rejected_and_the_round_goes_on():
    def some_broken(node, message):
        reply = _plus_one(node, message)
        if node % 2:
            reply.content.array_records["arrays"]["w"] = Array(np.full(3, np.nan, dtype=np.float32))
        return reply

    strategy = FedAsync(alpha=1.0, staleness="constant", fraction_train=1.0)
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    result = FlowerStrategy.start(strategy, FakeGrid(4, some_broken), initial, num_rounds=1)
    # FedAsync with alpha 1 takes each (finite) reply: the model is the last good client's, w = 1
    assert np.allclose(result.arrays["w"].numpy(), 1.0)


@pytest.mark.parametrize("count", [float("nan"), float("inf"), -5, 2.5, 2.0**60, [10, 10]])
def test_a_hostile_count_in_a_custom_loop_rejects_its_reply_and_the_round_goes_on(count):
    def odd_nodes_lie(node, message):
        reply = _plus_one(node, message)
        if node % 2:
            reply.content.metric_records["metrics"]["num-examples"] = count
            reply.content.metric_records["metrics"]["train-loss"] = [1.0, 2.0]  # a loss no number: read as NaN
        return reply

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    result = FlowerStrategy.start(strategy, FakeGrid(4, odd_nodes_lie), initial, num_rounds=2)
    # the honest half's +1 a round, weighted by their own counts; their loss, aggregated by their counts
    assert np.allclose(result.arrays["w"].numpy(), 2.0)
    assert result.train_metrics_clientapp[2]["train-loss"] == pytest.approx(0.25)


def test_a_whole_count_in_a_custom_loop_weighs_as_checked_and_a_loss_no_number_is_no_rejection():
    def odd_node_counts_more(node, message):
        reply = _plus_one(node, message)
        reply.content.metric_records["metrics"]["num-examples"] = 30.0 if node % 2 else 10  # an integral float
        if node % 2:
            reply.content.array_records["arrays"]["w"] = Array(np.full(3, 5.0, dtype=np.float32))
            reply.content.metric_records["metrics"]["train-loss"] = [1.0]
        return reply

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    result = FlowerStrategy.start(strategy, FakeGrid(2, odd_node_counts_more), initial, num_rounds=1)
    # FedAvg's weighted mean of the round's models: (30 x 5 + 10 x 1) / 40 = 4
    assert np.allclose(result.arrays["w"].numpy(), 4.0)


def _honest_and_one_liar(delta, count):
    """Nodes send +1 with 10 examples; the odd node of two (the first to reply) ``delta`` with ``count``."""
    def client(node, message):
        w = message.content.array_records["arrays"]["w"].numpy()
        if node == 101:
            return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(delta))}), num_examples=count)
        return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(1.0))}), num_examples=10)
    return client


def test_a_boosted_update_in_a_custom_loop_is_bounded_as_start_bounds_it():
    # Prepare: 4 nodes, FedAvg (equal counts: the round's mean update); the first to reply sends 100 x the honest +1
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
    initial = ArrayRecord({"w": Array(np.full(3, 10.0, dtype=np.float32))})
    result = FlowerStrategy.start(strategy, FakeGrid(4, _honest_and_one_liar(100.0, 10)), initial, num_rounds=3)
    # Assert: its movement is held to 3 x the reference: in warm-up 0.1 x the model's norm (10 sqrt 3), then the
    # median node's (sqrt 3): +3 an entry, so each round moves (3 + 1 + 1 + 1) / 4 = 1.5, not (100 + 3) / 4
    assert np.allclose(result.arrays["w"].numpy(), 10.0 + 3 * 1.5, atol=1e-4)


def test_a_forged_count_in_a_custom_loop_is_capped_once_three_nodes_are_known():
    # Prepare: the first to reply sends an honest-sized update the other way (-1) with 10^9 examples
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
    initial = ArrayRecord({"w": Array(np.full(3, 10.0, dtype=np.float32))})
    result = FlowerStrategy.start(strategy, FakeGrid(4, _honest_and_one_liar(-1.0, 10**9)), initial, num_rounds=3)
    # Assert: round 1, before 3 nodes' counts are known (no sizes reported), its count passes and it moves the model
    # by ~-1; from round 2 it is capped at 3 x the median count (30) against the honest 3 x 10: the rounds move 0
    assert np.allclose(result.arrays["w"].numpy(), 9.0, atol=1e-4)


def test_under_the_dp_wrapper_a_custom_loop_leaves_the_bounds_to_its_fixed_clip():
    from asyncfl import DifferentialPrivacyServerSideFixedClipping

    # FedBuff B = 4 at a fixed step 1, no noise, a clip far above every update: the round's mean update
    strategy = DifferentialPrivacyServerSideFixedClipping(FedBuff(buffer_size=4, server_lr=1.0, fraction_train=1.0,
                                                                  fraction_evaluate=0.0), 0.0, 1000.0,
                                                          insecure_noise_seed=1)
    initial = ArrayRecord({"w": Array(np.full(3, 10.0, dtype=np.float32))})
    result = FlowerStrategy.start(strategy, FakeGrid(4, _honest_and_one_liar(100.0, 10)), initial, num_rounds=1)
    # the adaptive bound is off (it would make the step (3 + 1 + 1 + 1) / 4): (100 + 1 + 1 + 1) / 4
    assert np.allclose(result.arrays["w"].numpy(), 10.0 + 25.75, atol=1e-4)


def test_a_custom_loops_federated_evaluation_checks_and_caps_each_count():
    from flwr.app import Message, RecordDict

    def client(node, message):
        if message.metadata.message_type != "evaluate":
            return _plus_one(node, message)
        count, accuracy = {101: (10**6, 0.9), 102: (float("nan"), 0.0)}.get(node, (10, 0.5))
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": count, "accuracy": accuracy})}),
                       reply_to=message)

    strategy = FedBuff(fraction_train=1.0, fraction_evaluate=1.0)
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    result = FlowerStrategy.start(strategy, FakeGrid(4, client), initial, num_rounds=1)
    # the NaN count leaves its reply out; 10^6 is capped at 3 x the median of (10^6, 10, 10): (30 x 0.9 + 20 x 0.5) / 50
    assert result.evaluate_metrics_clientapp[1]["accuracy"] == pytest.approx(0.74)


def test_a_custom_loop_waits_for_min_available_nodes_and_takes_k_from_the_sample(monkeypatch):
    # Prepare: 1 node connected at first, 8 after the loop waited once; FedBuff's automatic buffer follows K
    grid = FakeGrid(8, _plus_one)
    connected = iter([[101]] + [list(range(101, 109))] * 100)
    monkeypatch.setattr(grid, "get_node_ids", lambda: next(connected))
    monkeypatch.setattr("asyncfl.strategies.custom_loop.time.sleep", lambda seconds: None)
    strategy = FedBuff(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=8)
    FlowerStrategy.start(strategy, grid, ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))}), num_rounds=1)
    # Assert: as Flower's FedAvg, the sample's size is max(min_train_nodes, int(0.5 x 1)) = 2, taken once 8 nodes
    # are connected (2 of 1 node could not be drawn); K is that sample's size
    assert len([m for m in grid.pushed if m.metadata.message_type == "train"]) == 2
    assert strategy.concurrency == 2


def test_a_custom_loop_refuses_a_model_whose_layout_changed_between_rounds():
    from asyncfl.errors import ConfigError

    strategy = FedAsync(fraction_train=1.0, fraction_evaluate=0.0)
    grid = FakeGrid(2, _plus_one)
    strategy.configure_train(1, ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))}), ConfigRecord({}), grid)
    with pytest.raises(ConfigError, match="layout changed between rounds"):
        strategy.configure_train(2, ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))}), ConfigRecord({}), grid)


def test_a_custom_loop_refuses_a_non_finite_step_and_clamps_batchnorm_variances():
    def variance_down(node, message):
        arrays = message.content.array_records["arrays"]
        w, var = arrays["w"].numpy(), arrays["bn.running_var"].numpy()
        return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(1.0)),
                                                   "bn.running_var": Array(var - np.float32(0.3))}))

    initial = ArrayRecord({"w": Array(np.full(3, 10.0, dtype=np.float32)),
                           "bn.running_var": Array(np.full(2, 0.1, dtype=np.float32))})
    result = FlowerStrategy.start(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), FakeGrid(4, variance_down),
                                  initial, num_rounds=2)
    assert (result.arrays["bn.running_var"].numpy() >= 0).all()  # 0.1 - 0.3 < 0: clamped, as start() clamps
    def plus_ten(node, message):
        w = message.content.array_records["arrays"]["w"].numpy()
        return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(10.0))}))

    with pytest.raises(FloatingPointError, match="non-finite model in round 1"):  # 1e38 x the mean update 10
        FlowerStrategy.start(FedAvg(server_lr=1e38, fraction_train=1.0, fraction_evaluate=0.0),
                             FakeGrid(4, plus_ten), ArrayRecord({"w": Array(np.full(3, 10.0, np.float32))}),
                             num_rounds=1)


def test_a_reply_without_its_count_weighs_one_and_keeps_the_rounds_train_metrics():
    def node_one_omits_its_count(node, message):
        reply = _plus_one(node, message)
        if node == 101:
            del reply.content.metric_records["metrics"]["num-examples"]
        return reply

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
    result = FlowerStrategy.start(strategy, FakeGrid(2, node_one_omits_its_count),
                                  ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))}), num_rounds=1)
    assert result.train_metrics_clientapp[1]["train-loss"] == pytest.approx(0.25)
