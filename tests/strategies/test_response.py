"""The measured client response (a secant along the server's moves) on hand-made arrivals."""

import numpy as np
import pytest

from asyncfl import FedBuff
from asyncfl.strategies.base import Arrival
from asyncfl.strategies.pace import BOUND_EASING, RESPONSE_FLOOR, RESPONSE_SAFETY, ResponseMeter, paced_server_lr


def arrival(version, base, delta, client=0):
    base = np.asarray(base, np.float32)
    return Arrival(client, version, 0, base + np.asarray(delta, np.float32), base, 10, 0.5, 0.0)


def test_two_updates_from_different_models_measure_the_response_along_the_move():
    # Prepare: clients answer Delta(x) = -0.5 x + c (a linear response plus a constant pull c)
    meter = ResponseMeter(min_pairs=1)
    c = np.array([0.3, -0.1], np.float32)
    # Execute: x_b = (0, 0) at version 0, then x_a = (1, 2) at version 1
    meter.observe(arrival(0, [0, 0], c))
    meter.observe(arrival(1, [1, 2], -0.5 * np.array([1, 2], np.float32) + c))
    # Assert: s = (1, 2), y = (-0.5, -1); -<y, s> / <s, s> = 2.5 / 5
    assert meter.response == pytest.approx(0.5)
    assert (meter.numerator, meter.denominator, meter.pairs) == (pytest.approx(2.5), pytest.approx(5.0), 1)


def test_each_update_is_paired_with_its_own_clients_previous_one_from_another_model():
    meter = ResponseMeter(min_pairs=1)
    meter.observe(arrival(0, [0.0], [0.0], client=1))
    meter.observe(arrival(0, [0.0], [5.0], client=2))  # another client: no pair
    meter.observe(arrival(1, [2.0], [-2.0], client=1))  # pairs with client 1's job from version 0: s = 2, y = -2
    assert (meter.pairs, meter.response) == (1, pytest.approx(1.0))
    meter.observe(arrival(1, [2.0], [-1.0], client=1))  # same start model as its previous job: no pair, replaces it
    meter.observe(arrival(2, [4.0], [-3.0], client=1))  # pairs with the job above: s = 2, y = -2
    assert meter.pairs == 2
    assert meter.response == pytest.approx(1.0)
    assert ResponseMeter().response is None  # fewer than min_pairs pairs: no estimate


def test_clients_with_different_optima_read_their_response_where_pairs_across_clients_would_not():
    # Prepare: two clients answer Delta_c(x) = -0.5 (x - x_c*) with optima 4 apart; client 1 starts 0.1 off client 0
    optimum = {0: np.array([2.0, 0.0]), 1: np.array([-2.0, 0.0])}
    meter = ResponseMeter(min_pairs=1)
    for step, x in enumerate([[0.0, 0.0], [0.5, 0.2], [1.0, 0.4], [1.5, 0.1]]):
        for client in (0, 1):
            start = np.asarray(x) + 0.1 * client
            meter.observe(arrival(2 * step + client, start, -0.5 * (start - optimum[client]), client=client))
    # Assert: every pair is one client's two jobs, and each reads 0.5
    assert meter.pairs == 6 and meter.response == pytest.approx(0.5, rel=1e-5)
    # a pair across the clients (client 1 at x + 0.1 against client 0 at x) would read the optima's difference
    s, y = np.array([0.1, 0.1]), -0.5 * np.array([0.1, 0.1]) + 0.5 * (optimum[1] - optimum[0])
    assert -np.dot(y, s) / np.dot(s, s) == pytest.approx(10.5)


def test_the_meter_forgets_the_least_recently_seen_client_beyond_its_capacity():
    meter = ResponseMeter(min_pairs=1, tracked_clients=2)
    for client in (0, 1, 2):  # client 0 is forgotten when client 2 comes
        meter.observe(arrival(0, [0.0], [0.0], client=client))
    meter.observe(arrival(1, [1.0], [-1.0], client=0))
    assert meter.pairs == 0
    meter.observe(arrival(1, [1.0], [-1.0], client=2))
    assert meter.pairs == 1 and sorted(meter._jobs) == [0, 2]
    with pytest.raises(ValueError, match="tracked_clients"):
        ResponseMeter(tracked_clients=0)


