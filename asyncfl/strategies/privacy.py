"""Central differential privacy for asynchronous strategies: clip each update on arrival, noise each server step.

:class:`DifferentialPrivacyServerSideFixedClipping` has the name and the first keywords of
Flower's wrapper (``strategy, noise_multiplier, clipping_norm``) and wraps an asyncfl strategy
whose server step is a weighted sum of updates (FedBuff, FedAsync: :meth:`Strategy.update_coefficient`).
As DP-FedBuff (Huba et al., 2022, "Papaya: Practical, private, and scalable federated learning",
Sec. 5) it clips each arriving update ``Delta = weights - base`` to L2 norm ``C`` over every entry
(McMahan et al., 2018, "Learning differentially private recurrent language models", flat
clipping), lets the strategy take it in, and adds ``N(0, (sigma C c)^2)`` to every entry of each
new model, ``c`` being the largest coefficient any one update has in that step (FedBuff's
``server_lr / B``: noise ``sigma C`` on the buffer's sum, as DP-FedBuff adds it; FedAsync's mixing
weight). The privacy spent is accounted per data owner, every participation counted, converted to
epsilon by Flower's ``RdpAccountant`` (:mod:`asyncfl.strategies.accounting`), and reported in
``summary.json`` as the run goes (``dp-accountant`` names the accountant).

Where the noise comes from. The guarantee holds only while nobody can predict the noise. By
default every release's noise is drawn from the operating system's CSPRNG (``os.urandom``:
``getrandom(2)`` on Linux), 53 random bits per uniform, turned into normals by the Box-Muller
transform (Box and Muller, 1958): no seed, no generator state, nothing in the run folder or the
checkpoints from which it could be regenerated; a resumed run keeps drawing fresh entropy. What is
cryptographically strong: the unpredictability of every bit the noise is made of. What is not: the
floating-point Gaussian itself (it is cut off at 8.57 sigma, the most ``sqrt(-2 ln 2^-53)`` reaches,
and rounded to float32 when added), the textbook approximation Flower's and most DP libraries make
(Mironov, 2012, "On significance of the least significant bits for differential privacy", attacks
such rounding for the Laplace mechanism). numpy's own generators (PCG64) are not used for private
noise: they are not CSPRNGs, and a model coordinate whose step is known (a frozen or unused weight)
shows its noise exactly, from which a PCG64 state can in principle be recovered (Bouillaguet et al.,
2020, "Practical seed-recovery for the PCG pseudo-random number generator"). Reproducible noise is
asked for by name, ``insecure_noise_seed``; ``summary.json`` then says ``"dp-noise": "reproducible
(insecure-noise-seed): not private"``, the seed and the generator's state are saved, and a warning
is logged.

Flower's wrappers work through ``aggregate_train`` over a round of ``num_sampled_clients`` replies and
noise its mean by ``sigma C / num_sampled_clients``; here there is no round to average: the noise
follows each step's own coefficient ``c`` (``1 / num_sampled_clients`` is the case of a mean of that
many updates), so ``num_sampled_clients``, accepted for Flower's signature, sets nothing (one log line
says what the noise follows instead). Flower's ``accountant=`` argument is refused: it is one accountant for
a population whose every release counts for every client alike, where asynchronous participation needs one
account per data owner; the wrapper keeps those and converts them with Flower's own ``RdpAccountant``
(``target_delta`` sets the delta epsilon is reported at).
The engine's adaptive norm bound is off under this wrapper (its threshold, the median of other
clients' norms, would make each step depend on data the noise does not cover); the fixed clip
``C`` bounds every update instead. Federated evaluation is off unless asked for on the wrapper
(``fraction_evaluate``): its replies are computed from client data and not accounted for.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from asyncfl.server_app.participants import l2_norm
from asyncfl.state import StateError, capture, restore
from asyncfl.strategies.accounting import ClientPrivacyLedger
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.settings import ConfigError, StrategyConfig, knob

log = logging.getLogger("asyncfl.privacy")

REMOVED_SEED = ("seed= was removed: DP noise now comes from the operating system's entropy; for reproducible noise, "
                "which is NOT private, pass insecure_noise_seed= (run-config dp.insecure-noise-seed)")

#: Noise entries drawn per call for the OS's entropy (bounds a large model's transient memory at ~64 MiB).
_CHUNK = 1 << 20


def _uniform_from_os(count: int) -> np.ndarray:
    """``count`` uniforms in ``(0, 1]``, 53 random bits each, from the operating system's CSPRNG."""
    words = np.frombuffer(os.urandom(8 * count), dtype=np.uint64)
    return ((words >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53


def os_entropy_normal(size: int) -> np.ndarray:
    """``size`` standard normals (float64) from ``os.urandom``, by the Box-Muller transform."""
    half = (size + 1) // 2
    uniform = _uniform_from_os(2 * half)
    radius = np.sqrt(-2.0 * np.log(uniform[:half]))
    angle = (2.0 * np.pi) * uniform[half:]
    return np.concatenate((radius * np.cos(angle), radius * np.sin(angle)))[:size]


class EntropyNoise:
    """Private noise (the default): drawn from the operating system's entropy, with no state to save or replay."""

    reproducible = False
    label = "os-entropy"

    def normal(self, sd: float, size: int) -> np.ndarray:
        """``size`` float32 draws of ``N(0, sd^2)``."""
        out = np.empty(size, np.float32)
        for start in range(0, size, _CHUNK):
            stop = min(size, start + _CHUNK)
            out[start:stop] = sd * os_entropy_normal(stop - start)
        return out

    def summary(self) -> dict:
        return {"dp-noise": self.label}


class SeededNoise:
    """Reproducible noise from ``insecure_noise_seed``: whoever knows the seed (it is in the summary and the
    checkpoints, with the generator's state) regenerates every release's noise and subtracts it, so a run with
    it is not differentially private. For tests and studies that must repeat exactly."""

    reproducible = True
    label = "reproducible (insecure-noise-seed): not private"

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.generator = np.random.default_rng([seed, 17])

    def normal(self, sd: float, size: int) -> np.ndarray:
        """``size`` float32 draws of ``N(0, sd^2)`` from the seeded generator."""
        return self.generator.normal(0.0, sd, size).astype(np.float32)

    def summary(self) -> dict:
        return {"dp-noise": self.label, "dp-insecure-noise-seed": self.seed}


def _refuse_removed(keywords: dict) -> None:
    """Refuse the keyword ``seed`` (pointing to its successor), Flower's ``accountant`` and any other unknown one."""
    if "seed" in keywords:
        raise ConfigError(REMOVED_SEED)
    if keywords.get("accountant") is not None:
        raise ConfigError("accountant=: Flower's PrivacyAccountant composes one event per round of a FedAvg; an "
                          "asynchronous run has no rounds to compose, so asyncfl keeps one account per data owner "
                          "and converts it with Flower's RdpAccountant itself (summary.json's dp-epsilon at "
                          "target_delta=, dp-accountant). Leave it out")
    keywords.pop("accountant", None)
    if keywords:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(sorted(keywords))}")


def _sampled_clients(value: int | None) -> int | None:
    """Flower's ``num_sampled_clients``, checked as Flower checks it (a positive integer), or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ConfigError(f"num_sampled_clients={value!r} must be a positive integer (or left out: it sets nothing "
                          "in an asynchronous run)")
    return value


def _provisional(client: int) -> str:
    """The ledger key of a client whose owner the engine did not name (a node that rejoins gets a new one)."""
    return f"client-index:{client}"


@dataclass(frozen=True)
class DifferentialPrivacyConfig(StrategyConfig):
    """The wrapper's knobs.

    Parameters
    ----------
    noise_multiplier : float
        ``sigma``: noise sd in units of one update's largest contribution to a step (``C c``).
    clipping_norm : float
        ``C``: every update's L2 norm is clipped to this.
    target_delta : float
        The ``delta`` epsilon is reported at.
    insecure_noise_seed : int or None
        None (the default): the noise comes from the operating system's entropy. An integer seeds it, so that
        the same seed repeats the run, and makes the run NOT private: anyone who has the seed (it is saved in
        the summary and the checkpoints) regenerates the noise.
    """

    label: ClassVar[str] = "DifferentialPrivacyServerSideFixedClipping"
    prefix: ClassVar[str] = "dp"

    noise_multiplier: float = knob(1.0, minimum=0)
    clipping_norm: float = knob(1.0, minimum=0)
    target_delta: float = knob(1e-5, minimum=0)
    insecure_noise_seed: int | None = knob(None)

    def check(self) -> None:
        seed = self.insecure_noise_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            self.fail("insecure_noise_seed", "must be None (noise from the OS's entropy) or an integer >= 0")

    def check_run_config(self, run_config: Mapping[str, Any]) -> None:
        if f"{self.prefix}.seed" in run_config:
            raise ConfigError(REMOVED_SEED)


class DifferentialPrivacyServerSideFixedClipping(Strategy):
    """``strategy`` with each update clipped to ``clipping_norm`` and each server step noised (module docstring).

    Takes Flower's arguments, positional or by name: ``(strategy, noise_multiplier, clipping_norm,
    num_sampled_clients)``.

    Parameters
    ----------
    strategy : Strategy
        The asyncfl strategy to make private: its step must be a weighted sum of the updates with
        coefficients that do not depend on their content (FedBuff with a fixed ``server_lr`` or
        ``pace="stable"``, FedAsync).
    noise_multiplier, clipping_norm, target_delta, insecure_noise_seed
        :class:`DifferentialPrivacyConfig`.
    num_sampled_clients : int, optional
        Flower's argument, accepted so that Flower's call works unchanged; it sets nothing here. Flower
        noises a round's mean of ``num_sampled_clients`` updates by ``sigma C / num_sampled_clients``;
        asyncfl noises each server step by ``sigma C c``, ``c`` the largest share one update has in that
        step (FedBuff: ``server_lr / buffer_size``; FedAsync: its mixing weight), whatever the number of
        clients. A positive integer when given; the run logs one line saying so.
    fraction_evaluate : float, optional
        Federated evaluation under DP: off (0) unless given here, whatever ``strategy`` was built with; its
        replies (loss, accuracy, example counts) are computed from client data and not covered by the
        accounting, which a warning says when it is on.
    """

    config_class = DifferentialPrivacyConfig
    state_attributes = ("ledger", "_pending", "_last_epsilon")
    #: The adaptive per-participant bounds are off under this wrapper (``start`` and an app's own loop): the fixed
    #: clip bounds every update, and a threshold taken from other clients' norms would escape the noise.
    participant_bounds = False

    def __init__(self, strategy: Strategy, noise_multiplier: float = 1.0, clipping_norm: float = 1.0,
                 num_sampled_clients: int | None = None, *, target_delta: float = 1e-5,
                 insecure_noise_seed: int | None = None, fraction_evaluate: float | None = None,
                 **removed: Any) -> None:
        _refuse_removed(removed)
        self.num_sampled_clients = _sampled_clients(num_sampled_clients)
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be an asyncfl strategy (FedBuff, FedAsync, ...), got "
                            f"{type(strategy).__name__}; Flower's own strategies take Flower's DP wrappers")
        self.config = DifferentialPrivacyConfig.from_arguments(locals())
        if clipping_norm <= 0:
            raise ConfigError(f"clipping_norm={clipping_norm} must be > 0 (every update is clipped to it)")
        if not 0 < target_delta < 1:
            raise ConfigError(f"target_delta={target_delta} must be in (0, 1)")
        _check_wrappable(strategy)
        self.strategy = strategy
        self._asked_fraction_evaluate = fraction_evaluate
        self._flower = replace(strategy.flower, fraction_evaluate=fraction_evaluate or 0.0)
        self.ledger = ClientPrivacyLedger(noise_multiplier, target_delta)
        self.noise = EntropyNoise() if insecure_noise_seed is None else SeededNoise(insecure_noise_seed)
        self._owners: dict[int, str] = {}  # client index -> owner (bind_owners); unbound: _provisional(index)
        self._pending: list[tuple[int, float]] = []  # (client, coefficient) of the updates in the coming step
        self._last_epsilon = 0.0

    # the wrapped strategy's identity and Flower options
    @property
    def flower(self):
        """The wrapped strategy's Flower options, federated evaluation off unless ``fraction_evaluate`` was given."""
        return self._flower

    @property
    def name(self) -> str:
        return f"DP({self.strategy.name})"

    @property
    def synchronous(self) -> bool:
        return self.strategy.synchronous

    def overrides(self, hook: str) -> bool:
        """Whether a subclass of this wrapper overrides ``hook`` itself (an ``aggregate_train`` override is then
        refused before the run, :meth:`_aggregate_train_refusal`), or the wrapped strategy does (it delegates)."""
        return (getattr(type(self), hook) is not getattr(DifferentialPrivacyServerSideFixedClipping, hook)
                or self.strategy.overrides(hook))

    def _aggregate_train_refusal(self) -> str:
        name = type(self).__name__
        return (f"{name} overrides aggregate_train, which may combine the updates in any way: no noise scale is "
                "calibrated to it, and start() never calls it on a DP wrapper (the step is the wrapped "
                f"{type(self.strategy).__name__}'s, noised); leave the override out (to log or save models, pass "
                "callbacks=)")

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._remember_in_own_loop(arrays, grid, len(messages))
        return messages

    def _remember_in_own_loop(self, arrays, grid, cohort: int) -> None:
        """In a Flower app's own loop the wrapped strategy sampled the round (``cohort`` nodes); this wrapper
        aggregates it (clipped, noised), from the model the round sent."""
        if not self._in_start:
            self._custom_loop.remember(arrays, len(list(grid.get_node_ids())), cohort)

    def on_start(self, num_clients: int, concurrency: int = 1) -> None:
        super().on_start(num_clients, concurrency)
        self.strategy.trained_entries = getattr(self, "trained_entries", None)
        self.strategy.on_start(num_clients, concurrency=concurrency)
        self._say_what_sets_the_noise()
        self._warn_what_is_not_private()

    def _say_what_sets_the_noise(self) -> None:
        if self.num_sampled_clients is None:
            return
        log.info("differential privacy: num_sampled_clients=%d sets nothing in an asynchronous run: each server "
                 "step gets noise sd noise_multiplier x clipping_norm x c, c the largest share one update has in "
                 "that step (%s), not clipping_norm x noise_multiplier / num_sampled_clients of a round's mean",
                 self.num_sampled_clients, _step_share(self.strategy))

    def _warn_what_is_not_private(self) -> None:
        if self.noise.reproducible:
            log.warning("differential privacy: the noise is reproducible from insecure_noise_seed=%d (saved in "
                        "summary.json and the checkpoints): whoever has the seed regenerates and subtracts it, so "
                        "this run is NOT private", self.noise.seed)
        if self.flower.fraction_evaluate > 0:
            log.warning("federated evaluation on fraction_evaluate=%g of the nodes under differential privacy: its replies (loss, "
                        "accuracy, example counts) are computed from client data and NOT covered by the accounting",
                        self.flower.fraction_evaluate)
        elif self._asked_fraction_evaluate is None and self.strategy.flower.fraction_evaluate > 0:
            log.info("federated evaluation is off under differential privacy (its replies are not covered by the "
                     "accounting); pass fraction_evaluate= to %s to run it anyway", type(self).__name__)

    def dispatch_model(self, client: int, current: np.ndarray) -> np.ndarray | None:
        return self.strategy.dispatch_model(client, current)

    # ------------------------------------------------------------ who owns the data
    def bind_owners(self, owners: Mapping[int, str]) -> None:
        """Key the ledger by who owns each client's data: ``{client index: owner}``.

        The engine's client index is not an owner: a node that leaves and joins again is a new node
        (without SuperNode auth, a new key and node id) and gets a new index. An owner is what stays:
        the node's registered SuperNode public key under SuperNode auth, else the ``partition-id`` it
        reports (e.g. ``"partition-id:3"``). Until an index is bound its charges are kept under
        ``client-index:<i>``; binding it moves them to the owner. Several indices may share an owner
        (one charge per release, their coefficients summed).
        """
        for client, owner in owners.items():
            self._owners[int(client)] = str(owner)
            self.ledger.merge(_provisional(int(client)), str(owner))

    def owner_of(self, client: int) -> str:
        """The ledger key of ``client`` (its bound owner, else ``client-index:<client>``)."""
        return self._owners.get(client) or _provisional(client)

    # ---------------------------------------------------------------- the mechanism
    def clip(self, arrival: Arrival) -> Arrival:
        """``arrival`` with its update scaled to L2 norm at most ``clipping_norm`` (every entry)."""
        norm = l2_norm(arrival.delta)
        return arrival if norm <= self.config.clipping_norm else self._scaled_to_clip(arrival, norm)

    def _scaled_to_clip(self, arrival: Arrival, norm: float) -> Arrival:
        scale = np.float32(self.config.clipping_norm / norm)
        return replace(arrival, weights=arrival.base + scale * arrival.delta)

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        clipped = self.clip(arrival)
        coefficient = float(self.strategy.update_coefficient(clipped))
        self._pending.append((arrival.client_index, coefficient))
        new = self.strategy.on_arrival(clipped, current)
        if new is None:
            return None
        largest = max(c for _, c in self._pending)
        if largest > 0:
            sd = self.config.noise_multiplier * self.config.clipping_norm * largest
            new = new + self.noise.normal(sd, new.size).reshape(new.shape)
            shares: dict[str, float] = {}
            for client, c in self._pending:
                owner = self.owner_of(client)
                shares[owner] = shares.get(owner, 0.0) + c / largest
            self.ledger.compose(shares)
        self._pending = []
        self._report()
        return new

    def _report(self) -> None:
        epsilon = self.ledger.epsilon()
        if math.isinf(epsilon):  # noise_multiplier 0, which Flower's wrappers accept too
            if self.ledger.releases == 1:
                log.warning("privacy spent: epsilon is infinite: noise_multiplier=0 adds no noise, so no release is "
                            "private")
        elif math.floor(epsilon) > math.floor(self._last_epsilon) or self.ledger.releases == 1:
            log.info("privacy spent: epsilon=%.4f at delta=%g after %d releases (the most any owner spent)",
                     epsilon, self.config.target_delta, self.ledger.releases)
        self._last_epsilon = epsilon

    def privacy_spent(self) -> dict:
        """``epsilon`` (the most any owner spent) at ``target_delta``, the releases so far, where the noise comes
        from, which accountant converted it and what the ledger is keyed by."""
        keys = sorted({owner.split(":", 1)[0] for owner in self.ledger.rho}) or ["client-index"]
        return {"dp-epsilon": round(self.ledger.epsilon(), 6), "dp-delta": self.config.target_delta,
                "dp-releases": self.ledger.releases, "dp-noise-multiplier": self.config.noise_multiplier,
                "dp-clipping-norm": self.config.clipping_norm,
                "dp-most-participations": round(self.ledger.worst_rho, 6), **self.noise.summary(),
                "dp-accountant": self.ledger.accountant, "dp-ledger-key": ", ".join(keys)}

    def summary(self) -> dict:
        return {**(self.strategy.summary() or {}), **self.privacy_spent()}

    # ------------------------------------------------------------------- its state
    def state_dict(self) -> dict:
        """The ledger and the wrapped strategy's state; the noise generator's only when it is the insecure seeded
        one (private noise has no state: a resumed run draws fresh entropy)."""
        own = super().state_dict()
        own["wrapped"] = self.strategy.state_dict()
        if self.noise.reproducible:
            own["noise"] = capture(self.noise.generator, "noise")
        return own

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.strategy.load_state_dict(state["wrapped"])
        if self.noise.reproducible:
            self.noise.generator = restore(self.noise.generator, state["noise"], "noise")

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        self.strategy.check_state(state["wrapped"])
        if self.noise.reproducible and "noise" not in state:
            raise StateError("the checkpoint's DP state has no noise generator to continue insecure_noise_seed from")

    def start(self, *args: Any, **kwargs: Any):
        """Flower's ``start`` (:meth:`Strategy.start`), with the engine's adaptive norm bound off: the fixed clip
        bounds every update, and a threshold taken from other clients' norms would escape the noise."""
        if kwargs.get("update_norm_bound", 0.0):
            raise ConfigError(f"update_norm_bound={kwargs['update_norm_bound']}: under differential privacy every "
                              f"update is clipped to clipping_norm={self.config.clipping_norm}; the adaptive bound "
                              "(a median of other clients' norms) would make each step depend on data the noise "
                              "does not cover. Leave it out")
        kwargs["update_norm_bound"] = 0.0
        self.strategy.__dict__["_starting"] = True  # the wrapped strategy's hooks are the engine's too
        try:
            return super().start(*args, **kwargs)
        finally:
            self.strategy.__dict__["_starting"] = False


