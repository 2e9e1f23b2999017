"""One hostile node of eight, through the real engine on two apps: fast, first, or forging its example count.

The defaults (the per-participant update-norm bound and the example-count ceiling) must keep each run within a
few points of the clean one (``docs/security.md``; the study with Flower's robust strategies is
``benchmarks/adversaries``). The apps and drills are in :mod:`tests.adversaries`.
"""

import pytest

from asyncfl import FedAsync, FedAvg, FedBuff
from tests.adversaries import drill

STRATEGIES = {"fedbuff": lambda: FedBuff(fraction_evaluate=0.0), "fedasync": lambda: FedAsync(fraction_evaluate=0.0)}
#: How far under the clean run's quality a drill may end (toy: share of the start distance; digits: accuracy).
TOLERANCE = {"toy": 0.01, "digits": 0.04}


@pytest.mark.parametrize("app", ["toy", "digits"])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_one_attacker_of_eight_at_any_speed_first_or_forging_its_count_stays_near_the_clean_run(monkeypatch, app,
                                                                                                name):
    clean, _ = drill(monkeypatch, app, STRATEGIES[name]())
    for attack, speed in [("noise", 1.0), ("noise", 3.0), ("noise", 10.0), ("replace", 1.0), ("forged-count", 1.0)]:
        quality, summary = drill(monkeypatch, app, STRATEGIES[name](), attack, speed)
        assert quality >= clean - TOLERANCE[app], (attack, speed, quality, clean)
        if attack != "forged-count":  # the attacker's updates were bounded; faster than its share: by its rate
            assert summary["update-norm-clipped"] > 0
        if speed > 1:
            assert summary["update-norm-rate-limited"] > 0


def test_without_the_bound_a_fast_attacker_takes_fedasync_away_and_a_forged_count_takes_fedavg():
    """The drills' ablation: the same attacks with update_norm_bound=0 (no norm bound, no count ceiling)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, _ = drill(monkeypatch, "toy", FedAsync(fraction_evaluate=0.0), "noise", 10.0, update_norm_bound=0.0)
        forged, _ = drill(monkeypatch, "digits", FedAvg(fraction_evaluate=0.0), "forged-count",
                          update_norm_bound=0.0)
        bounded, summary = drill(monkeypatch, "digits", FedAvg(fraction_evaluate=0.0), "forged-count")
    assert fast < 0.0  # further from the target than the start
    assert forged < 0.5 < bounded and summary["num-examples-capped"] > 0


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_node_ten_times_faster_gets_no_more_than_its_share_of_jobs_when_every_node_has_one_out(monkeypatch, name):
    """Every node keeps a job in flight (concurrency = nodes, as in a deployment): the fast node's share of the
    updates follows its speed unless it is held back while over 3 x the median client's share."""
    clean, _ = drill(monkeypatch, "digits", STRATEGIES[name](), concurrency=8)
    quality, summary = drill(monkeypatch, "digits", STRATEGIES[name](), "noise", 10.0, concurrency=8)
    attacker_updates = summary["update-norm-clipped"]  # each of its noisy updates is clipped, honest ones rarely
    assert summary["over-share-held-back"] > 0
    assert attacker_updates < 0.35 * summary["arrivals"]  # 10/17 of the updates if it were not held back
    assert quality >= clean - TOLERANCE["digits"]
