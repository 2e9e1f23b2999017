"""Runtime categories tied to data size: FedEcho's delay simulation (its Table 1).

FedEcho paper, Sec. 5: at the start every client is put into a runtime
category (short, medium, long) "based on a parameter gamma and the number of
local training samples"; a smaller gamma means runtime depends more strongly on
the sample count; at most 10% of the clients are long. Each job then takes a
uniform draw from the category's interval (units of 10 s in the paper):

==========  ========  ========  ==========
scenario    short     medium    long
==========  ========  ========  ==========
large       U(1, 2)   U(3, 5)   U(50, 80)
mild        U(1, 2)   U(3, 5)   U(10, 20)
==========  ========  ========  ==========

The paper does not spell out the assignment rule; ours: client ``i`` gets the
score ``gamma * u_i + (1 - gamma) * r_i`` with ``u_i ~ U(0, 1)`` (seeded) and
``r_i`` its sample-count rank scaled to [0, 1]; the highest scores are long
(``long_fraction`` of the clients, rounded down), the next ``medium_fraction``
medium, the rest short. ``gamma = 0`` makes the biggest clients the slowest,
``gamma = 1`` ignores data size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asyncfl.errors import ConfigError

CATEGORIES = ("short", "medium", "long")


@dataclass(frozen=True)
class RuntimeCategories:
    """Category intervals and the assignment rule.

    Parameters
    ----------
    short, medium, long : tuple of (low, high)
        Uniform runtime interval of each category.
    long_fraction, medium_fraction : float
        Shares of clients in the long and medium categories.
    gamma : float
        Weight of randomness vs sample count in the assignment, in [0, 1].
    """

    short: tuple[float, float]
    medium: tuple[float, float]
    long: tuple[float, float]
    long_fraction: float = 0.1
    medium_fraction: float = 0.3
    gamma: float = 0.5

    def __post_init__(self) -> None:
        for name in CATEGORIES:
            low, high = getattr(self, name)
            if not 0.0 <= low <= high:
                raise ConfigError(f"{name} runtime interval must satisfy 0 <= low <= high, got ({low}, {high})")
        if not (0.0 <= self.long_fraction and 0.0 <= self.medium_fraction
                and self.long_fraction + self.medium_fraction <= 1.0):
            raise ConfigError(f"need long_fraction ({self.long_fraction}) and medium_fraction "
                             f"({self.medium_fraction}) >= 0 with a sum <= 1")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma={self.gamma} must be in [0, 1]")

    def interval(self, category: int) -> tuple[float, float]:
        """The ``(low, high)`` runtime interval of category index ``category``."""
        return getattr(self, CATEGORIES[category])


def assign_categories(sizes: list[int] | np.ndarray, spec: RuntimeCategories, seed: int) -> np.ndarray:
    """Category index (0 short, 1 medium, 2 long) of every client, in client order.

    Parameters
    ----------
    sizes : sequence of int
        Local training sample count per client.
    spec : RuntimeCategories
        Shares and ``gamma``.
    seed : int
        Seeds the random part of the score.
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    n = len(sizes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ranks = np.argsort(np.argsort(sizes, kind="stable"), kind="stable") / max(n - 1, 1)
    noise = np.random.default_rng([seed, 6]).random(n)
    score = spec.gamma * noise + (1.0 - spec.gamma) * ranks
    order = np.argsort(-score, kind="stable")
    n_long = int(np.floor(spec.long_fraction * n))
    n_medium = int(np.floor(spec.medium_fraction * n))
    categories = np.zeros(n, dtype=np.int64)
    categories[order[:n_long]] = 2
    categories[order[n_long : n_long + n_medium]] = 1
    return categories


class CategorySampler:
    """Per-job durations from runtime categories; same interface as ``DelaySampler``.

    Durations depend only on ``(seed, client, job number of that client)``.
    Categories are fixed by :meth:`bind_clients`, which the engine calls after
    discovery with every client's sample count.
    """

    state_attributes = ("_jobs_done",)  # categories follow from the seed; job numbers are the only history

    def __init__(self, spec: RuntimeCategories, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self.categories: np.ndarray | None = None
        self._jobs_done: dict[int, int] = {}

    def bind_clients(self, sizes: list[int], label_counts: list[list[int]] | None = None) -> None:
        """Assign every client its category from its sample count."""
        self.categories = assign_categories(sizes, self.spec, self.seed)

    def job_duration(self, client: int) -> float:
        """Uniform draw from the client's category interval."""
        if self.categories is None:
            raise RuntimeError("CategorySampler.bind_clients must run before the first job")
        job = self._jobs_done.get(client, 0)
        self._jobs_done[client] = job + 1
        low, high = self.spec.interval(int(self.categories[client]))
        return float(np.random.default_rng([self.seed, 2, client, job]).uniform(low, high))

    def counts(self) -> dict[str, int]:
        """How many clients each category holds (for the summary)."""
        if self.categories is None:
            return {}
        return {name: int(np.sum(self.categories == i)) for i, name in enumerate(CATEGORIES)}
