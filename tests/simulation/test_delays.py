"""Delay models: per-client tiers, distributions, presets from FedRevive Appendix D."""

import numpy as np
import pytest

from asyncfl.simulation.delays import ComponentDelay, DelayModel, DelaySampler, parse_tiers
from asyncfl.simulation.presets import DELAY_PRESETS


def test_parse_tiers():
    assert parse_tiers("0.1") == ((1.0, 0.1),)
    assert parse_tiers("0.25:1.0,0.75:2") == ((0.25, 1.0), (0.75, 2.0))
    with pytest.raises(ValueError, match="probability:mean"):
        parse_tiers("fast")


def test_tier_probabilities_must_sum_to_one():
    with pytest.raises(ValueError, match="sum to 1"):
        ComponentDelay("constant", ((0.5, 1.0), (0.2, 2.0)))


def test_unknown_distribution_names_valid_ones():
    with pytest.raises(ValueError, match="constant, uniform, exponential, lognormal, pareto"):
        ComponentDelay("gamma", ((1.0, 1.0),))


@pytest.mark.parametrize("dist,spread", [("uniform", 0.02), ("exponential", 0.0), ("lognormal", 0.5), ("pareto", 3.0)])
def test_distributions_have_the_requested_mean(dist, spread):
    comp = ComponentDelay(dist, ((1.0, 0.7),), spread)
    rng = np.random.default_rng(0)
    samples = [comp.sample(0.7, rng) for _ in range(40000)]
    assert np.mean(samples) == pytest.approx(0.7, rel=0.03)
    assert min(samples) >= 0


def test_uniform_stays_within_half_width():
    comp = ComponentDelay("uniform", ((1.0, 0.15),), 0.02)
    rng = np.random.default_rng(1)
    samples = [comp.sample(0.15, rng) for _ in range(2000)]
    assert 0.13 <= min(samples) and max(samples) <= 0.17


def test_fedrevive_default_preset_matches_appendix_d():
    preset = DELAY_PRESETS["fedrevive-default"]
    assert preset.train.distribution == "exponential"
    assert preset.train.tiers == ((0.25, 1.0), (0.5, 1.3), (0.25, 1.6))
    assert preset.download.distribution == "constant" and preset.download.tiers == ((1.0, 0.1),)
    assert preset.upload.distribution == "uniform" and preset.upload.spread == 0.02
    assert preset.upload.tiers == ((0.5, 0.15), (0.5, 0.25))


def test_fedrevive_shifted_preset_matches_appendix_d1():
    preset = DELAY_PRESETS["fedrevive-shifted"]
    assert preset.train.tiers == ((1.0, 0.1),)
    assert preset.download.tiers == ((1.0, 0.02),)
    assert preset.upload.tiers == ((0.5, 0.05), (0.5, 0.10)) and preset.upload.spread == 0.01


def test_tier_frequencies_follow_probabilities():
    sampler = DelaySampler(DELAY_PRESETS["fedrevive-default"], seed=0)
    means = np.array([sampler.profile(c).train for c in range(4000)])
    assert np.mean(means == 1.3) == pytest.approx(0.5, abs=0.03)
    assert np.mean(means == 1.0) == pytest.approx(0.25, abs=0.03)


def test_profiles_are_persistent_and_jobs_independent_of_other_clients():
    a = DelaySampler(DELAY_PRESETS["fedrevive-default"], seed=5)
    b = DelaySampler(DELAY_PRESETS["fedrevive-default"], seed=5)
    a.job_duration(1)
    first_a = [a.job_duration(0) for _ in range(3)]
    first_b = [b.job_duration(0) for _ in range(3)]
    assert first_a == first_b
    assert a.profile(3) == b.profile(3)


def test_constant_model_gives_sum_of_components():
    model = DelayModel(*(ComponentDelay("constant", ((1.0, v),)) for v in (0.1, 1.0, 0.2)))
    assert DelaySampler(model, 0).job_duration(7) == pytest.approx(1.3)


def test_exact_shares_put_exactly_a_quarter_of_the_clients_in_the_slow_tiers():
    # Prepare: the quarter-slow preset on 8 and on 16 clients, three seeds
    from asyncfl.simulation.presets import DELAY_PRESETS, delay_sampler

    for clients in (8, 16):
        for seed in (1, 2, 3):
            sampler = delay_sampler(DELAY_PRESETS["quarter-slow"], seed)
            sampler.bind_clients([10] * clients)
            means = sorted(sampler.profile(c).train for c in range(clients))
            # Assert: 3/4 at speed 1, 1/8 at 4x, 1/8 at 10x, whatever the seed; the seed picks which clients
            assert means == [1.0] * (clients * 3 // 4) + [4.0] * (clients // 8) + [10.0] * (clients // 8)
    slow = [[c for c in range(8) if (s := delay_sampler(DELAY_PRESETS["quarter-slow"], seed)).bind_clients([1] * 8)
             or s.profile(c).train > 1] for seed in (1, 2)]
    assert slow[0] != slow[1]
