"""Differential privacy for asynchronous strategies: clipping, noise at each step, per-client accounting."""

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from asyncfl import DifferentialPrivacyServerSideFixedClipping as DP
from asyncfl import FedAsync, FedAvg, FedBuff
from asyncfl.errors import ConfigError
from asyncfl.strategies.accounting import ClientPrivacyLedger, epsilon_from_rdp
from asyncfl.strategies.arrival import Arrival
from tests.fake_grid import FakeGrid, trained_reply

# Google's dp_accounting 0.6.0 (RdpAccountant, GaussianDpEvent composed `count` times), computed once
DP_ACCOUNTING = [(1.0, 1, 1e-5, 4.728507067217623), (1.0, 10, 1e-5, 19.05359753163139),
                 (2.0, 100, 1e-5, 35.08175401905626), (0.5, 4, 1e-6, 27.816071630016364),
                 (5.0, 1000, 1e-5, 48.80169282486775)]


@pytest.mark.parametrize("sigma, count, delta, reference", DP_ACCOUNTING)
def test_epsilon_matches_googles_rdp_accountant(sigma, count, delta, reference):
    """Same conversion, minimised over a finer grid of orders: never above, within 0.1 %."""
    ours = epsilon_from_rdp(count, sigma, delta)
    assert ours <= reference + 1e-9 and ours == pytest.approx(reference, rel=1e-3)


def test_epsilon_edge_cases():
    assert epsilon_from_rdp(0.0, 1.0, 1e-5) == 0.0
    assert epsilon_from_rdp(3.0, 0.0, 1e-5) == math.inf


def test_a_client_twice_in_one_step_counts_four_times_once_in_each_of_two_steps_twice():
    ledger = ClientPrivacyLedger(1.0, 1e-5)
    ledger.compose({0: 2.0, 1: 1.0})
    ledger.compose({1: 1.0})
    assert ledger.rho == {0: 4.0, 1: 2.0} and ledger.worst_rho == 4.0 and ledger.releases == 2
    assert ledger.epsilon() == pytest.approx(epsilon_from_rdp(4.0, 1.0, 1e-5))


def arrival(client, delta, tau=0) -> Arrival:
    base = np.zeros(len(delta), np.float32)
    return Arrival(client, 0, tau, base + np.asarray(delta, np.float32), base, 1, 0.0, 0.0)


def test_updates_are_clipped_and_each_step_gets_noise_of_sigma_c_times_the_step_coefficient():
    inner = FedBuff(buffer_size=2, server_lr=1.0)
    dp = DP(inner, noise_multiplier=0.5, clipping_norm=1.0, seed=3)
    dp.on_start(4, concurrency=2)
    current = np.zeros(20000, np.float32)
    big = np.zeros(20000, np.float32)
    big[0] = 10.0
    assert dp.clip(arrival(0, big)).delta[0] == pytest.approx(1.0)
    assert dp.on_arrival(arrival(0, big), current) is None
    new = dp.on_arrival(arrival(0, big), current)  # the same client twice in the buffer: k = 2
    noise = new.copy()
    noise[0] -= 1.0  # (1 + 1) / 2: the clipped updates' mean
    assert noise.std() == pytest.approx(0.5 * 1.0 * 0.5, rel=0.03)  # sigma C eta/B
    assert dp.ledger.rho == {0: 4.0}
    assert dp.summary()["dp-epsilon"] == pytest.approx(epsilon_from_rdp(4.0, 0.5, 1e-5), rel=1e-5)


def test_fedasync_steps_are_noised_at_their_mixing_weight():
    dp = DP(FedAsync(alpha=0.5, staleness="constant"), noise_multiplier=2.0, clipping_norm=0.1, seed=1)
    dp.on_start(2)
    new = dp.on_arrival(arrival(1, np.zeros(20000)), np.zeros(20000, np.float32))
    assert new.std() == pytest.approx(2.0 * 0.1 * 0.5, rel=0.03)
    assert dp.ledger.rho == {1: 1.0}


@pytest.mark.parametrize("strategy, says", [
    (lambda: FedAvg(), "not a weighted sum"),
    (lambda: FedBuff(), "pace='measured'"),
    (lambda: FedBuff(server_lr=1.0, aggregation="median"), "order statistics"),
])
def test_strategies_whose_step_noise_cannot_cover_are_refused(strategy, says):
    with pytest.raises(ConfigError, match=says):
        DP(strategy(), noise_multiplier=1.0, clipping_norm=1.0)


