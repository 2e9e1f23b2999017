"""Gradient-inversion compensation: the replayed local program, inversion, top-K, uniqueness, switching."""

import copy

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from asyncfl.client_app.training import train_local
from asyncfl.models import build_model
from asyncfl.models.flat import model_to_flat
from asyncfl.strategies.base import Arrival
from asyncfl.strategies.gi.inversion import InversionConfig, invert_update, replay_update
from asyncfl.strategies.gi.sparsify import kept_count, top_k_mask
from asyncfl.strategies.gi.strategy import GICompensation, GICompensationConfig
from asyncfl.strategies.gi.switching import SwitchBack, l1_disparity
from asyncfl.strategies.gi.uniqueness import adaptive_threshold, cosine_distance, is_unique
from asyncfl.strategies.gi.unrolled import (FlatLayout, LocalProgram, client_batches, flatten_params,
                                            recovered_batches, unrolled_sgd)

CPU = torch.device("cpu")


def _data(n, shape=(1, 8, 8), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)


@pytest.mark.parametrize("model_name,shape,batchnorm", [("mlp", (1, 8, 8), False), ("cnn", (1, 28, 28), True)])
def test_unrolled_local_update_matches_the_real_training_loop(model_name, shape, batchnorm):
    x, y = _data(12, shape)
    program = LocalProgram(epochs=2, steps=0, batch_size=5, lr=0.05, momentum=0.5, weight_decay=0.01)
    model = build_model(model_name, shape, 10, batchnorm=batchnorm, seed=1)
    flat = model_to_flat(model)
    real = copy.deepcopy(model)
    train_local(real, x, y, steps=0, epochs=2, batch_size=5, optimizer="sgd", lr=0.05, momentum=0.5,
                weight_decay=0.01, seed=11, device=CPU)
    layout = FlatLayout(build_model(model_name, shape, 10, batchnorm=batchnorm))
    params, buffers = layout.split(flat)
    start = {n: p.requires_grad_(True) for n, p in params.items()}
    out = unrolled_sgd(layout.model, start, buffers, torch.from_numpy(x), F.one_hot(torch.from_numpy(y), 10).float(),
                       client_batches(12, program, seed=11), program, differentiable=False)
    replayed = (flatten_params(out, layout.param_names) - flatten_params(start, layout.param_names)).detach().numpy()
    expected = layout.param_vector(model_to_flat(real) - flat)
    assert np.abs(replayed).max() > 1e-3  # it did train
    np.testing.assert_allclose(replayed, expected, atol=1e-6)


def test_step_counts_follow_the_client_program():
    program = LocalProgram(epochs=5, steps=0, batch_size=32, lr=0.01)
    assert program.total_steps(40) == 10 and program.total_steps(32) == 5
    assert len(client_batches(40, program, 0)) == 10
    batches = recovered_batches(20, 40, program)  # |D_rec| = 20 split into the client's 2 batches per epoch
    assert len(batches) == 10 and [len(b) for b in batches[:2]] == [10, 10]
    assert LocalProgram(epochs=0, steps=7, batch_size=8, lr=0.1).total_steps(100) == 7
    with pytest.raises(ValueError, match="SGD"):
        LocalProgram(epochs=1, steps=0, batch_size=8, lr=0.1, optimizer="adam")


def test_inversion_of_a_one_sample_one_step_update_reaches_near_zero_disparity():
    torch.manual_seed(0)
    x, y = _data(1)
    program = LocalProgram(epochs=1, steps=0, batch_size=1, lr=0.1)
    model = build_model("mlp", (1, 8, 8), 10, seed=2)
    flat = model_to_flat(model)
    layout = FlatLayout(build_model("mlp", (1, 8, 8), 10))
    trained = copy.deepcopy(model)
    train_local(trained, x, y, steps=0, epochs=1, batch_size=1, optimizer="sgd", lr=0.1, momentum=0.0, device=CPU)
    target = torch.from_numpy(layout.param_vector(model_to_flat(trained) - flat))
    params, buffers = layout.split(flat)
    config = InversionConfig(rec_fraction=1.0, iterations=400, lr=0.05, keep_fraction=1.0)
    result = invert_update(layout.model, params, buffers, target, program, 1, (1, 8, 8), 10, config,
                           torch.Generator().manual_seed(0))
    assert len(result.recovered) == 1
    assert result.disparity < 0.05 * result.initial_disparity
    replayed = replay_update(layout.model, params, buffers, result.recovered, program, 1)
    assert (replayed - target).abs().mean() < 0.05 * target.abs().mean()


