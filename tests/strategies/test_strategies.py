"""Hand-computed cases for the strategies' math."""

import math

import numpy as np
import pytest

from asyncfl.errors import ConfigError
from asyncfl.strategies import AFLDW, Arrival, FedAsync, FedAvg, FedBuff
from asyncfl.strategies.registry import strategy_class
from asyncfl.strategies.afl_dw import afl_dw_step
from asyncfl.strategies.fedasync import fedasync_mix
from asyncfl.strategies.fedavg import weighted_mean_delta
from asyncfl.strategies.fedbuff import compensated_delta, fedbuff_step, fedbuff_weight
from asyncfl.strategies.staleness import (
    beta_schedule, cosine_beta, fedasync_staleness, hinge_staleness, linear_beta, polynomial_staleness,
)


def arrival(weights, base, staleness=0, n=10):
    return Arrival(0, 0, staleness, np.asarray(weights, np.float32), np.asarray(base, np.float32), n, 0.1, 0.0)


def test_polynomial_staleness():
    assert polynomial_staleness(0, 0.5) == 1.0
    assert polynomial_staleness(3, 0.5) == pytest.approx(0.5)  # (3+1)^-0.5


def test_hinge_staleness():
    assert hinge_staleness(4, a=10, b=4) == 1.0
    assert hinge_staleness(6, a=10, b=4) == pytest.approx(1 / 21)


def test_unknown_staleness_function_names_valid_ones():
    with pytest.raises(ValueError, match="constant, polynomial, hinge"):
        fedasync_staleness("cubic", 1, 0.5, 4)


def test_cosine_beta_endpoints_and_midpoint():
    assert cosine_beta(0, 150) == 0.0
    assert cosine_beta(75, 150) == pytest.approx(0.5)
    assert cosine_beta(150, 150) == pytest.approx(1.0)
    assert cosine_beta(400, 150) == pytest.approx(1.0)
    # 1 - 0.5 * (1 + cos(pi * tau / 150)) at tau = 50
    assert cosine_beta(50, 150) == pytest.approx(1 - 0.5 * (1 + math.cos(math.pi / 3)))


def test_linear_and_constant_beta():
    assert linear_beta(30, 60) == 0.5
    assert linear_beta(90, 60) == 1.0
    assert beta_schedule("constant", 99, 10, 0.75) == 0.75
    assert beta_schedule("step", 4, 10, 0.5) == 0.0 and beta_schedule("step", 5, 10, 0.5) == 1.0
    with pytest.raises(ValueError, match="cosine, linear, step, constant"):
        beta_schedule("sigmoid", 1, 10, 0.5)


def test_negative_staleness_is_rejected():
    with pytest.raises(ValueError):
        cosine_beta(-1, 10)


def test_fedasync_mix_by_hand():
    out = fedasync_mix(np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32), 0.25)
    assert np.allclose(out, [1.5, 3.0])


def test_fedasync_uses_alpha_times_staleness():
    strategy = FedAsync(alpha=0.5, staleness="polynomial", staleness_decay=1.0)
    # tau=1 -> s=1/2 -> alpha_t = 0.25; current [0], client [4] -> 1
    new = strategy.on_arrival(arrival([4.0], [0.0], staleness=1), np.array([0.0], np.float32))
    assert np.allclose(new, [1.0])


def test_fedbuff_step_by_hand():
    out = fedbuff_step(np.array([1.0], np.float32), np.array([6.0], np.float32), 3, 0.5)
    assert np.allclose(out, [2.0])  # 1 + 0.5/3 * 6


def test_fedbuff_aggregates_only_when_buffer_is_full():
    strategy = FedBuff(buffer_size=2, server_lr=1.0)
    current = np.array([0.0, 0.0], np.float32)
    assert strategy.on_arrival(arrival([1.0, 2.0], [0.0, 0.0]), current) is None
    new = strategy.on_arrival(arrival([3.0, 4.0], [0.0, 0.0]), current)
    assert np.allclose(new, [2.0, 3.0])  # mean delta
    assert strategy.buffered == 0 and strategy.aggregations == 1


def test_fedbuff_delta_is_relative_to_the_jobs_base_not_the_current_model():
    strategy = FedBuff(buffer_size=1, server_lr=1.0)
    new = strategy.on_arrival(arrival([5.0], [4.0], staleness=3), np.array([10.0], np.float32))
    assert np.allclose(new, [11.0])


