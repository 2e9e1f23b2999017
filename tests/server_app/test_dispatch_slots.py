"""EligibleClients against the list it replaces: same members, same order, same seeded picks."""

import numpy as np
import pytest

from asyncfl.server_app.dispatch import EligibleClients


def test_kth_matches_the_sorted_list_under_random_updates():
    rng = np.random.default_rng(0)
    eligible, flags = EligibleClients(50), np.zeros(50, bool)
    for step in range(2000):
        if step == 1000:  # clients join mid-run
            eligible.grow(80)
            flags = np.concatenate([flags, np.zeros(30, bool)])
        i = int(rng.integers(len(flags)))
        flags[i] = bool(rng.integers(2))
        eligible.set(i, flags[i])
        members = np.flatnonzero(flags)
        assert len(eligible) == len(members)
        if len(members):
            k = int(rng.integers(len(members)))
            assert eligible.kth(k) == members[k]
    assert all((i in eligible) == flags[i] for i in range(len(flags)))


def test_seeded_picks_equal_picks_from_the_materialised_list():
    eligible = EligibleClients(1000)
    members = [i for i in range(1000) if i % 3]
    for i in members:
        eligible.set(i, True)
    old = np.random.default_rng(5).choice(members, size=7, replace=False)
    new = [eligible.kth(int(p)) for p in np.random.default_rng(5).choice(len(eligible), size=7, replace=False)]
    assert list(old) == new
    with pytest.raises(IndexError):
        eligible.kth(len(members))
