"""Privacy spent by each client under asynchronous Gaussian releases: Renyi DP, each participation counted.

Every server step of a private run releases ``step + N(0, (sigma C c)^2)``, where the step adds each
clipped update (norm <= ``C``) with a public coefficient (``c`` the largest in that step). A client
whose updates enter one step with coefficients summing to ``k c`` shifts that release by at most
``k C c``: for it the release is a Gaussian mechanism of noise multiplier ``sigma / k``, whose Renyi
DP of order ``alpha`` is ``alpha k^2 / (2 sigma^2)`` (Mironov, 2017, "Renyi differential privacy",
Prop. 7). Releases compose by adding RDP, so a client's privacy loss is set by ``rho = sum k^2``
over the steps it took part in; the run reports the largest ``rho`` over its clients.

The accounting assumptions (``docs/security.md``): user-level DP for add-or-remove-one-client
neighbours; no amplification by sampling (asynchronous participation is not a random sample: every
participation is counted, as Flower's ``SamplingMethod.NO_AMPLIFICATION`` counts it); which update
lands in which step, and the coefficients, depend on timing and staleness, which are treated as
public (not on the clients' data).

RDP converts to ``(epsilon, delta)`` with Balle et al. (2020), "Hypothesis testing interpretations
and Renyi differential privacy", Thm. 21 (the conversion Google's ``dp_accounting`` uses), minimised
over a grid of orders.
"""

from __future__ import annotations

import math

import numpy as np

#: Renyi orders the conversion minimises over (as dense near 1 as privacy at large epsilon needs).
ORDERS = np.concatenate([1.0 + np.geomspace(1e-3, 1.0, 200)[:-1], np.geomspace(2.0, 4096.0, 400)])


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


class ClientPrivacyLedger:
    """Per-client ``rho = sum k^2`` over the releases, and the run's epsilon at ``target_delta``.

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
        self.rho: dict[int, float] = {}
        self.releases = 0

    def compose(self, contributions: dict[int, float]) -> None:
        """One release: ``contributions`` maps each client in it to ``k`` (its coefficients' sum / the largest)."""
        for client, k in contributions.items():
            self.rho[client] = self.rho.get(client, 0.0) + k * k
        self.releases += 1

    @property
    def worst_rho(self) -> float:
        return max(self.rho.values(), default=0.0)

    def epsilon(self, delta: float | None = None) -> float:
        """The largest epsilon over the clients at ``delta`` (default: ``target_delta``)."""
        return epsilon_from_rdp(self.worst_rho, self.noise_multiplier,
                                self.target_delta if delta is None else delta)