def test_a_large_model_is_measured_on_a_fixed_subset_of_its_trained_entries(monkeypatch):
    import asyncfl.strategies.pace as response

    monkeypatch.setattr(response, "MEASURED_ENTRIES", 50)
    meter = ResponseMeter(min_pairs=1)
    rng = np.random.default_rng(3)
    x0, x1 = rng.normal(size=400).astype(np.float32), rng.normal(size=400).astype(np.float32)
    meter.observe(arrival(0, x0, -0.25 * x0))
    meter.observe(arrival(1, x1, -0.25 * x1))
    assert meter._jobs[0][1].size == 50  # 50 entries kept per job, not 400
    assert meter.response == pytest.approx(0.25, rel=1e-5)  # a uniform response reads the same on any subset


def test_the_bound_rises_at_once_and_eases_down_by_a_bounded_factor_per_pair():
    meter = ResponseMeter(min_pairs=1)
    for version in range(1, 4):  # lambda = 0.05: the target is the floor
        meter.observe(arrival(version - 1, [version - 1.0], [-0.05 * (version - 1.0)]))
        meter.observe(arrival(version, [float(version)], [-0.05 * version]))
    assert meter.response == pytest.approx(0.05)
    assert meter.bound == pytest.approx(2.0 / BOUND_EASING ** meter.pairs)
    assert meter.bound > RESPONSE_FLOOR
    # a strong response (lambda = 1) sets the bound to min(2, 3 x lambda) on the next pairs
    meter = ResponseMeter(min_pairs=1, decay=0.5)
    meter.bound = RESPONSE_FLOOR
    meter.observe(arrival(0, [0.0], [0.0]))
    meter.observe(arrival(1, [1.0], [-1.0]))
    assert meter.bound == min(2.0, RESPONSE_SAFETY * 1.0)
    with pytest.raises(ValueError, match="decay"):
        ResponseMeter(decay=1.0)


def test_the_server_step_scales_inversely_with_the_bound_up_to_the_papers_step():
    assert paced_server_lr(5, 8, 1.0) == pytest.approx(2 * paced_server_lr(5, 8))
    assert paced_server_lr(5, 8, 0.5) == 1.0  # 4 x 0.41 capped at the papers' eta_s = 1
    assert paced_server_lr(1, 8, RESPONSE_FLOOR) == pytest.approx(2 * paced_server_lr(1, 8))  # at most twice
    # an explicit server_lr keeps no meter: the paper's step is not measured
    assert FedBuff(server_lr=1.0, pace="measured").response_meter is None
    assert FedBuff(pace="stable").response_meter is None


def test_batchnorm_statistics_and_counters_are_left_out_of_the_measurement():
    from collections import OrderedDict

    from asyncfl.server_app.codec import ModelCodec

    codec = ModelCodec.from_state(OrderedDict([
        ("conv.weight", np.zeros(2, np.float32)), ("bn.running_mean", np.zeros(1, np.float32)),
        ("bn.running_var", np.ones(1, np.float32)), ("bn.num_batches_tracked", np.zeros((), np.int64))]))
    entries = codec.trained_entries()
    assert entries.tolist() == [True, True, False, False, False]
    assert ModelCodec.from_state(OrderedDict([("w", np.zeros(3, np.float32))])).trained_entries() is None
    # Prepare: the weights respond with lambda = 0.5; the counter moves by 100 per version and its delta is constant
    meter, unmasked = ResponseMeter(min_pairs=1), ResponseMeter(min_pairs=1)
    for version in (0, 1):
        base = np.array([version, version, 0, 1, 100 * version], np.float32)
        delta = np.array([-0.5 * version, -0.5 * version, 0, 0, 6], np.float32)
        meter.observe(arrival(version, base, delta), entries)
        unmasked.observe(arrival(version, base, delta))
    # Assert: on the weights the response is 0.5; with the counter it would read as almost none
    assert meter.response == pytest.approx(0.5)
    assert unmasked.response < 1e-3


def test_the_summary_reports_the_step_in_use_and_the_measured_response():
    strategy = FedBuff(buffer_size=1, pace="measured")
    strategy.on_start(num_clients=4, concurrency=2)
    current = np.zeros(1, np.float32)
    for version in range(8):  # clients that move 10 % of the way to 0 from wherever they start
        base = np.array([1.0 + version], np.float32)
        strategy.on_arrival(arrival(version, base, -0.1 * base), current)
    summary = strategy.summary()
    assert summary["pace-response"] == pytest.approx(0.1, rel=1e-5) and summary["pace-pairs"] == 7
    assert summary["pace-bound"] == pytest.approx(2.0 / BOUND_EASING ** 3, rel=1e-4)  # pairs 5-7 eased it
    assert summary["server-lr"] == pytest.approx(paced_server_lr(1, 2, summary["pace-bound"]), rel=1e-4)
    assert "pace-bound" not in FedBuff(pace="stable").summary()
