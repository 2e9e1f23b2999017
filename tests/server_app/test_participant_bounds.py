"""Each update's norm is bounded against the recent ones: hand-computed cases, and one faulty node of eight."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from asyncfl import FedAsync, FedBuff
from asyncfl.errors import ConfigError
from asyncfl.server_app.codec import RejectedReply
from asyncfl.server_app.participants import MIN_HISTORY, UpdateNormBound
from asyncfl.strategies.arrival import Arrival
from tests.fake_grid import FakeGrid, trained_reply


def arrival(delta, base=None, client=0, num_examples=1) -> Arrival:
    base = np.zeros(len(delta), np.float32) if base is None else np.asarray(base, np.float32)
    return Arrival(client, 0, 0, base + np.asarray(delta, np.float32), base, num_examples, 0.0, 0.0)


def fill(bound, norms, dims=1, first_client=0):
    """One update of each norm, each from its own client (an all-zero base: the warm-up passes them as they are)."""
    for i, norm in enumerate(norms):
        bound.apply(arrival([norm] + [0.0] * (dims - 1), client=first_client + i))


def test_an_update_beyond_the_bound_is_scaled_back_along_its_direction():
    bound = UpdateNormBound(2.0)
    for client, norm in enumerate((1.0, 2.0, 3.0)):  # median 2 -> bound 4
        assert bound.apply(arrival([norm, 0.0], client=client)).weights.tolist() == [norm, 0.0]
    clipped = bound.apply(arrival([6.0, 8.0], base=[1.0, 1.0], client=3))  # norm 10 -> 4: (0.6, 0.8) x 4 from the base
    assert clipped.weights == pytest.approx([1.0 + 2.4, 1.0 + 3.2])
    assert clipped.delta == pytest.approx([2.4, 3.2])
    assert (bound.clipped, bound.rejected) == (1, 0) and bound.largest_ratio == pytest.approx(5.0)


def test_an_update_within_the_bound_is_passed_as_it_came():
    bound = UpdateNormBound(3.0)
    fill(bound, [1.0] * MIN_HISTORY, dims=2)
    within = arrival([0.0, 2.9], client=MIN_HISTORY)
    assert bound.apply(within) is within


def test_before_enough_history_the_reference_is_a_tenth_of_the_base_models_norm():
    bound = UpdateNormBound(3.0)
    base = [3.0, 4.0]  # norm 5 -> reference 0.5 -> bound 1.5
    assert bound.reference(np.array(base, np.float32)) == pytest.approx(0.5)
    clipped = bound.apply(arrival([0.0, 30.0], base=base))
    assert clipped.delta == pytest.approx([0.0, 1.5])


def test_an_attacker_that_arrives_first_cannot_replace_the_model():
    """An update of -3 x0 (norm 3 |x0|) passed the old bound (3 x |x0|) unclipped; now it moves x0 by 0.3 |x0|."""
    base = np.array([3.0, 4.0], np.float32)
    out = UpdateNormBound(3.0).apply(arrival(-3 * base, base=base))
    assert out.weights == pytest.approx(0.7 * base)


def test_the_median_ignores_a_minority_of_huge_norms():
    bound = UpdateNormBound(3.0)
    fill(bound, (1.0, 1e6, 1.0, 1.0, 1e6))
    assert bound.reference(np.zeros(1, np.float32)) == pytest.approx(1.0)
    assert sorted(bound.norms) == [1.0, 1.0, 1.0, 3.0, 1e6]  # the last 1e6 came after history: it entered clipped


def test_reject_names_the_reason_and_counts_it():
    bound = UpdateNormBound(2.0, action="reject")
    fill(bound, [1.0] * MIN_HISTORY)
    outcome = bound.apply(arrival([5.0], client=MIN_HISTORY))
    assert isinstance(outcome, RejectedReply) and outcome.reason == "update-norm" and bound.rejected == 1
    assert "exceeds 2 x the reference 1" in str(outcome)


def test_entries_that_are_not_trained_are_neither_measured_nor_scaled():
    trained = np.array([True, True, False])
    bound = UpdateNormBound(2.0, groups=[trained])
    for client in range(MIN_HISTORY):
        bound.apply(arrival([1.0, 0.0, 50.0], client=client))  # a counter moving by 50 is no part of the norm
    assert bound.reference(np.zeros(3, np.float32)) == pytest.approx(1.0)
    clipped = bound.apply(arrival([0.0, 4.0, 50.0], client=MIN_HISTORY))
    assert clipped.weights.tolist() == pytest.approx([0.0, 2.0, 50.0])


def test_batchnorm_statistics_are_bounded_on_their_own_scale():
    """Weights move by ~1, running statistics by ~10 (another scale): a poisoned statistic is clipped against the
    statistics' own history, the weights are left as they came (a noisy node's running_var once slipped past a
    bound over the weights alone)."""
    weights, stats = np.array([True, True, False, False]), np.array([False, False, True, True])
    bound = UpdateNormBound(3.0, groups=[weights, stats])
    for client in range(MIN_HISTORY):
        assert bound.apply(arrival([1.0, 0.0, 10.0, 0.0], client=client)).delta.tolist() == [1.0, 0.0, 10.0, 0.0]
    out = bound.apply(arrival([0.0, 2.0, 0.0, 500.0], client=MIN_HISTORY))
    assert out.delta.tolist() == pytest.approx([0.0, 2.0, 0.0, 30.0]) and bound.clipped == 1


def test_huge_finite_updates_do_not_overflow_the_norm():
    bound = UpdateNormBound(3.0)
    for client in range(MIN_HISTORY):
        bound.apply(arrival([1.0, 1.0], client=client))
    clipped = bound.apply(arrival([3e38, 3e38], client=MIN_HISTORY))
    assert np.isfinite(clipped.weights).all() and np.linalg.norm(clipped.delta) == pytest.approx(3 * np.sqrt(2))


@pytest.mark.parametrize("options, says", [
    ({"update_norm_bound": 1.0}, "multiple > 1"),
    ({"update_norm_bound": 0.5}, "multiple > 1"),
    ({"update_norm_bound": 0.0, "update_norm_action": "reject"}, "would be ignored"),
])
def test_a_bound_at_or_below_the_typical_update_or_an_ignored_action_is_refused(options, says):
    with pytest.raises(ConfigError, match=says):
        FedBuff().start(FakeGrid(2, None), ArrayRecord({"w": Array(np.zeros(2, np.float32))}), num_rounds=1,
                        clock="virtual", delay_model="uniform-speed", **options)


# ---------------------------------------------------------------------------------------- one faulty node of eight
TARGET = np.linspace(-1.0, 1.0, 16, dtype=np.float32)


def _learner(faulty: set[int]):
    """Honest clients step 20 % of the way to TARGET; a faulty node adds noise of sd 10 to what it returns."""
    def handle(node: int, message):
        assert message.metadata.message_type == "train"
        w = message.content.array_records["arrays"]["w"].numpy()
        trained = w + np.float32(0.2) * (TARGET - w)
        if node in faulty:
            seed = int(message.content.config_records["config"]["job-seed"])
            trained = trained + np.random.default_rng(seed % 2**32).normal(0.0, 10.0, w.shape).astype(np.float32)
        return trained_reply(message, ArrayRecord({"w": Array(trained)}))
    return handle


def _distance_after(strategy, faulty: set[int], **options) -> tuple[float, dict]:
    grid = FakeGrid(8, _learner(faulty))
    result = strategy.start(grid, ArrayRecord({"w": Array(np.full(16, 0.1, np.float32))}), num_rounds=0,
                            train_config=ConfigRecord({}), clock="virtual", delay_model="fedrevive-default", seed=3,
                            max_arrivals=240, concurrency=4, **options)
    return float(np.linalg.norm(result.arrays["w"].numpy() - TARGET)), result.summary


@pytest.mark.parametrize("make", [lambda: FedBuff(fraction_evaluate=0.0), lambda: FedAsync(fraction_evaluate=0.0)],
                         ids=["fedbuff", "fedasync"])
def test_one_noisy_node_of_eight_does_not_stop_the_default_strategies_learning(make):
    clean, _ = _distance_after(make(), set())
    unbounded, _ = _distance_after(make(), {101}, update_norm_bound=0.0)
    bounded, summary = _distance_after(make(), {101})
    start = float(np.linalg.norm(TARGET - 0.1))
    assert clean < 0.05 * start
    assert unbounded > start  # noise of sd 10 in every eighth update: further from the target than the start
    assert bounded < 0.25 * start and summary["update-norm-clipped"] > 0
    assert summary["update-norm-rejected"] == 0


def test_rejecting_beyond_the_bound_counts_the_faulty_nodes_updates_as_rejected():
    distance, summary = _distance_after(FedBuff(fraction_evaluate=0.0), {101}, update_norm_action="reject")
    assert distance < 0.05 * float(np.linalg.norm(TARGET))
    assert summary["rejected-by-reason"].get("update-norm", 0) == summary["update-norm-rejected"] > 0


def test_once_honest_updates_stop_moving_the_model_any_update_is_bounded_at_zero():
    bound = UpdateNormBound(3.0)
    for client in range(MIN_HISTORY):
        bound.apply(arrival([0.0, 0.0], base=[1.0, 1.0], client=client))
    assert bound.apply(arrival([5.0, 0.0], base=[1.0, 1.0], client=MIN_HISTORY)).weights.tolist() == [1.0, 1.0]


def test_a_fast_client_fills_one_entry_of_the_window_and_its_bound_shrinks_with_its_share():
    """Clients 0-3 send norm 1 once each in turn; client 9 sends norm 100 after each of them (4x their rate). Its
    entries replace each other (one of five clients), so the median stays 1; its bound is 3 / its share ratio^2."""
    bound = UpdateNormBound(3.0)
    fill(bound, [1.0, 1.0, 1.0])
    for turn in range(8):
        bound.apply(arrival([1.0], client=turn % 4))
        for _ in range(4):
            out = bound.apply(arrival([100.0], client=9))
    assert bound.reference(np.zeros(1, np.float32)) == pytest.approx(1.0)
    assert len(bound.norms) == 5 and max(bound.norms) == pytest.approx(3.0)
    counts = {0: 3, 1: 3, 2: 3, 3: 2, 9: 31}  # the window before client 9's last update (plus the fill's three)
    expected_ratio = counts[9] / np.median(list(counts.values()))
    assert bound.rate_ratio(9) == pytest.approx((counts[9] + 1) / np.median([3, 3, 3, 2, 32]))
    assert float(np.abs(out.delta).max()) == pytest.approx(3.0 / expected_ratio**2, rel=1e-5)
    assert bound.rate_limited > 0


def test_what_is_bounded_is_the_movement_the_strategy_gives_an_update():
    """Three clients move the model by weight 0.25 x norm 4 = 1 each (median 1, bound 3). A fresh update (weight 1)
    of norm 4 moves it by 4: clipped to norm 3; a stale one (weight 0.25) of norm 10 moves it by 2.5: passes."""
    bound = UpdateNormBound(3.0)
    for client in range(MIN_HISTORY):
        bound.apply(arrival([4.0, 0.0], client=client), weight=0.25)
    assert bound.reference(np.zeros(2, np.float32)) == pytest.approx(1.0)
    fresh = bound.apply(arrival([0.0, 4.0], client=3), weight=1.0)
    assert fresh.delta == pytest.approx([0.0, 3.0])
    stale = arrival([10.0, 0.0], client=4)
    assert bound.apply(stale, weight=0.25) is stale
    assert bound.largest_ratio == pytest.approx(4.0)


def test_a_weight_below_the_floor_still_bounds_the_norm():
    """Weight 0 would make any norm pass; it counts as 1 / multiple^2 = 1/9: norm 100 -> movement 11.1 > 3."""
    bound = UpdateNormBound(3.0)
    fill(bound, [1.0] * MIN_HISTORY)
    out = bound.apply(arrival([100.0], client=MIN_HISTORY), weight=0.0)
    assert out.delta == pytest.approx([27.0])  # movement 3 at weight 1/9


def test_each_strategys_weight_for_an_update_next_to_a_fresh_one():
    from asyncfl.server_app.participants import relative_weight
    from asyncfl.strategies import FedAvg
    stale = Arrival(0, 0, 3, np.ones(1, np.float32), np.zeros(1, np.float32), 40, 0.0, 0.0)
    assert relative_weight(FedAsync(alpha=0.6), stale) == pytest.approx(0.5)  # (1 + 3)^-1/2, alpha cancels
    assert relative_weight(FedBuff(staleness_weighting="sqrt"), stale) == pytest.approx(0.5)
    assert relative_weight(FedBuff(), stale) == pytest.approx(1.0)
    assert relative_weight(FedAvg(), stale) == pytest.approx(1.0)  # a round's mean: no per-update coefficient


def test_a_fresh_fast_attacker_moves_fedasync_no_further_than_the_median_client():
    """Honest updates arrive 7 versions stale (weight 1/sqrt 8); the attacker's are fresh, at norm 100. Bounded by
    norm alone each of its updates moved the model 3 x the median norm, 8.5 x an honest client's movement;
    bounded by movement, 3 x an honest client's, and less at its share of the updates."""
    from asyncfl.server_app.participants import relative_weight
    strategy, bound = FedAsync(), UpdateNormBound(3.0)
    honest = [Arrival(c, 0, 7, np.ones(1, np.float32), np.zeros(1, np.float32), 1, 0.0, 0.0) for c in range(1, 8)]
    for a in honest:
        bound.apply(a, relative_weight(strategy, a))
    attack = Arrival(0, 0, 0, np.full(1, 100.0, np.float32), np.zeros(1, np.float32), 1, 0.0, 0.0)
    out = bound.apply(attack, relative_weight(strategy, attack))
    honest_movement = strategy.mixing_weight(7) * 1.0
    attacker_movement = strategy.mixing_weight(0) * float(out.delta[0])
    assert attacker_movement == pytest.approx(3.0 * honest_movement, rel=1e-5)


