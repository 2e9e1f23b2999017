"""Client delay models for the virtual clock.

A job's duration is ``download + train + upload`` (FedRevive paper, Appendix D).
Each component has a distribution whose *mean is persistent per client*: it is
drawn once from a discrete mixture of speed tiers ``{(p_k, mu_k)}`` and then
every job of that client samples around it. A single tier ``mu`` gives all
clients the same mean.

Distributions (``spread`` is the distribution's second parameter):

* ``constant``: always the mean.
* ``uniform``: ``U[max(0, mu - spread), mu + spread]`` (``spread`` = half-width).
* ``exponential``: mean ``mu``.
* ``lognormal``: mean ``mu``, log-space sigma ``spread``.
* ``pareto``: classic Pareto with shape ``spread > 1``, scaled to mean ``mu``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asyncfl.errors import ConfigError

DISTRIBUTIONS = ("constant", "uniform", "exponential", "lognormal", "pareto")
COMPONENTS = ("download", "train", "upload")


@dataclass(frozen=True)
class ComponentDelay:
    """One delay component: a distribution and the speed tiers of its per-client mean.

    Parameters
    ----------
    distribution : str
        One of :data:`DISTRIBUTIONS`.
    tiers : tuple of (probability, mean)
        Mixture the per-client mean is drawn from; probabilities sum to 1.
    spread : float
        Half-width (uniform), sigma (lognormal) or shape (pareto); unused otherwise.
    exact_shares : bool
        Give tier ``k`` exactly ``round(p_k * N)`` of the ``N`` clients (a seeded permutation)
        instead of drawing each client's tier independently, so "a quarter of the clients are
        slow" holds in every run, not on average.
    """

    distribution: str
    tiers: tuple[tuple[float, float], ...]
    spread: float = 0.0
    exact_shares: bool = False

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(f"unknown delay distribution {self.distribution!r}; valid: {', '.join(DISTRIBUTIONS)}")
        if not self.tiers:
            raise ConfigError("a delay component needs at least one tier (probability, mean)")
        probabilities = [p for p, _ in self.tiers]
        if any(p < 0 for p in probabilities) or abs(sum(probabilities) - 1.0) > 1e-6:
            raise ConfigError(f"tier probabilities must be >= 0 and sum to 1, got {probabilities}")
        if any(mean < 0 for _, mean in self.tiers):
            raise ConfigError(f"tier means must be >= 0, got {[m for _, m in self.tiers]}")
        if self.distribution == "pareto" and self.spread <= 1.0:
            raise ConfigError(f"pareto delays need a shape (spread) > 1 for a finite mean, got {self.spread}")
        if self.distribution in ("uniform", "lognormal") and self.spread < 0:
            raise ConfigError(f"{self.distribution} delays need spread >= 0, got {self.spread}")

    def shared_means(self, num_clients: int, rng: np.random.Generator) -> list[float]:
        """Per-client means with tier ``k`` on exactly ``round(p_k * N)`` clients (the last tier takes the rest)."""
        counts = [int(round(p * num_clients)) for p, _ in self.tiers[:-1]]
        counts.append(max(0, num_clients - sum(counts)))
        means = [mean for (_, mean), count in zip(self.tiers, counts) for _ in range(count)][:num_clients]
        return [float(means[i]) for i in rng.permutation(num_clients)]

    def draw_mean(self, rng: np.random.Generator) -> float:
        """Draw one client's persistent mean from the tiers."""
        probabilities = np.array([p for p, _ in self.tiers])
        index = rng.choice(len(self.tiers), p=probabilities / probabilities.sum())
        return float(self.tiers[index][1])

    def sample(self, mean: float, rng: np.random.Generator) -> float:
        """Sample one duration around a client's ``mean``."""
        if mean == 0.0 or self.distribution == "constant":
            return mean
        if self.distribution == "uniform":
            return float(rng.uniform(max(0.0, mean - self.spread), mean + self.spread))
        if self.distribution == "exponential":
            return float(rng.exponential(mean))
        if self.distribution == "lognormal":
            mu = np.log(mean) - 0.5 * self.spread**2
            return float(rng.lognormal(mu, self.spread))
        shape = self.spread  # pareto: x_m * shape / (shape - 1) = mean
        scale = mean * (shape - 1.0) / shape
        return float(scale * (1.0 + rng.pareto(shape)))


