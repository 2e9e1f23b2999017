"""The default server step (one mean update per K arrivals) on hand-made deltas, and why it is the default."""

import numpy as np
import pytest
from flwr.app import ArrayRecord

from asyncfl import AFLDW, CA2FL, FedBuff, FedFa
from asyncfl.strategies.base import Arrival
from asyncfl.strategies.pace import paced_server_lr, per_update_share
from tests.fake_grid import FakeGrid, trained_reply


def arrival(delta, client=0, staleness=0, base=None):
    base = np.zeros_like(np.asarray(delta, np.float32)) if base is None else np.asarray(base, np.float32)
    return Arrival(client, 0, staleness, base + np.asarray(delta, np.float32), base, 10, 0.5, 0.0)


def test_pace_is_one_mean_update_per_k_arrivals():
    assert per_update_share(8) == pytest.approx(0.125)
    assert paced_server_lr(5, 8) == pytest.approx(0.625)
    assert paced_server_lr(10, 5) == 1.0  # a buffer larger than K is FedAvg's full step, never more
    with pytest.raises(ValueError, match="concurrency"):
        per_update_share(0)


def test_fedbuff_default_step_is_b_over_k_and_the_papers_step_stays_a_keyword():
    # Prepare: K = 4 jobs in flight, B = 2; deltas (1, 1) and (3, 3) from a zero model
    paced, paper = FedBuff(buffer_size=2), FedBuff(buffer_size=2, server_lr=1.0)
    results = []
    for strategy in (paced, paper):
        strategy.on_start(num_clients=6, concurrency=4)
        assert strategy.on_arrival(arrival([1.0, 1.0]), np.zeros(2, np.float32)) is None
        results.append(strategy.on_arrival(arrival([3.0, 3.0]), np.zeros(2, np.float32)))
    # Assert: eta_s = B / K = 0.5 -> 0.5 / 2 * (4, 4) = (1, 1); the paper's eta_s = 1 -> (2, 2)
    np.testing.assert_allclose(results[0], [1.0, 1.0])
    np.testing.assert_allclose(results[1], [2.0, 2.0])
    assert paced.summary()["server-lr"] == 0.5 and paper.summary()["server-lr"] == 1.0


def test_afl_dw_and_ca2fl_default_steps_follow_the_concurrency():
    afl_dw = AFLDW()
    afl_dw.on_start(num_clients=10, concurrency=4)
    # tau = 0: beta = 0, so the step is 1/K of the delta
    np.testing.assert_allclose(afl_dw.on_arrival(arrival([4.0, -8.0]), np.ones(2, np.float32)), [2.0, -1.0])
    ca2fl = CA2FL(buffer_size=2)
    ca2fl.on_start(num_clients=4, concurrency=4)
    ca2fl.on_arrival(arrival([2.0], client=0), np.zeros(1, np.float32))
    # first aggregation: h_bar = 0, S = 2 + 6, eta = M / K = 0.5 -> 0.5 * 8 / 2 = 2
    np.testing.assert_allclose(ca2fl.on_arrival(arrival([6.0], client=1), np.zeros(1, np.float32)), [2.0])


def test_fedfa_default_window_is_half_the_concurrency():
    strategy = FedFa()
    strategy.on_start(num_clients=10, concurrency=5)
    assert strategy.queue_size == 3
    for value in (1.0, 2.0, 3.0, 4.0):
        model = strategy.on_arrival(arrival([0.0], base=[value]), np.zeros(1, np.float32))
    np.testing.assert_allclose(model, [3.0])  # mean of the last 3 client models (2, 3, 4)


def run_stale_quadratic(server_lr: float) -> list[float]:
    """FedBuff (B = 1) with K = 8 clients in flight on f(x) = x^2 / 2, each client solving it exactly from its
    stale base (Delta = -base), every job one time unit long: staleness 7 in steady state. Returns |x| per round."""
    def solve(node, message):
        return trained_reply(message, ArrayRecord([np.zeros(1, np.float32)]))

    seen = []

    def evaluate(server_round, arrays):
        seen.append(abs(float(next(iter(arrays.values())).numpy()[0])))

    FedBuff(buffer_size=1, server_lr=server_lr, fraction_evaluate=0.0).start(
        FakeGrid(8, solve), ArrayRecord([np.ones(1, np.float32)]), num_rounds=12, clock="virtual", delays="uniform-speed",
        evaluate_fn=evaluate)
    return seen


def test_the_paced_step_converges_where_the_papers_step_diverges_under_staleness():
    # Execute: 12 rounds of 8 updates, each update a full step to the optimum from a 7-versions-old base
    paced, paper = run_stale_quadratic(0.0), run_stale_quadratic(1.0)
    # Assert: at eta_s = 1 every version overshoots by the stale distance and |x| grows without bound; at
    # B / K = 1/8 the model contracts towards the optimum, as FedAvg's rounds would
    assert paper[-1] > 100 * paper[0]
    assert paced[-1] < 0.05 * paced[0]
    assert max(paced[1:]) < 0.5 * paced[0]  # it overshoots (stale steps) but never back to where it started
