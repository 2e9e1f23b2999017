"""Staleness functions: how much an update computed on an old model is trusted.

Two families live here:

* FedAsync's staleness functions ``s(tau)`` (Xie et al., 2019, "Asynchronous
  Federated Optimization", Sec. 5.2): constant, polynomial and hinge. The mixing
  weight is ``alpha * s(tau)``.
* FedRevive's monotone schedules ``beta(tau) in [0, 1]`` (FedRevive paper, Eq. 3
  and Appendix I.1): 1-cosine (the paper's choice), linear and constant. AFL-DW
  scales the raw update by ``1 - beta(tau)``.
"""

from __future__ import annotations

import math

from asyncfl.errors import ConfigError

FEDASYNC_STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")
BETA_SCHEDULES = ("cosine", "linear", "step", "constant")


#: ``tau_max`` per job in flight when a ``max-staleness`` of 0 asks for it (FedRevive, AFL-DW). A job's staleness
#: is about the number of jobs in flight ``K`` (the others' arrivals while it trains), so ``tau_max = 1.5 K`` gives
#: the typical arrival ``beta(K) = 0.75`` on the 1-cosine family: the regime of the FedRevive reference code
#: (100 in flight, ``tau_max`` 150). A fixed ``tau_max`` 150 at 20 in flight gives ``beta`` ~0.05, KD switched off.
CUTOFF_PER_JOB_IN_FLIGHT = 1.5


def staleness_cutoff(configured: float, concurrency: int | None) -> float:
    """``tau_max`` to use: ``configured``, or when it is 0 :data:`CUTOFF_PER_JOB_IN_FLIGHT` x the jobs in flight
    (1 job before a run has started)."""
    return configured if configured > 0 else CUTOFF_PER_JOB_IN_FLIGHT * max(concurrency or 1, 1)


def _check_tau(tau: int) -> None:
    if tau < 0:
        raise ValueError(f"staleness must be >= 0, got {tau}")


def constant_staleness(tau: int) -> float:
    """``s(tau) = 1``: staleness is ignored."""
    _check_tau(tau)
    return 1.0


def polynomial_staleness(tau: int, a: float) -> float:
    """``s(tau) = (tau + 1) ** -a`` (Xie et al., 2019)."""
    _check_tau(tau)
    return float((tau + 1.0) ** (-a))


def hinge_staleness(tau: int, a: float, b: float) -> float:
    """``s(tau) = 1`` if ``tau <= b`` else ``1 / (a * (tau - b) + 1)`` (Xie et al., 2019)."""
    _check_tau(tau)
    if tau <= b:
        return 1.0
    return 1.0 / (a * (tau - b) + 1.0)


def fedasync_staleness(name: str, tau: int, a: float, b: float) -> float:
    """Dispatch to one of :data:`FEDASYNC_STALENESS_FUNCTIONS` by name."""
    if name == "constant":
        return constant_staleness(tau)
    if name == "polynomial":
        return polynomial_staleness(tau, a)
    if name == "hinge":
        return hinge_staleness(tau, a, b)
    raise ConfigError(
        f"unknown FedAsync staleness function {name!r}; valid: {', '.join(FEDASYNC_STALENESS_FUNCTIONS)}"
    )


def cosine_beta(tau: int, tau_max: float) -> float:
    """1-cosine schedule: ``(1 - cos(pi * min(tau, tau_max) / tau_max)) / 2``.

    Rises smoothly from 0 at ``tau = 0`` to 1 at ``tau = tau_max`` and stays 1
    beyond (FedRevive, Appendix I.1, Figure 11).
    """
    _check_tau(tau)
    clipped = min(float(tau), tau_max)
    return 0.5 * (1.0 - math.cos(math.pi * clipped / tau_max))


def linear_beta(tau: int, tau_max: float) -> float:
    """Linear schedule: ``min(1, tau / tau_max)``."""
    _check_tau(tau)
    return min(1.0, tau / tau_max)


def step_beta(tau: int, tau_max: float) -> float:
    """Step schedule: 0 below ``tau_max / 2``, 1 from there on (FedRevive, Appendix I.1, Figure 11).

    The paper shows the family only as a figure; the switch point at half the
    horizon is our reading of it.
    """
    _check_tau(tau)
    return 1.0 if tau >= tau_max / 2 else 0.0


def beta_schedule(name: str, tau: int, tau_max: float, constant: float) -> float:
    """Dispatch to one of :data:`BETA_SCHEDULES` by name."""
    if name == "step":
        return step_beta(tau, tau_max)
    if name == "cosine":
        return cosine_beta(tau, tau_max)
    if name == "linear":
        return linear_beta(tau, tau_max)
    if name == "constant":
        _check_tau(tau)
        return constant
    raise ConfigError(f"unknown beta schedule {name!r}; valid: {', '.join(BETA_SCHEDULES)}")