def test_top_k_mask_keeps_exactly_k_largest():
    vector = torch.tensor([0.1, -5.0, 3.0, 0.0, -3.0, 2.0])
    mask = top_k_mask(vector, 0.5)
    assert int(mask.sum()) == 3 == kept_count(6, 0.5)
    assert mask.tolist() == [False, True, True, False, True, False]
    assert int(top_k_mask(torch.ones(1000), 0.05).sum()) == 50  # ties: still exactly K
    assert bool(top_k_mask(vector, 1.0).all())
    with pytest.raises(ValueError, match="keep fraction"):
        top_k_mask(vector, 0.0)


def test_uniqueness_threshold_on_hand_made_vectors():
    unstale = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    assert cosine_distance(unstale[0], unstale[1]) == pytest.approx(1.0)
    # Eq. 8 with the paper's 1/|S|^2: (0 + 1 + 1 + 0) / 4
    assert adaptive_threshold(unstale) == pytest.approx(0.5)
    assert is_unique(np.array([-1.0, 0.0]), unstale, 0.5)  # distances 2 and 1: mean 1.5
    assert not is_unique(np.array([1.0, 1.0]), unstale, 0.5)  # 1 - 1/sqrt(2) each
    assert adaptive_threshold(unstale[:1]) is None
    assert is_unique(np.array([1.0, 1.0]), unstale, None)  # no threshold yet: invert


