"""Privacy spent by each data owner under asynchronous Gaussian releases, converted by Flower's accountant.

Every server step of a private run releases ``step + N(0, (sigma C c)^2)``, where the step adds each
clipped update (norm <= ``C``) with a public coefficient (``c`` the largest in that step). An owner
whose updates enter one step with coefficients summing to ``k c`` shifts that release by at most
``k C c``: for it the release is a Gaussian mechanism of noise multiplier ``sigma / k``, Flower's
``GaussianPrivacyEvent(sigma / k)``, whose Renyi DP of order ``alpha`` is ``alpha k^2 / (2 sigma^2)``
(Mironov, 2017, "Renyi differential privacy", Prop. 7). Releases compose by adding RDP, so an
owner's privacy loss is set by ``rho = sum k^2`` over the steps it took part in; the run reports the
largest over its owners. The ledger is keyed by who owns the data (a SuperNode's registered key,
else its partition identity), so a node that leaves and joins again keeps spending from the same
entry, and it is checkpointed (``rho`` per owner), so a resumed run continues it.

The conversion to ``(epsilon, delta)`` is Flower 1.42's own accountant, ``flwr.serverapp.RdpAccountant``
(a ``PrivacyAccountant`` backed by Google's ``dp-accounting``, a dependency of asyncfl through
``flwr[dp]``), configured with Flower's ``PrivacyConfig`` for one owner: add-or-remove-one neighbours,
``SamplingMethod.NO_AMPLIFICATION``. An owner's releases, composed event by event, have the RDP of one
``GaussianPrivacyEvent`` of noise multiplier ``sigma / sqrt(rho)`` at every order (the Gaussian's RDP
is linear in ``1 / sigma^2``), and that one event is what the accountant is given: the ledger keeps
``rho`` rather than every participation (a long run's events would grow the checkpoints and be
replayed on every resume). ``tests/strategies/test_accounting.py`` composes an async run's participations one
by one in Flower's accountant and finds the same epsilon.

The accounting assumptions (``docs/security.md``): user-level DP for add-or-remove-one-owner
neighbours; no amplification by sampling (asynchronous participation is not a random sample: every
participation is counted); which update lands in which step, and the coefficients, depend on timing
and staleness, which are treated as public (not on the clients' data).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping

import numpy as np

#: Renyi orders the conversion minimises over: dense near 1, where privacy at large epsilon is decided, from
#: just above 1.01 (dp-accounting's conversion skips orders up to 1.01 as numerically unstable) to 4096.
ORDERS = tuple(float(a) for a in np.concatenate([1.0 + np.geomspace(1e-3, 1.0, 200)[:-1],
                                                 np.geomspace(2.0, 4096.0, 400)]) if a > 1.01)

#: What ``summary.json`` names as the conversion (``dp-accountant``).
FLOWER_ACCOUNTANT = "flwr.serverapp.RdpAccountant (dp-accounting)"


def owner_privacy_config(delta: float):
    """Flower's ``PrivacyConfig`` for one owner's releases: add-or-remove-one, no amplification by sampling (the
    owner is in every release it is charged for; a population of one, since the ledger keeps one per owner)."""
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod

    return PrivacyConfig(target_delta=delta, population_size=1,
                         neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                         sampling_method=SamplingMethod.NO_AMPLIFICATION)


def owner_accountant(delta: float):
    """An empty Flower ``RdpAccountant`` for one owner (:func:`owner_privacy_config`) over :data:`ORDERS`.

    Raises
    ------
    ImportError
        Without ``dp-accounting`` (Flower's message: ``pip install "flwr[dp]"``; asyncfl depends on it).
    """
    from flwr.serverapp import RdpAccountant

    return RdpAccountant(owner_privacy_config(delta), orders=ORDERS)


def owner_event(noise_multiplier: float):
    """Flower's ``GaussianPrivacyEvent`` of one owner's release (population one, so the owner is the sample)."""
    from flwr.serverapp import GaussianPrivacyEvent

    return GaussianPrivacyEvent(noise_multiplier, sample_size=1, population_size=1)


@functools.lru_cache(maxsize=4096)  # FedBuff without staleness weighting gives integer rho: values recur
def flower_epsilon(rho: float, noise_multiplier: float, delta: float) -> float:
    """``epsilon`` at ``delta`` by Flower's ``RdpAccountant`` after Gaussian releases of noise multiplier
    ``noise_multiplier`` whose squared sensitivities (in units of the clipping scale) sum to ``rho``: one
    ``GaussianPrivacyEvent(noise_multiplier / sqrt(rho))``. ``inf`` without noise, 0 without releases."""
    if rho <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    accountant = owner_accountant(delta)
    accountant.compose(owner_event(noise_multiplier / math.sqrt(rho)))
    return accountant.get_epsilon(delta)


class ClientPrivacyLedger:
    """Per-owner ``rho = sum k^2`` over the releases, and the run's epsilon at ``target_delta`` by Flower's accountant.

    Parameters
    ----------
    noise_multiplier : float
        ``sigma``: noise sd per unit of a single update's largest contribution to a step.
    target_delta : float
        The ``delta`` epsilon is reported at.

    Raises
    ------
    ImportError
        Without ``dp-accounting`` (Flower's accountant's backend), before any release rather than at the first.
    """

    state_attributes = ("rho", "releases")
    accountant = FLOWER_ACCOUNTANT

    def __init__(self, noise_multiplier: float, target_delta: float) -> None:
        self.noise_multiplier = noise_multiplier
        self.target_delta = target_delta
        owner_accountant(target_delta)  # Flower checks delta and loads its backend now
        self.rho: dict[Hashable, float] = {}
        self.releases = 0

    def compose(self, contributions: Mapping[Hashable, float]) -> None:
        """One release: ``contributions`` maps each owner in it to ``k`` (its coefficients' sum / the largest)."""
        for owner, k in contributions.items():
            self.rho[owner] = self.rho.get(owner, 0.0) + k * k
        self.releases += 1

    def merge(self, old: Hashable, owner: Hashable) -> None:
        """Charge ``owner`` with what was charged to ``old`` (an entry kept under a provisional key)."""
        if old != owner and old in self.rho:
            self.rho[owner] = self.rho.get(owner, 0.0) + self.rho.pop(old)

    @property
    def worst_rho(self) -> float:
        return max(self.rho.values(), default=0.0)

    def epsilon(self, delta: float | None = None) -> float:
        """The largest epsilon over the owners at ``delta`` (default: ``target_delta``): the owner with the
        largest ``rho``, since at one noise multiplier epsilon grows with ``rho``."""
        delta = self.target_delta if delta is None else delta
        return flower_epsilon(self.worst_rho, self.noise_multiplier, delta)
