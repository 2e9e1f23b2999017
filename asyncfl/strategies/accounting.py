"""Privacy spent by each data owner under asynchronous Gaussian releases: Renyi DP, each participation counted.

Every server step of a private run releases ``step + N(0, (sigma C c)^2)``, where the step adds each
clipped update (norm <= ``C``) with a public coefficient (``c`` the largest in that step). An owner
whose updates enter one step with coefficients summing to ``k c`` shifts that release by at most
``k C c``: for it the release is a Gaussian mechanism of noise multiplier ``sigma / k``, whose Renyi
DP of order ``alpha`` is ``alpha k^2 / (2 sigma^2)`` (Mironov, 2017, "Renyi differential privacy",
Prop. 7). Releases compose by adding RDP, so an owner's privacy loss is set by ``rho = sum k^2``
over the steps it took part in; the run reports the largest ``rho`` over its owners. The ledger is
keyed by who owns the data (a SuperNode's registered key, else its partition identity), so a node
that leaves and joins again keeps spending from the same entry.

The accounting assumptions (``docs/security.md``): user-level DP for add-or-remove-one-owner
neighbours; no amplification by sampling (asynchronous participation is not a random sample: every
participation is counted, as Flower's ``SamplingMethod.NO_AMPLIFICATION`` counts it); which update
lands in which step, and the coefficients, depend on timing and staleness, which are treated as
public (not on the clients' data).

RDP converts to ``(epsilon, delta)`` with Balle et al. (2020), "Hypothesis testing interpretations
and Renyi differential privacy", Thm. 21, minimised over a grid of orders. With Flower's optional
accountant installed (``pip install "flwr[dp]"``: Google's ``dp-accounting``) the conversion is
Flower's ``RdpAccountant``: an owner's releases ``GaussianPrivacyEvent(sigma / k_i)`` compose to the
RDP of one Gaussian event of noise multiplier ``sigma / sqrt(rho)`` at every order (the Gaussian's RDP
is linear in ``1 / sigma^2``), which is the event it is given. Without it, the same formula is computed
here (``dp-accounting`` 0.6 pins ``attrs < 24``, which ``constraints.txt``'s ``attrs`` 26 excludes).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

import numpy as np

#: Renyi orders the conversion minimises over (as dense near 1 as privacy at large epsilon needs).
ORDERS = np.concatenate([1.0 + np.geomspace(1e-3, 1.0, 200)[:-1], np.geomspace(2.0, 4096.0, 400)])

#: What ``summary.json`` names as the conversion (``dp-accountant``).
FLOWER_ACCOUNTANT = "flwr.serverapp.RdpAccountant (dp-accounting)"
OWN_ACCOUNTANT = "asyncfl RDP (Balle et al. 2020, Thm. 21; flwr[dp] not installed)"


def epsilon_from_rdp(rho: float, noise_multiplier: float, delta: float) -> float:
    """``epsilon`` at ``delta`` after Gaussian releases of noise multiplier ``noise_multiplier`` whose squared
    sensitivities (in units of the clipping scale) sum to ``rho``; ``inf`` without noise, 0 without releases."""
    if rho <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    rdp = ORDERS * rho / (2.0 * noise_multiplier ** 2)
    eps = rdp + np.log1p(-1.0 / ORDERS) - (math.log(delta) + np.log(ORDERS)) / (ORDERS - 1.0)
    return float(max(0.0, np.min(eps)))


def flower_accountant_available() -> bool:
    """Whether Flower's ``RdpAccountant`` can run (its backend, ``dp-accounting``, is an optional install)."""
    try:
        import dp_accounting  # noqa: F401
    except ImportError:
        return False
    return True


def flower_epsilon(rho: float, noise_multiplier: float, delta: float) -> float:
    """:func:`epsilon_from_rdp` computed by Flower's ``RdpAccountant`` over the same orders: one owner's
    releases as the single Gaussian event of noise multiplier ``noise_multiplier / sqrt(rho)``.

    Raises
    ------
    ImportError
        Without ``dp-accounting`` (``pip install "flwr[dp]"``).
    """
    if rho <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    from flwr.serverapp import GaussianPrivacyEvent
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    accountant = RdpAccountant(owner_privacy_config(delta), orders=tuple(float(a) for a in ORDERS))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier / math.sqrt(rho), sample_size=1, population_size=1))
    return accountant.get_epsilon(delta)


def owner_privacy_config(delta: float):
    """Flower's ``PrivacyConfig`` for one owner's releases: add-or-remove-one, no amplification by sampling (the
    owner is in every release it is charged for; a population of one, since the ledger keeps one per owner)."""
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod

    return PrivacyConfig(target_delta=delta, population_size=1,
                         neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                         sampling_method=SamplingMethod.NO_AMPLIFICATION)


class ClientPrivacyLedger:
    """Per-owner ``rho = sum k^2`` over the releases, and the run's epsilon at ``target_delta``.

    Parameters
    ----------
    noise_multiplier : float
        ``sigma``: noise sd per unit of a single update's largest contribution to a step.
    target_delta : float
        The ``delta`` epsilon is reported at.
    """

    state_attributes = ("rho", "releases")

    def __init__(self, noise_multiplier: float, target_delta: float) -> None:
        self.noise_multiplier = noise_multiplier
        self.target_delta = target_delta
        self.rho: dict[Hashable, float] = {}
        self.releases = 0
        self.accountant = FLOWER_ACCOUNTANT if flower_accountant_available() else OWN_ACCOUNTANT
        self._converted: tuple[float, float, float] | None = None  # (rho, delta, epsilon) last converted

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
        """The largest epsilon over the owners at ``delta`` (default: ``target_delta``)."""
        delta, rho = self.target_delta if delta is None else delta, self.worst_rho
        if self._converted is None or self._converted[:2] != (rho, delta):
            convert = flower_epsilon if self.accountant == FLOWER_ACCOUNTANT else epsilon_from_rdp
            self._converted = (rho, delta, convert(rho, self.noise_multiplier, delta))
        return self._converted[2]