def test_fedbuff_sqrt_staleness_weight():
    assert fedbuff_weight(3, "sqrt") == pytest.approx(0.5)
    strategy = FedBuff(buffer_size=1, server_lr=1.0, staleness_weighting="sqrt")
    new = strategy.on_arrival(arrival([2.0], [0.0], staleness=3), np.array([0.0], np.float32))
    assert np.allclose(new, [1.0])


def test_compensated_delta_is_the_update_from_the_current_model_for_a_linear_client():
    # a client that moves half way to its optimum 10: from 0 it sends 5; the server is at 4 by then, from
    # where the same client would have sent 0.5 * (10 - 4) = 3
    delta = compensated_delta(np.array([5.0], np.float32), np.array([0.0], np.float32),
                              np.array([4.0], np.float32), 0.5)
    assert np.allclose(delta, [3.0])


def test_fedbuff_compensates_with_the_measured_response_once_the_meter_reads_one():
    def client(base):  # one client, the linear response 0.5 toward 10 on both entries
        base = np.asarray(base, np.float32)
        return Arrival(0, int(base[0] * 100), 1, base + 0.5 * (10.0 - base), base, 10, 0.1, 0.0)

    strategy = FedBuff(buffer_size=1, server_lr=0.0, compensation="response")
    strategy.on_start(4, concurrency=4)
    plain = FedBuff(buffer_size=1, server_lr=0.0)
    plain.on_start(4, concurrency=4)
    lr = strategy.server_lr
    current = np.array([4.0, 4.0], np.float32)
    # before the meter has 5 pairs: the plain delta (5 from base 0)
    assert np.allclose(strategy.on_arrival(client([0.0, 0.0]), current), current + lr * 5.0)
    plain.on_arrival(client([0.0, 0.0]), current)
    for start in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):  # pairs from different start models: the meter reads 0.5
        strategy.on_arrival(client([start, start]), current)
        plain.on_arrival(client([start, start]), current)
    assert strategy.response_meter.response == pytest.approx(0.5)
    assert strategy.server_lr == pytest.approx(plain.server_lr)  # the step itself is the measured pace's
    # a stale update from 0 now counts as the update from 4: 0.5 * (10 - 4) = 3, not 5 (the step as the meter
    # reads after this arrival's pair)
    compensated, uncompensated = strategy.on_arrival(client([0.0, 0.0]), current), plain.on_arrival(
        client([0.0, 0.0]), current)
    assert np.allclose(compensated, current + strategy.server_lr * 3.0)
    assert np.allclose(uncompensated, current + plain.server_lr * 5.0)


def test_fedbuff_compensation_needs_the_measured_pace():
    with pytest.raises(ValueError, match="compensation.*needs pace='measured'"):
        FedBuff(compensation="response", pace="stable")
    with pytest.raises(ValueError, match="compensation.*needs pace='measured'"):
        FedBuff(compensation="response", server_lr=1.0)


def test_fedbuff_rejects_bad_buffer():
    with pytest.raises(ValueError, match="buffer-size"):
        FedBuff(buffer_size=-1)


def test_weighted_mean_delta_by_examples():
    out = weighted_mean_delta([np.array([1.0], np.float32), np.array([4.0], np.float32)], [1, 2])
    assert np.allclose(out, [3.0])


def test_fedavg_aggregates_at_round_end_with_server_lr():
    strategy = FedAvg(server_lr=2.0)
    current = np.array([1.0], np.float32)
    assert strategy.on_arrival(arrival([2.0], [1.0], n=1), current) is None
    assert strategy.on_arrival(arrival([5.0], [1.0], n=3), current) is None
    # weighted mean delta = (1*1 + 3*4)/4 = 3.25 ; 1 + 2 * 3.25
    assert np.allclose(strategy.on_round_end(current), [7.5])
    assert strategy.on_round_end(current) is None


def test_afl_dw_step_by_hand():
    assert np.allclose(afl_dw_step(np.array([1.0], np.float32), np.array([2.0], np.float32), 0.5, 0.25), [1.75])


def test_afl_dw_downweights_by_one_minus_beta():
    strategy = AFLDW(server_lr=1.0, beta="linear", max_staleness=4)
    new = strategy.on_arrival(arrival([4.0], [0.0], staleness=1), np.array([0.0], np.float32))
    assert np.allclose(new, [3.0])  # (1 - 1/4) * 4


def test_registry_unknown_name():
    # the same class and wording as the run-config parser's for the same mistake; still a ValueError
    with pytest.raises(ConfigError, match="strategy='fedprox' is not valid; choose one of: afl-dw, asyn-tiers, ca2fl, dc-asgd"):
        strategy_class("fedprox")
    assert issubclass(ConfigError, ValueError)
