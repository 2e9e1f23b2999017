"""Named delay scenarios.

``fedrevive-default`` and ``fedrevive-shifted`` are Appendix D and D.1 of the
FedRevive paper, verbatim:

* default: train ~ Exponential with client mean from {(0.25, 1.0), (0.5, 1.3),
  (0.25, 1.6)}; download constant 0.1; upload ~ Uniform(mu +- 0.02) with client
  mean from {(0.5, 0.15), (0.5, 0.25)}.
* shifted: train ~ Exponential with mean 0.1; download constant 0.02; upload ~
  Uniform(mu +- 0.01) with client mean from {(0.5, 0.05), (0.5, 0.10)}.
"""

from __future__ import annotations

from asyncfl.simulation.delays import ComponentDelay, DelayModel

DELAY_PRESETS: dict[str, DelayModel] = {
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
}
