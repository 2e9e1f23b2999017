"""The default server step (the largest step staleness leaves stable) on hand-made deltas, and why it is the default."""

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord

from asyncfl import AFLDW, CA2FL, FADAS, FedBuff, FedFa
from asyncfl.strategies.base import Arrival
from asyncfl.strategies.pace import auto_buffer_size, paced_server_lr, per_update_share, update_delay
from tests.fake_grid import FakeGrid, trained_reply


def arrival(delta, client=0, staleness=0, base=None):
    base = np.zeros_like(np.asarray(delta, np.float32)) if base is None else np.asarray(base, np.float32)
    return Arrival(client, 0, staleness, base + np.asarray(delta, np.float32), base, 10, 0.5, 0.0)


def test_the_pace_is_the_stability_bound_of_the_update_delay():
    # d = K - 1 + (B - 1) / 2; g = sin(pi / (2 (2d + 1)))
    assert update_delay(8, 5) == 9.0 and update_delay(2, 1) == 1.0
    assert per_update_share(2) == pytest.approx(0.5)  # d = 1: sin(pi / 6)
    assert per_update_share(1) == pytest.approx(1.0)  # no staleness: the full step
    assert paced_server_lr(5, 8) == pytest.approx(5 * math.sin(math.pi / 38))  # 0.41
    assert 0.75 / 100 < per_update_share(100) < 1 / 100  # about 0.8 / K for large K: close to FedAvg's 1 / K
    assert paced_server_lr(5, 1) == 1.0  # never more than FedAvg's full step
    with pytest.raises(ValueError, match="concurrency"):
        per_update_share(0)


def test_fedbuff_default_step_follows_the_concurrency_and_the_papers_step_stays_a_keyword():
    # Prepare: K = 2 jobs in flight, B = 1 (d = 1, g = 1/2); then B = 2 (d = 1.5, g = sin(pi / 8))
    paced, paper = FedBuff(buffer_size=1), FedBuff(buffer_size=1, server_lr=1.0)
    for strategy in (paced, paper):
        strategy.on_start(num_clients=6, concurrency=2)
    # Execute / Assert: eta_s = 1/2 -> half the delta; the paper's eta_s = 1 -> the whole delta
    np.testing.assert_allclose(paced.on_arrival(arrival([4.0, -2.0]), np.zeros(2, np.float32)), [2.0, -1.0])
    np.testing.assert_allclose(paper.on_arrival(arrival([4.0, -2.0]), np.zeros(2, np.float32)), [4.0, -2.0])
    assert paced.summary()["server-lr"] == 0.5 and paper.summary()["server-lr"] == 1.0
    buffered = FedBuff(buffer_size=2)
    buffered.on_start(num_clients=6, concurrency=2)
    buffered.on_arrival(arrival([1.0]), np.zeros(1, np.float32))
    step = buffered.on_arrival(arrival([3.0]), np.zeros(1, np.float32))
    np.testing.assert_allclose(step, [2 * math.sin(math.pi / 8) / 2 * 4.0], rtol=1e-6)


def test_the_automatic_buffer_is_a_quarter_of_the_concurrency_within_two_and_ten():
    assert [auto_buffer_size(k) for k in (1, 2, 6, 8, 12, 20, 40, 1000)] == [1, 2, 2, 2, 3, 5, 10, 10]
    with pytest.raises(ValueError, match="concurrency=0 must be >= 1"):
        auto_buffer_size(0)