def test_the_adaptive_bound_cannot_be_asked_for_under_dp():
    dp = DP(FedBuff(server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0)
    with pytest.raises(ConfigError, match="update_norm_bound=3"):
        dp.start(FakeGrid(2, None), ArrayRecord({"w": Array(np.zeros(2, np.float32))}), update_norm_bound=3.0)


def _learner(node, message):
    w = message.content.array_records["arrays"]["w"].numpy()
    return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(0.2) * (np.float32(1.0) - w))}))


def _run(seed=2):
    dp = DP(FedBuff(buffer_size=4, server_lr=1.0, fraction_evaluate=0.0), noise_multiplier=1.0, clipping_norm=0.5,
            seed=seed)
    result = dp.start(FakeGrid(8, _learner), ArrayRecord({"w": Array(np.zeros(64, np.float32))}), num_rounds=0,
                      train_config=ConfigRecord({}), clock="virtual", delays="fedrevive-default", seed=1,
                      max_arrivals=80, concurrency=4)
    return result


def test_a_private_run_learns_reports_epsilon_and_repeats_under_its_seed():
    result = _run()
    summary = result.summary
    assert summary["dp-releases"] == summary["server-versions"] == 20
    assert summary["dp-epsilon"] > 0 and "update-norm-bound" not in summary  # the fixed clip replaces it
    assert summary["dp-epsilon"] == pytest.approx(epsilon_from_rdp(summary["dp-most-participations"], 1.0, 1e-5),
                                                  rel=1e-5)
    w = result.arrays["w"].numpy()
    assert np.linalg.norm(w - 1.0) < 0.6 * np.linalg.norm(np.ones(64))  # it moved toward the target despite noise
    assert np.array_equal(w, _run().arrays["w"].numpy())


def test_state_round_trip_gives_the_same_noise_and_ledger():
    def fresh():
        dp = DP(FedBuff(buffer_size=2, server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0, seed=5)
        dp.on_start(4, concurrency=2)
        return dp

    first, current = fresh(), np.zeros(8, np.float32)
    first.on_arrival(arrival(0, np.ones(8)), current)
    saved = first.state_dict()
    resumed = fresh()
    resumed.load_state_dict(saved)
    a, b = (s.on_arrival(arrival(1, np.ones(8)), current) for s in (first, resumed))
    assert np.array_equal(a, b) and first.ledger.rho == resumed.ledger.rho == {0: 1.0, 1: 1.0}


# ------------------------------------------------------------------------------------- clipping on the clients
def _client_side_run(with_mod: bool):
    from flwr.app import Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.clientapp.mod import fixedclipping_mod

    from asyncfl import DifferentialPrivacyClientSideFixedClipping
    from asyncfl.simulation.inprocess import InProcessGrid

    app = ClientApp(mods=[fixedclipping_mod] if with_mod else [])

    @app.train()
    def train(msg, context):  # a step of 2 per weight toward 1: norm 16 over 64 weights, far beyond the clip
        w = msg.content["arrays"]["w"].numpy()
        trained = ArrayRecord({"w": Array((w + np.float32(2.0)).astype(np.float32))})
        return Message(RecordDict({"arrays": trained, "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    dp = DifferentialPrivacyClientSideFixedClipping(FedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.0),
                                                    noise_multiplier=0.1, clipping_norm=0.5, seed=1)
    grid = InProcessGrid(app, 4, {})
    result = dp.start(grid, ArrayRecord({"w": Array(np.zeros(64, np.float32))}), num_rounds=0,
                      train_config=ConfigRecord({}), clock="virtual", delays="uniform-speed", seed=1,
                      max_arrivals=8, concurrency=2)
    return result.summary


def test_client_side_clipping_sends_the_norm_flowers_mod_clips_to_and_the_server_checks_it():
    with_mod = _client_side_run(with_mod=True)
    assert with_mod["dp-clipped-by-server"] == 0 and with_mod["dp-releases"] == 4 and with_mod["dp-epsilon"] > 0
    without = _client_side_run(with_mod=False)  # a ClientApp without the mod: the server clips every update
    assert without["dp-clipped-by-server"] == 8 and without["dp-epsilon"] == with_mod["dp-epsilon"]
