"""Named delay scenarios.

``fedrevive-default`` and ``fedrevive-shifted`` are Appendix D and D.1 of the
FedRevive paper, verbatim:

* default: train ~ Exponential with client mean from {(0.25, 1.0), (0.5, 1.3),
  (0.25, 1.6)}; download constant 0.1; upload ~ Uniform(mu +- 0.02) with client
  mean from {(0.5, 0.15), (0.5, 0.25)}.
* shifted: train ~ Exponential with mean 0.1; download constant 0.02; upload ~
  Uniform(mu +- 0.01) with client mean from {(0.5, 0.05), (0.5, 0.10)}.

``fedecho-large`` and ``fedecho-mild`` are Table 1 of the FedEcho paper (units
of 10 s): runtime categories short U(1, 2), medium U(3, 5), long U(50, 80)
(large) or U(10, 20) (mild), at most 10% long, assigned from ``gamma`` and the
clients' sample counts (:mod:`asyncfl.simulation.categories`).
"""

from __future__ import annotations

from dataclasses import replace

from asyncfl.simulation.categories import CategorySampler, RuntimeCategories
from asyncfl.simulation.delays import ComponentDelay, DelayModel, DelaySampler
from asyncfl.simulation.intertwined import IntertwinedDelays, IntertwinedSampler

DELAY_PRESETS: dict[str, DelayModel | RuntimeCategories] = {
    "fedrevive-default": DelayModel(
        download=ComponentDelay("constant", ((1.0, 0.1),)),
        train=ComponentDelay("exponential", ((0.25, 1.0), (0.5, 1.3), (0.25, 1.6))),
        upload=ComponentDelay("uniform", ((0.5, 0.15), (0.5, 0.25)), spread=0.02),
    ),
    "fedrevive-shifted": DelayModel(
        download=ComponentDelay("constant", ((1.0, 0.02),)),
        train=ComponentDelay("exponential", ((1.0, 0.1),)),
        upload=ComponentDelay("uniform", ((0.5, 0.05), (0.5, 0.10)), spread=0.01),
    ),
    "uniform-speed": DelayModel(
        download=ComponentDelay("constant", ((1.0, 0.0),)),
        train=ComponentDelay("constant", ((1.0, 1.0),)),
        upload=ComponentDelay("constant", ((1.0, 0.0),)),
    ),
    # a quarter of the clients slower than the rest, half of them 4x and half 10x, on every run (exact tier
    # shares), jobs +-0.2 around their client's mean: where asynchrony should reach FedAvg's accuracy sooner
    "quarter-slow": DelayModel(
        download=ComponentDelay("constant", ((1.0, 0.0),)),
        train=ComponentDelay("uniform", ((0.75, 1.0), (0.125, 4.0), (0.125, 10.0)), spread=0.2, exact_shares=True),
        upload=ComponentDelay("constant", ((1.0, 0.0),)),
    ),
    "fedecho-large": RuntimeCategories(short=(1.0, 2.0), medium=(3.0, 5.0), long=(50.0, 80.0)),
    "fedecho-mild": RuntimeCategories(short=(1.0, 2.0), medium=(3.0, 5.0), long=(10.0, 20.0)),
}


def with_gamma(model: DelayModel | RuntimeCategories, gamma: float) -> DelayModel | RuntimeCategories:
    """``model`` with its category-assignment ``gamma`` replaced (component models have none)."""
    return replace(model, gamma=gamma) if isinstance(model, RuntimeCategories) else model


def delay_sampler(model: DelayModel | RuntimeCategories | IntertwinedDelays,
                  seed: int) -> DelaySampler | CategorySampler | IntertwinedSampler:
    """The seeded per-job duration sampler for ``model``."""
    if isinstance(model, IntertwinedDelays):
        return IntertwinedSampler(model, seed)
    if isinstance(model, RuntimeCategories):
        return CategorySampler(model, seed)
    return DelaySampler(model, seed)
