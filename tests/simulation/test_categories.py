"""Runtime categories (FedEcho Table 1): shares, the gamma rule, and seeded uniform draws."""

import numpy as np
import pytest

from asyncfl.simulation.categories import CategorySampler, RuntimeCategories, assign_categories
from asyncfl.simulation.presets import DELAY_PRESETS, delay_sampler, with_gamma


def test_presets_are_table_1_of_the_paper():
    large, mild = DELAY_PRESETS["fedecho-large"], DELAY_PRESETS["fedecho-mild"]
    assert (large.short, large.medium, large.long) == ((1.0, 2.0), (3.0, 5.0), (50.0, 80.0))
    assert (mild.short, mild.medium, mild.long) == ((1.0, 2.0), (3.0, 5.0), (10.0, 20.0))
    assert large.long_fraction == 0.1


def test_at_most_ten_percent_are_long_whatever_gamma():
    sizes = np.random.default_rng(0).integers(1, 500, size=57)
    for gamma in (0.0, 0.3, 1.0):
        categories = assign_categories(sizes, with_gamma(DELAY_PRESETS["fedecho-large"], gamma), seed=1)
        assert np.sum(categories == 2) == 5 and np.sum(categories == 1) == 17


def test_gamma_zero_follows_size_and_gamma_one_ignores_it():
    sizes = np.arange(100)
    by_size = assign_categories(sizes, with_gamma(DELAY_PRESETS["fedecho-mild"], 0.0), seed=0)
    assert set(np.flatnonzero(by_size == 2)) == set(range(90, 100))
    random = assign_categories(sizes, with_gamma(DELAY_PRESETS["fedecho-mild"], 1.0), seed=0)
    same_with_other_sizes = assign_categories(sizes[::-1], with_gamma(DELAY_PRESETS["fedecho-mild"], 1.0), seed=0)
    assert np.array_equal(random, same_with_other_sizes)
    assert not np.array_equal(random, by_size)


def test_job_durations_are_uniform_in_the_category_and_seeded():
    spec = DELAY_PRESETS["fedecho-large"]
    sampler = delay_sampler(spec, seed=4)
    assert isinstance(sampler, CategorySampler)
    with pytest.raises(RuntimeError, match="bind_clients"):
        sampler.job_duration(0)
    sampler.bind_clients(list(range(20)))
    draws = {c: [sampler.job_duration(c) for _ in range(50)] for c in range(20)}
    for client, values in draws.items():
        low, high = spec.interval(int(sampler.categories[client]))
        assert all(low <= v <= high for v in values)
    again = delay_sampler(spec, seed=4)
    again.bind_clients(list(range(20)))
    assert [again.job_duration(3) for _ in range(50)] == draws[3]


def test_bad_category_specs_are_refused():
    with pytest.raises(ValueError, match="low <= high"):
        RuntimeCategories(short=(2.0, 1.0), medium=(3.0, 5.0), long=(10.0, 20.0))
    with pytest.raises(ValueError, match="sum <= 1"):
        RuntimeCategories(short=(1.0, 2.0), medium=(3.0, 5.0), long=(10.0, 20.0), long_fraction=0.6,
                          medium_fraction=0.6)
    with pytest.raises(ValueError, match="gamma"):
        RuntimeCategories(short=(1.0, 2.0), medium=(3.0, 5.0), long=(10.0, 20.0), gamma=2.0)