# ------------------------------------------------------------------------------ robust buffered aggregation
from asyncfl.strategies.fedbuff import robust_combine  # noqa: E402


def test_robust_rules_combine_the_buffer_entry_by_entry():
    rows = np.array([[1.0, 10.0], [2.0, -50.0], [3.0, 20.0], [100.0, 30.0], [4.0, 40.0]], np.float32)
    assert robust_combine(rows, "mean").tolist() == pytest.approx([22.0, 10.0])
    assert robust_combine(rows, "median").tolist() == [3.0, 20.0]
    assert robust_combine(rows, "trimmed-mean").tolist() == pytest.approx([3.0, 20.0])  # floor(0.2 x 5) = 1 a side


def test_fedbuff_with_a_median_steps_by_the_buffers_median_update():
    strategy = FedBuff(buffer_size=3, server_lr=0.5, aggregation="median")
    strategy.on_start(4, concurrency=3)
    current = np.zeros(2, np.float32)
    assert strategy.on_arrival(arrival([1.0, 1.0]), current) is None
    assert strategy.on_arrival(arrival([100.0, -100.0]), current) is None
    new = strategy.on_arrival(arrival([2.0, 3.0]), current)
    assert new.tolist() == [1.0, 0.5] and strategy.buffered == 0  # 0.5 x median (2, 1)