def _step_share(strategy: Strategy) -> str:
    """What one update's share of a step is for ``strategy``, in words (the run's log line)."""
    buffer_size = getattr(strategy, "buffer_size", None)
    if buffer_size:
        return f"server_lr / buffer_size = {strategy.server_lr:g} / {buffer_size}"
    return "its mixing weight" if hasattr(strategy, "mixing_weight") else "its update coefficient"


def _check_wrappable(strategy: Strategy) -> None:
    """Refuse a strategy whose step is not a weighted sum of the updates with public coefficients."""
    name = type(strategy).__name__
    config = getattr(strategy, "config", None)
    if strategy.overrides("aggregate_train"):
        raise ConfigError(f"{name} overrides aggregate_train, which may combine the updates in any way: no noise "
                          "scale is calibrated to it; wrap a strategy without the override")
    if type(strategy).update_coefficient is Strategy.update_coefficient:
        raise ConfigError(f"{name}'s server step is not a weighted sum of updates with public coefficients, so no "
                          "noise scale bounds one client's effect on it; wrap FedBuff or FedAsync")
    if getattr(config, "aggregation", "mean") != "mean":
        raise ConfigError(f"{name}(aggregation={config.aggregation!r}) combines the buffer by order statistics, not "
                          "a weighted sum: no noise scale is calibrated to it; use aggregation='mean' (the fixed "
                          "clip already bounds every update)")
    if getattr(config, "pace", None) == "measured" and not config.server_lr:
        raise ConfigError(f"{name}(pace='measured') sets its step from the clients' measured updates, which the "
                          "noise does not cover: give it a fixed server_lr, or pace='stable' (set from the "
                          "concurrency alone)")


