"""Baselines of the gradient-inversion paper: hand-computed small cases."""

import math

import numpy as np
import pytest

from asyncfl.errors import MissingClientInfo
from asyncfl.simulation.intertwined import IntertwinedDelays, IntertwinedSampler, most_holding
from asyncfl.strategies.base import Arrival
from asyncfl.strategies.stale_compensation import (DCASGD, AsynTiers, StaleWeighted, dc_asgd_compensation,
                                                   sigmoid_staleness_weight)


def _arrival(client, staleness, delta, base, n=10):
    base = np.asarray(base, np.float32)
    return Arrival(client, 5 - staleness, staleness, base + np.asarray(delta, np.float32), base, n, 0.0, 0.0)


def test_dc_asgd_on_three_elements():
    delta = np.array([1.0, -2.0, 0.5], np.float32)
    current, base = np.array([0.1, 0.2, -0.4], np.float32), np.zeros(3, np.float32)
    # Delta - lambda * Delta^2 * (w^t - w^{t-tau}) with lambda = 4
    np.testing.assert_allclose(dc_asgd_compensation(delta, current, base, 4.0), [0.6, -5.2, 0.9], rtol=1e-6)
    np.testing.assert_array_equal(dc_asgd_compensation(delta, current, base, 0.0), delta)


def test_dc_asgd_strategy_compensates_only_stale_updates():
    strategy = DCASGD(server_lr=1.0, compensation_strength=4.0)
    current = np.array([0.1, 0.2, -0.4], np.float32)
    fresh = _arrival(0, 0, [1.0, 1.0, 1.0], current)
    stale = _arrival(1, 2, [1.0, -2.0, 0.5], np.zeros(3))
    for a in (fresh, stale):
        strategy.on_arrival(a, current)
    new = strategy.on_round_end(current)
    np.testing.assert_allclose(new, current + 0.5 * (np.ones(3) + np.array([0.6, -5.2, 0.9])), rtol=1e-5)


def test_sigmoid_staleness_weight():
    assert sigmoid_staleness_weight(10, 0.25, 10.0) == 0.5
    assert sigmoid_staleness_weight(0, 0.25, 10.0) == pytest.approx(1.0 / (1.0 + math.exp(-2.5)))
    assert sigmoid_staleness_weight(10_000, 0.25, 10.0) == 0.0


def test_stale_weighted_multiplies_sample_counts_by_the_staleness_weight():
    strategy = StaleWeighted(server_lr=1.0, steepness=0.25, midpoint=10.0)
    current = np.zeros(1, np.float32)
    for a in (_arrival(0, 10, [1.0], current, n=10), _arrival(1, 0, [0.0], current, n=10)):
        strategy.on_arrival(a, current)
    w_stale, w_fresh = 0.5, 1.0 / (1.0 + math.exp(-2.5))
    assert strategy.on_round_end(current)[0] == pytest.approx(w_stale / (w_stale + w_fresh), rel=1e-6)


def test_asyn_tiers_averages_inside_tiers_then_weights_tiers_by_client_count():
    strategy = AsynTiers(server_lr=1.0, boundary=0)
    current = np.zeros(1, np.float32)
    arrivals = [_arrival(0, 0, [1.0], current, n=10), _arrival(1, 0, [4.0], current, n=30),
                _arrival(2, 3, [-2.0], current, n=5)]
    for a in arrivals:
        strategy.on_arrival(a, current)
    # tier 0: (10*1 + 30*4)/40 = 3.25 over 2 clients; tier 1: -2 over 1 client -> (2*3.25 - 2)/3
    assert strategy.on_round_end(current)[0] == pytest.approx((2 * 3.25 - 2.0) / 3.0)


def test_intertwined_delays_pick_the_biggest_holders_of_the_class():
    counts = np.array([[0, 3], [0, 9], [0, 9], [0, 1]])
    assert list(most_holding(counts, 1, 2)) == [1, 2]
    sampler = IntertwinedSampler(IntertwinedDelays(affected_class=1, delayed_clients=1, staleness=4, on_time=0.8), 0)
    with pytest.raises(RuntimeError, match="bind_clients"):
        sampler.job_duration(0)
    with pytest.raises(MissingClientInfo, match="label counts"):
        sampler.bind_clients([1, 1, 1, 1], None)
    sampler.bind_clients([3, 9, 9, 1], counts.tolist())
    assert [sampler.job_duration(c) for c in range(4)] == [0.8, 4.5, 0.8, 0.8]  # tie at 9: lower index
    with pytest.raises(ValueError, match="staleness"):
        IntertwinedDelays(staleness=0)


def test_w_pred_sends_late_clients_a_look_ahead_and_compensates_from_it():
    from asyncfl.strategies.stale_compensation import WPred

    strategy = WPred(server_lr=1.0, compensation_strength=0.0, step_average_decay=0.5)
    current = np.zeros(2, np.float32)
    assert strategy.dispatch_model(3, current) is None  # nothing known yet
    for arrival in (_arrival(3, 2, [1.0, 1.0], current), _arrival(4, 0, [1.0, 1.0], current)):
        strategy.on_arrival(arrival, current)
    new = strategy.on_round_end(current)  # step of +1 everywhere
    np.testing.assert_allclose(new, [1.0, 1.0])
    # client 3 was 2 versions late: it gets w + 2 * (bias-corrected average step = 1)
    np.testing.assert_allclose(strategy.dispatch_model(3, new), [3.0, 3.0])
    assert strategy.dispatch_model(4, new) is None  # on-time clients get the global model
    assert strategy.summary()["predicted-dispatches"] == 1


def test_engine_sends_the_strategys_dispatch_model_and_uses_it_as_the_base():
    from collections import OrderedDict

    from asyncfl.options import RunOptions
    from asyncfl.server_app.codec import ModelCodec
    from asyncfl.server_app.engine import AsyncEngine
    from asyncfl.strategies.base import Strategy
    from tests.fake_grid import FakeGrid, trained_reply
    from tests.server_app.test_engine import engine_config

    codec = ModelCodec.from_state(OrderedDict(w=np.zeros(2, np.float32)))

    class LookAhead(Strategy):
        def __init__(self):
            self.bases = []

        def dispatch_model(self, client, current):
            return current + 10.0 if client == 0 else None

        def on_arrival(self, arrival, current):
            self.bases.append((arrival.client_index, arrival.base.tolist(), arrival.delta.tolist()))
            return None

    def plus_one(node, message):
        return trained_reply(message, codec.to_record(codec.decode(message.content.array_records["arrays"]) + 1.0))

    strategy = LookAhead()
    config = engine_config(strategy, max_arrivals=2, delay_model="uniform-speed", seed=RunOptions().seed,
                           concurrency=2)  # checked as Strategy.start checks them
    AsyncEngine(FakeGrid(2, plus_one), strategy, codec, np.zeros(2, np.float32), config, {},
                lambda m: (0.0, 0.0)).run()
    assert sorted(strategy.bases) == [(0, [10.0, 10.0], [1.0, 1.0]), (1, [0.0, 0.0], [1.0, 1.0])]