def test_a_median_buffer_survives_a_noisy_node_without_the_bound():
    distance, _ = _distance_after(FedBuff(buffer_size=4, aggregation="median", fraction_evaluate=0.0), {101},
                                  update_norm_bound=0.0, dispatch_hold=0.0)  # the rule alone, on the schedule as drawn
    assert distance < 0.25 * float(np.linalg.norm(TARGET - 0.1))


def test_a_fast_client_arriving_first_cannot_compound_warm_up_steps():
    """Before three clients are known the reference stays a tenth of the first model's norm, and a client's k-th
    update then gets 1/k^2 of the bound: ten steps of x100 move x0 = (3, 4) by 1.5 x (1 + 1/4 + ... + 1/100)."""
    bound = UpdateNormBound(3.0)
    w = np.array([3.0, 4.0], np.float32)
    for _ in range(10):
        w = bound.apply(arrival(99.0 * w, base=w, client=7)).weights
    squares = sum(1.0 / k**2 for k in range(1, 11))
    assert float(np.linalg.norm(w)) == pytest.approx(5.0 + 1.5 * squares, rel=1e-4)


def test_a_float_counter_outside_every_named_group_is_bounded_too():
    from collections import OrderedDict

    from asyncfl.server_app.codec import ModelCodec
    codec = ModelCodec.from_state(OrderedDict(w=np.zeros(2, np.float32),
                                              **{"bn.num_batches_tracked": np.zeros((), np.float32)}))
    groups = codec.bound_groups()
    assert [g.tolist() for g in groups] == [[True, True, False], [False, False, True]]