class DifferentialPrivacyClientSideFixedClipping(DifferentialPrivacyServerSideFixedClipping):
    """Central DP with the clipping done by the clients (Flower's ``fixedclipping_mod`` on the ClientApp).

    Every train request carries ``clipping_norm`` in its config, the key Flower's ``fixedclipping_mod``
    reads; the mod clips the client's update to it before the reply leaves the node. The server then
    noises each step as :class:`DifferentialPrivacyServerSideFixedClipping` does, and checks every
    arriving update: one beyond ``clipping_norm`` (a ClientApp without the mod) is clipped here all
    the same and counted (``dp-clipped-by-server``, itself not noised: it says how many updates
    exceeded the clip, which the accounting does not cover), so the guarantee does not rest on the clients.
    """

    TOLERANCE = 1e-4  # float32 rounding of a norm computed on the client

    def __init__(self, strategy: Strategy, noise_multiplier: float = 1.0, clipping_norm: float = 1.0,
                 num_sampled_clients: int | None = None, *, target_delta: float = 1e-5,
                 insecure_noise_seed: int | None = None, fraction_evaluate: float | None = None,
                 **removed: Any) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients, target_delta=target_delta,
                         insecure_noise_seed=insecure_noise_seed, fraction_evaluate=fraction_evaluate, **removed)
        self.clipped_by_server = 0

    state_attributes = DifferentialPrivacyServerSideFixedClipping.state_attributes + ("clipped_by_server",)

    def configure_train(self, server_round, arrays, config, grid):
        from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._remember_in_own_loop(arrays, grid, len(messages))
        for message in messages:
            for record in message.content.config_records.values():
                record[KEY_CLIPPING_NORM] = float(self.config.clipping_norm)
        return messages

    def clip(self, arrival: Arrival) -> Arrival:
        norm = l2_norm(arrival.delta)
        if norm <= self.config.clipping_norm * (1.0 + self.TOLERANCE):  # the client clipped (up to its rounding)
            return arrival
        self.clipped_by_server += 1
        return self._scaled_to_clip(arrival, norm)

    def privacy_spent(self) -> dict:
        return {**super().privacy_spent(), "dp-clipped-by-server": self.clipped_by_server}