def test_gamma_stays_one_until_e1_exceeds_e2_then_decays_linearly():
    switch = SwitchBack(window_fraction=0.1)
    true = np.array([1.0, 1.0])
    switch.observe(50, estimate=np.array([1.0, 0.9]), stale=np.array([0.0, 0.0]), true=true)  # E1 0.1 < E2 2
    assert switch.switched_at is None and switch.gamma(60) == 1.0
    switch.observe(100, estimate=np.array([0.0, 0.0]), stale=np.array([1.0, 0.9]), true=true)  # E1 2 > E2 0.1
    assert switch.switched_at == 100 and switch.window == 10
    assert [switch.gamma(v) for v in (99, 100, 105, 110, 130)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert l1_disparity(np.array([1.0, -1.0]), np.zeros(2)) == 2.0
    immediate = SwitchBack(window_fraction=0.0)
    immediate.observe(5, np.ones(1), np.zeros(1), np.zeros(1))
    assert immediate.gamma(5) == 0.0


def test_the_margin_keeps_compensating_while_the_estimate_is_only_slightly_worse():
    true = np.zeros(1)
    paper, reference = SwitchBack(window_fraction=0.0), SwitchBack(window_fraction=0.0, margin=0.9)
    for switch in (paper, reference):  # E1 = 1.0, E2 = 0.95: the stale update is 5 % closer to the truth
        switch.observe(10, estimate=np.array([1.0]), stale=np.array([0.95]), true=true)
    assert paper.switched_at == 10 and reference.switched_at is None
    reference.observe(20, estimate=np.array([1.0]), stale=np.array([0.85]), true=true)  # 0.85 < 0.9 * 1.0
    assert reference.switched_at == 20
    assert GICompensationConfig().switch_margin == 0.9
    with pytest.raises(ValueError, match="switch_margin"):
        GICompensationConfig(switch_margin=1.5)


def test_mean_rule_ignores_one_noisy_comparison_and_switches_on_the_recent_mean():
    switch = SwitchBack(window_fraction=0.0, rule="mean", min_comparisons=3)
    true = np.zeros(1)
    # (E1, E2) per comparison: one outlier with E1 > E2 must not switch; the mean of the last three decides.
    for version, (e1, e2) in enumerate([(5.0, 1.0), (1.0, 4.0), (1.0, 4.0), (3.0, 2.0), (3.0, 2.0), (3.0, 2.0)]):
        switch.observe(version, estimate=np.array([e1]), stale=np.array([e2]), true=true)
        if version == 3:  # last three: E1 1+1+3 = 5 < E2 4+4+2 = 10
            assert switch.switched_at is None
    # at version 4 the last three are (1,4), (3,2), (3,2): 7 < 8, still no; at 5: 9 > 6, switch.
    assert switch.switched_at == 5
    with pytest.raises(ValueError, match="choose one of"):
        GICompensationConfig(switch_rule="vote")
    with pytest.raises(ValueError, match=">= 1"):
        GICompensationConfig(switch_rule="mean", switch_comparisons=0)


def _arrival(client, base_version, staleness, base, weights, n=20):
    return Arrival(client, base_version, staleness, weights.astype(np.float32), base.astype(np.float32), n, 0.1, 0.0)


def _gi_strategy(**kwargs):
    make = lambda: build_model("mlp", (1, 8, 8), 10)  # noqa: E731
    program = LocalProgram(epochs=1, steps=0, batch_size=10, lr=0.1)
    knobs = dict(inversion_iterations=5, warm_iterations=3, max_reconstruction=8)
    return GICompensation(make, (1, 8, 8), 10, program, **knobs, **kwargs), make


def test_gi_strategy_inverts_unique_stale_updates_and_averages_the_rest():
    strategy, make = _gi_strategy(uniqueness=False)
    base = model_to_flat(build_model("mlp", (1, 8, 8), 10, seed=0))
    rng = np.random.default_rng(0)
    fresh = [_arrival(c, 3, 0, base, base + 0.01 * rng.standard_normal(base.size)) for c in range(3)]
    stale = _arrival(9, 1, 2, base - 0.01, base - 0.01 + 0.01 * rng.standard_normal(base.size))
    for arrival in fresh + [stale]:
        strategy.on_arrival(arrival, base)
    deltas, weights = strategy.round_updates(fresh + [stale], base)
    assert weights == [20.0] * 4
    for got, arrival in zip(deltas[:3], fresh):
        np.testing.assert_array_equal(got, arrival.delta)  # unstale updates pass through
    assert strategy.inversions == 1 and not np.allclose(deltas[3], stale.delta)
    assert np.isfinite(deltas[3]).all()
    # the same client's next stale update warm-starts from its D_rec
    strategy.round_updates([_arrival(9, 2, 2, base, base + 0.01 * rng.standard_normal(base.size))], base)
    assert strategy.inversions == 2 and strategy.warm_starts == 1
    assert strategy.summary()["gi-inversions"] == 2


def test_gi_strategy_skips_stale_updates_that_look_like_the_unstale_ones():
    strategy, _ = _gi_strategy(uniqueness=True)
    base = model_to_flat(build_model("mlp", (1, 8, 8), 10, seed=0))
    rng = np.random.default_rng(1)
    direction = rng.standard_normal(base.size)
    rounds = [[_arrival(c, v, 0, base, base + 0.01 * (direction + 0.1 * rng.standard_normal(base.size)))
               for c in range(3)] for v in range(2)]
    strategy.round_updates(rounds[0], base)  # threshold of version 0
    stale = _arrival(7, 0, 1, base, base + 0.01 * direction)  # same direction as everyone: not unique
    deltas, _ = strategy.round_updates(rounds[1] + [stale], base)
    assert strategy.inversions == 0 and strategy.not_unique == 1
    np.testing.assert_array_equal(deltas[-1], stale.delta)


def _lenet_gi_strategy(**kwargs):
    make = lambda: build_model("lenet5", (1, 28, 28), 10)  # noqa: E731
    program = LocalProgram(epochs=1, steps=0, batch_size=8, lr=0.05, momentum=0.5)
    return GICompensation(make, (1, 28, 28), 10, program, inversion_iterations=4, warm_iterations=2,
                          max_reconstruction=12, uniqueness=False, switch_window=0.5, **kwargs)


def _rounds_of_stale_updates(strategy):
    """Four rounds with three fresh and three stale arrivals each; client 9 always sends the same update (so
    its estimate loses to the raw one and the switch fires); client 8 arrives twice in round 2."""
    rng = np.random.default_rng(4)
    models = [model_to_flat(build_model("lenet5", (1, 28, 28), 10, seed=0))]
    fixed = 0.01 * rng.standard_normal(models[0].size)
    out = []
    for v in range(4):
        current, old = models[-1], models[max(0, v - 2)]

        def arrival(client, base_version, base):
            delta = fixed if client == 9 else 0.01 * rng.standard_normal(base.size)
            return _arrival(client, base_version, v - base_version, base, base + delta, n=24)

        arrivals = [arrival(c, v, current) for c in range(3)]
        arrivals += [arrival(8, max(0, v - 2), old), arrival(9, max(0, v - 2), old), arrival(5, max(0, v - 1), models[max(0, v - 1)])]
        if v == 2:
            arrivals.insert(1, arrival(8, 1, models[1]))
        deltas, _ = strategy.round_updates(arrivals, current)
        out += deltas
        models.append((current + np.mean(deltas, axis=0)).astype(np.float32))
    return out


def test_concurrent_inversions_give_the_same_bits_as_one_at_a_time_on_one_thread():
    threads = torch.get_num_threads()
    one = _lenet_gi_strategy()
    torch.set_num_threads(1)
    try:
        expected = _rounds_of_stale_updates(one)
    finally:
        torch.set_num_threads(threads)
    counts = ("gi-inversions", "gi-warm-starts", "gi-after-switch", "gi-switch-version", "gi-error-comparisons")
    for workers in (2, 3):
        many = _lenet_gi_strategy(inversion_workers=workers)
        got = _rounds_of_stale_updates(many)  # at the process's own torch threads
        assert len(got) == len(expected) == 25
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
        assert {k: many.summary()[k] for k in counts} == {k: one.summary()[k] for k in counts}
        assert many.summary()["gi-inversion-workers"] == workers and len(many._replicas) == workers
        assert torch.get_num_threads() == threads  # restored after each round's inversions
    assert one.summary()["gi-switch-version"] is not None and one.inversions >= 6