def test_fedbuff_default_buffer_follows_the_concurrency_and_an_explicit_one_is_kept():
    # Prepare: K = 12 jobs in flight -> B = 3; an explicit B = 5 stays 5
    auto, explicit = FedBuff(), FedBuff(buffer_size=5)
    for strategy in (auto, explicit):
        strategy.on_start(num_clients=20, concurrency=12)
    # Execute: three updates of 1, 2, 3
    steps = [auto.on_arrival(arrival([d]), np.zeros(1, np.float32)) for d in (1.0, 2.0, 3.0)]
    # Assert: the third closes the automatic buffer, stepping eta_s / 3 * 6 with eta_s = 3 g(12, 3)
    assert steps[:2] == [None, None]
    np.testing.assert_allclose(steps[2], [paced_server_lr(3, 12) / 3 * 6.0], rtol=1e-6)
    assert auto.summary()["buffer-size"] == 3 and explicit.summary()["buffer-size"] == 5
    assert all(explicit.on_arrival(arrival([1.0]), np.zeros(1, np.float32)) is None for _ in range(4))


def test_ca2fl_default_buffer_follows_the_concurrency():
    ca2fl = CA2FL()
    ca2fl.on_start(num_clients=12, concurrency=12)
    steps = [ca2fl.on_arrival(arrival([d], client=i), np.zeros(1, np.float32)) for i, d in enumerate((1.0, 2.0, 3.0))]
    # M = 3: the third arrival steps; h_bar = 0 at the first step, S = 6, eta = M g(d + 12 / 2 - 3 / 4) -> eta * 6 / 3
    assert steps[:2] == [None, None]
    np.testing.assert_allclose(steps[2], [paced_server_lr(3, 12, extra_delay=5.25) * 2.0], rtol=1e-6)
    assert ca2fl.summary()["buffer-size"] == 3


def test_afl_dw_and_ca2fl_default_steps_follow_the_concurrency():
    afl_dw = AFLDW()
    afl_dw.on_start(num_clients=10, concurrency=2)
    # tau = 0: beta = 0, so the step is g = 1/2 of the delta
    np.testing.assert_allclose(afl_dw.on_arrival(arrival([4.0, -8.0]), np.ones(2, np.float32)), [3.0, -3.0])
    ca2fl = CA2FL(buffer_size=2)
    ca2fl.on_start(num_clients=4, concurrency=2)
    ca2fl.on_arrival(arrival([2.0], client=0), np.zeros(1, np.float32))
    # first aggregation: h_bar = 0, S = 2 + 6; d = 1 + 1/2 plus the cache's lag 2/2 - 2/4 = 2, so
    # eta = M g = 2 sin(pi / 10) -> eta * 8 / 2
    np.testing.assert_allclose(ca2fl.on_arrival(arrival([6.0], client=1), np.zeros(1, np.float32)),
                               [2 * math.sin(math.pi / 10) * 4.0], rtol=1e-6)


def test_fedfa_default_window_is_half_the_concurrency():
    strategy = FedFa()
    strategy.on_start(num_clients=10, concurrency=5)
    assert strategy.queue_size == 3
    for value in (1.0, 2.0, 3.0, 4.0):
        model = strategy.on_arrival(arrival([0.0], base=[value]), np.zeros(1, np.float32))
    np.testing.assert_allclose(model, [3.0])  # mean of the last 3 client models (2, 3, 4)


def run_stale_quadratic(server_lr: float, overshoot: float = 1.0, pace: str = "stable", strategy=None) -> list[float]:
    """FedBuff (B = 1; or ``strategy``) with K = 8 clients in flight on f(x) = x^2 / 2; each client moves its
    stale base by ``-overshoot * base`` (1: to the optimum; up to 2 for a local optimizer that still converges on
    its own); every job one time unit long, so staleness is 7 in steady state; ``server_lr=0`` is the automatic
    step of ``pace``. Returns |x| after each round."""

    def train(node, message):
        base = next(iter(message.content["arrays"].values())).numpy()
        return trained_reply(message, ArrayRecord([(base * (1.0 - overshoot)).astype(np.float32)]))

    seen = []

    def evaluate(server_round, arrays):
        seen.append(abs(float(next(iter(arrays.values())).numpy()[0])))

    strategy = strategy or FedBuff(buffer_size=1, server_lr=server_lr, pace=pace, fraction_evaluate=0.0)
    strategy.start(
        FakeGrid(8, train), ArrayRecord([np.ones(1, np.float32)]), num_rounds=20, clock="virtual",
        delay_model="uniform-speed", evaluate_fn=evaluate, dispatch_hold=0.0)  # no hold: the delay stays 7 versions
    return seen