@dataclass(frozen=True)
class DelayModel:
    """The three components of a job's duration."""

    download: ComponentDelay
    train: ComponentDelay
    upload: ComponentDelay

    def components(self) -> tuple[tuple[str, ComponentDelay], ...]:
        return (("download", self.download), ("train", self.train), ("upload", self.upload))


@dataclass(frozen=True)
class ClientProfile:
    """One client's persistent mean per component."""

    download: float
    train: float
    upload: float


class DelaySampler:
    """Seeded per-client profiles and per-job durations.

    Profiles depend only on ``(seed, client index)`` and job durations on
    ``(seed, client index, job number of that client)``, so the schedule does
    not depend on the order in which other clients are sampled.
    """

    state_attributes = ("_jobs_done",)  # profiles follow from the seed; job numbers are the only history

    def __init__(self, model: DelayModel, seed: int) -> None:
        self.model = model
        self.seed = seed
        self._profiles: dict[int, ClientProfile] = {}
        self._jobs_done: dict[int, int] = {}
        self._shared: dict[str, list[float]] = {}  # component -> per-client mean (exact_shares components)
        self._components = model.components()

    def bind_clients(self, sizes: list[int], label_counts: list[list[int]] | None = None) -> None:
        """Client sample counts do not matter to component delays (see ``CategorySampler``); their number
        does for components with ``exact_shares``."""
        for name, comp in self.model.components():
            if comp.exact_shares:
                self._shared[name] = comp.shared_means(len(sizes), np.random.default_rng([self.seed, 5]))

    def profile(self, client: int) -> ClientProfile:
        """The persistent means of ``client``."""
        if client not in self._profiles:
            rng = np.random.default_rng([self.seed, 1, client])
            means = {name: comp.draw_mean(rng) for name, comp in self.model.components()}
            for name, shared in self._shared.items():
                if client < len(shared):
                    means[name] = shared[client]
            self._profiles[client] = ClientProfile(**means)
        return self._profiles[client]

    def job_duration(self, client: int) -> float:
        """Duration of the next job of ``client``: download + train + upload."""
        job = self._jobs_done.get(client, 0)
        self._jobs_done[client] = job + 1
        rng = np.random.default_rng([self.seed, 2, client, job])
        profile = self._profiles.get(client) or self.profile(client)
        return sum(comp.sample(getattr(profile, name), rng) for name, comp in self._components)


class FasterClients:
    """A delay sampler whose ``speeds`` clients finish each job ``speed`` times sooner than drawn (attack drills: a
    node faster than its profile, e.g. one that skips training); ``first_at_once`` clients' first job takes no time
    (its reply is the run's first arrival). Every other call goes to the wrapped sampler."""

    def __init__(self, inner, speeds: dict[int, float], first_at_once: frozenset[int] = frozenset()) -> None:
        self.inner, self.speeds, self.first_at_once = inner, dict(speeds), first_at_once
        self._started: set[int] = set()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def job_duration(self, client: int) -> float:
        duration = self.inner.job_duration(client)
        if client in self.first_at_once and client not in self._started:
            self._started.add(client)
            return 1e-9
        return duration / self.speeds.get(client, 1.0)


def parse_tiers(text: str) -> tuple[tuple[float, float], ...]:
    """Parse ``"0.25:1.0,0.5:1.3,0.25:1.6"`` (probability:mean pairs) or a single mean ``"0.1"``."""
    text = text.strip()
    if not text:
        raise ConfigError("empty delay tiers; write a mean like '0.1' or pairs like '0.5:0.15,0.5:0.25'")
    try:
        if ":" not in text:
            return ((1.0, float(text)),)
        pairs = []
        for item in text.split(","):
            probability, mean = item.split(":")
            pairs.append((float(probability), float(mean)))
        return tuple(pairs)
    except ValueError as exc:
        raise ConfigError(
            f"cannot parse delay tiers {text!r}; write a mean like '0.1' or probability:mean pairs like "
            "'0.5:0.15,0.5:0.25'"
        ) from exc
