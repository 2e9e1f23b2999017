"""Hand-computed cases for CA2FL, FADAS and FedFa on 2-3 element arrays."""

import numpy as np
import pytest

from asyncfl.strategies import CA2FL, FADAS, Arrival, FedFa
from asyncfl.strategies.registry import strategy_class
from asyncfl.strategies.fadas import AMSGrad, delay_adaptive_lr
from asyncfl.strategies.pace import paced_server_lr


def arrival(client, weights, base, staleness=0):
    return Arrival(client, 0, staleness, np.asarray(weights, np.float32), np.asarray(base, np.float32), 10, 0.1, 0.0)


def test_ca2fl_first_round_has_no_calibration_then_uses_cache():
    strategy = CA2FL(buffer_size=2, server_lr=1.0)
    strategy.on_start(num_clients=2)
    zero = np.zeros(2, np.float32)
    # Round 1: clients 0 and 1 send deltas [2, 0] and [0, 4]; no cache yet, h_bar = 0.
    assert strategy.on_arrival(arrival(0, [2, 0], zero), zero) is None
    x1 = strategy.on_arrival(arrival(1, [0, 4], zero), zero)
    assert np.allclose(x1, [1.0, 2.0])  # 0 + (0 + ([2,0] + [0,4]) / 2)
    # h_bar refreshed = mean over N=2 cached updates = [1, 2].
    # Round 2: client 0 sends [4, 0] twice (S = ([4,0]-[2,0]) + ([4,0]-[4,0]) = [2, 0]).
    assert strategy.on_arrival(arrival(0, [5, 2], [1, 2]), x1) is None
    x2 = strategy.on_arrival(arrival(0, [5, 2], [1, 2]), x1)
    assert np.allclose(x2, x1 + np.array([1, 2]) + np.array([2, 0]) / 2)  # [3, 4]
    assert strategy.summary()["cache-clients"] == 2
    assert strategy.cache_bytes == 2 * 2 * 4


def test_ca2fl_h_bar_averages_over_all_clients_not_only_reporters():
    strategy = CA2FL(buffer_size=1, server_lr=1.0)
    strategy.on_start(num_clients=4)
    zero = np.zeros(1, np.float32)
    x1 = strategy.on_arrival(arrival(0, [4], zero), zero)
    assert np.allclose(x1, [4.0])
    # h_bar = [4] / 4 clients = [1]; next arrival from a new client, delta [0]: S = 0 - 0.
    x2 = strategy.on_arrival(arrival(1, [4], [4]), x1)
    assert np.allclose(x2, [5.0])


def test_fadas_delay_adaptive_lr():
    assert delay_adaptive_lr(0.1, tau_max=3, tau_c=5) == 0.1
    assert delay_adaptive_lr(0.1, tau_max=10, tau_c=5) == pytest.approx(0.01)


def test_amsgrad_direction_by_hand():
    opt = AMSGrad(beta1=0.5, beta2=0.5, eps=0.0)
    # m = 0.5 * 2 = 1 ; v = 0.5 * 4 = 2 ; v_hat = 2 ; step = 1 / sqrt(2)
    assert np.allclose(opt.direction(np.array([2.0], np.float32)), [1 / np.sqrt(2)])
    # m = 0.5 + 0 = 0.5 ; v = 1 ; v_hat stays 2 (AMSGrad max) ; step = 0.5 / sqrt(2)
    assert np.allclose(opt.direction(np.array([0.0], np.float32)), [0.5 / np.sqrt(2)])


def test_fadas_buffers_then_steps_with_reduced_lr_for_stale_buffers():
    strategy = FADAS(buffer_size=2, server_lr=1.0, beta1=0.0, beta2=0.0, epsilon=1e-12, staleness_threshold=2)
    zero = np.zeros(2, np.float32)
    assert strategy.on_arrival(arrival(0, [2, -4], zero, staleness=1), zero) is None
    new = strategy.on_arrival(arrival(1, [2, -4], zero, staleness=4), zero)
    # beta1 = beta2 = 0: direction = Delta / |Delta| = sign; lr = 1 / tau_max = 1/4.
    assert np.allclose(new, [0.25, -0.25])
    assert strategy.summary()["delay-reduced-steps"] == 1


def test_fadas_default_buffer_follows_the_concurrency():
    # Prepare: 12 jobs in flight -> M = 12 // 4 = 3
    strategy = FADAS(server_lr=1.0, beta1=0.0, beta2=0.0, epsilon=1e-12)
    strategy.on_start(num_clients=20, concurrency=12)
    zero = np.zeros(1, np.float32)
    # Execute / Assert: the third arrival steps, by the sign of the mean delta (beta = 0, tau <= tau_c)
    assert [strategy.on_arrival(arrival(i, [d], zero), zero) for i, d in enumerate((1.0, 2.0))] == [None, None]
    assert np.allclose(strategy.on_arrival(arrival(2, [-6.0], zero), zero), [-1.0])
    assert strategy.summary()["buffer-size"] == 3


def test_fadas_moves_batchnorm_statistics_by_the_mean_update_not_by_amsgrad():
    # Prepare: entry 0 a weight, entry 1 a running mean (not trained); K = 8, B = 2
    g = paced_server_lr(2, 8)
    strategy = FADAS(buffer_size=2, server_lr=0.01, beta1=0.0, beta2=0.0, epsilon=1e-12)
    strategy.trained_entries = np.array([True, False])
    strategy.on_start(num_clients=8, concurrency=8)
    zero = np.zeros(2, np.float32)
    # Execute
    strategy.on_arrival(arrival(0, [3.0, 3.0], zero), zero)
    new = strategy.on_arrival(arrival(1, [1.0, 1.0], zero), zero)
    # Assert: the weight takes AMSGrad's step (sign * lr), the statistic g times the mean delta 2
    assert np.allclose(new, [0.01, 2.0 * g], rtol=1e-5)


def test_fedfa_averages_the_most_recent_models():
    strategy = FedFa(queue_size=2)
    zero = np.zeros(1, np.float32)
    assert np.allclose(strategy.on_arrival(arrival(0, [2], zero), zero), [2.0])
    assert np.allclose(strategy.on_arrival(arrival(1, [4], zero), zero), [3.0])
    # Queue full: [2] is dropped, the mean of [4] and [10] is 7.
    assert np.allclose(strategy.on_arrival(arrival(2, [10], zero), zero), [7.0])


def test_fedfa_running_sum_stays_exact_over_many_arrivals():
    strategy = FedFa(queue_size=3)
    rng = np.random.default_rng(0)
    models = [rng.normal(size=4).astype(np.float32) for _ in range(200)]
    for i, model in enumerate(models):
        out = strategy.on_arrival(arrival(i, model, np.zeros(4, np.float32)), np.zeros(4, np.float32))
    assert np.allclose(out, np.mean(models[-3:], axis=0), atol=1e-5)


@pytest.mark.parametrize("name,params,message", [
    ("ca2fl", {"buffer_size": -1}, "ca2fl.buffer-size"),
    ("fadas", {"buffer_size": -1}, "fadas.buffer-size"),
    ("fedfa", {"queue_size": -1}, "fedfa.queue-size"),
])
def test_bad_sizes_are_rejected(name, params, message):
    with pytest.raises(ValueError, match=message):
        strategy_class(name)(**params)