@pytest.mark.parametrize("overshoot", [1.0, 1.9])
def test_the_paced_step_converges_under_staleness_where_larger_steps_diverge(overshoot):
    # Execute: 20 rounds of 8 updates, each computed on a 7-versions-old model
    paced, fedavg_pace, paper = (run_stale_quadratic(lr, overshoot) for lr in (0.0, 1 / 8, 1.0))
    # Assert: the paper's eta_s = 1 diverges; the paced step (g = sin(pi/30) = 0.105) contracts for any client
    # gain below 2; FedAvg's pace 1/8 contracts for an exact client but diverges for one that overshoots
    assert paper[-1] > 100 * paper[0]
    if overshoot == 1.0:
        assert paced[-1] < 0.1 * paced[0] and fedavg_pace[-1] < 0.1 * fedavg_pace[0]
    else:  # at the edge of the stable region the paced step contracts slowly; 1/8 grows
        assert max(paced[-5:]) < 0.75 * paced[0]
        assert max(fedavg_pace[-5:]) > 2 * fedavg_pace[0]


def test_the_measured_pace_speeds_up_for_a_weak_client_response_and_stays_stable_for_an_overshooting_one():
    # Execute: the same stale quadratic; a client that moves 10 % of the way (small lr) and one that overshoots
    slow_measured, slow_stable = (run_stale_quadratic(0.0, 0.1, pace) for pace in ("measured", "stable"))
    fast_measured = run_stale_quadratic(0.0, 1.9, "measured")
    # Assert: with lambda = 0.1 the bound eases to its floor (1): twice the stable step, much faster convergence
    assert slow_measured[-1] < 0.2 * slow_stable[-1]
    # with lambda = 1.9 the bound stays at 2 (3 x 1.9 > 2): the stable pace, which contracts
    assert max(fast_measured[-5:]) < 0.75 * fast_measured[0]


def test_ca2fls_paced_step_allows_for_its_cache_where_fedbuffs_step_oscillates():
    # Execute: CA2FL with B = 2 at K = 8 on the stale quadratic, clients that overshoot (lambda = 1.9)
    paced = run_stale_quadratic(0.0, 1.9, strategy=CA2FL(buffer_size=2, pace="stable", fraction_evaluate=0.0))
    fedbuffs_step = run_stale_quadratic(0.0, 1.9, strategy=CA2FL(
        buffer_size=2, server_lr=paced_server_lr(2, 8), fraction_evaluate=0.0))
    # Assert: its cache re-applies each update until the client returns, a longer delay than FedBuff's: at
    # FedBuff's stable step (0.196) CA2FL grows, at its own (0.136, the cache's lag added) it contracts
    assert max(paced[-5:]) < 0.75 * paced[0]
    assert max(fedbuffs_step[-5:]) > 2 * fedbuffs_step[0]


def test_fadas_default_momentum_settles_under_staleness_where_the_papers_oscillates():
    # Execute: FADAS with B = 2 at K = 8 on the stale quadratic (exact clients), AMSGrad step 0.05
    default, paper = (run_stale_quadratic(0.0, 1.0, strategy=FADAS(buffer_size=2, server_lr=0.05, **momentum,
                                                                   fraction_evaluate=0.0))
                      for momentum in ({}, {"beta1": 0.9}))
    # Assert: the server momentum's lag adds to the staleness; with the default beta1 = 0.5 it settles near the
    # optimum, with the paper's 0.9 it still swings at a fifth of the start after 20 rounds
    assert max(default[-5:]) < 0.05
    assert max(paper[-5:]) > 0.1