@pytest.mark.parametrize("synchronous", [False, True], ids=["asynchronous", "synchronous"])
def test_a_clients_bound_shrinks_with_its_share_only_where_it_sets_its_own_rate(synchronous):
    from types import SimpleNamespace

    from asyncfl import FedAvg
    from asyncfl.server_app.participants import ParticipantBounds

    # Prepare: 4 clients; 0, 1 and 2 send an update of one norm, then client 0 three more
    strategy = FedAvg() if synchronous else FedBuff(buffer_size=2, server_lr=1.0)
    bounds = ParticipantBounds(3.0, "clip", [None], SimpleNamespace(held_back_checks=0), strategy)
    bounds.start([0, 0, 0, 0])
    for client in (0, 1, 2, 0, 0):
        bounds.apply(arrival([1.0, 1.0], base=[10.0, 10.0], client=client))
    last = bounds.apply(arrival([1.0, 1.0], base=[10.0, 10.0], client=0))
    # Assert: asynchronous, client 0 sent 3 x the median client's updates: its bound is 3 / 3^2 of the median
    # movement, so it is scaled to a third; synchronous, the server drew it that often: its update passes
    assert last.delta.tolist() == pytest.approx([1.0, 1.0] if synchronous else [1 / 3, 1 / 3], rel=1e-5)


def test_an_all_zero_first_model_is_said_once_and_a_random_one_is_not(caplog):
    """An all-zero model gives the warm-up no reference: its first updates pass as they came, which a warning says
    once; a model that starts elsewhere is bounded from its first update and draws no warning."""
    zero = UpdateNormBound(3.0)
    with caplog.at_level("WARNING", logger="asyncfl.engine"):
        fill(zero, [1e30, 1.0])
    assert [r.getMessage().startswith("the model's trained entries start at all zeros") for r in caplog.records] == [True]
    caplog.clear()
    started = UpdateNormBound(3.0)
    with caplog.at_level("WARNING", logger="asyncfl.engine"):
        first = started.apply(arrival([1e30], base=[1.0]))
    assert not caplog.records and first.delta == pytest.approx([0.3])  # 3 x a tenth of the model's norm
