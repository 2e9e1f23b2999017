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
weight). The privacy spent is accounted per client, every participation counted
(:mod:`asyncfl.strategies.accounting`), and reported in ``summary.json`` as the run goes.

Flower's wrapper does not apply here: it works through ``aggregate_train`` over a round of
replies (and ``num_sampled_clients`` of them), which an asynchronous strategy never calls.
The engine's adaptive norm bound is off under this wrapper (its threshold, the median of other
clients' norms, would make each step depend on data the noise does not cover); the fixed clip
``C`` bounds every update instead.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from asyncfl.server_app.update_bound import l2_norm
from asyncfl.strategies.accounting import ClientPrivacyLedger
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.settings import ConfigError, StrategyConfig, knob

log = logging.getLogger("asyncfl.privacy")


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
    seed : int
        Seeds the noise (the same seed, the same run).
    """

    label: ClassVar[str] = "DifferentialPrivacyServerSideFixedClipping"
    prefix: ClassVar[str] = "dp"

    noise_multiplier: float = knob(1.0, minimum=0)
    clipping_norm: float = knob(1.0, minimum=0)
    target_delta: float = knob(1e-5, minimum=0)
    seed: int = knob(0)


class DifferentialPrivacyServerSideFixedClipping(Strategy):
    """``strategy`` with each update clipped to ``clipping_norm`` and each server step noised (module docstring).

    Parameters
    ----------
    strategy : Strategy
        The asyncfl strategy to make private: its step must be a weighted sum of the updates with
        coefficients that do not depend on their content (FedBuff with a fixed ``server_lr`` or
        ``pace="stable"``, FedAsync).
    noise_multiplier, clipping_norm, target_delta, seed
        :class:`DifferentialPrivacyConfig`.
    """

    config_class = DifferentialPrivacyConfig
    state_attributes = ("ledger", "_rng", "_pending", "_last_epsilon")

    def __init__(self, strategy: Strategy, noise_multiplier: float = 1.0, clipping_norm: float = 1.0, *,
                 target_delta: float = 1e-5, seed: int = 0) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be an asyncfl strategy (FedBuff, FedAsync, ...), got "
                            f"{type(strategy).__name__}; Flower's own strategies take Flower's DP wrappers")
        self.config = DifferentialPrivacyConfig(noise_multiplier=noise_multiplier, clipping_norm=clipping_norm,
                                                target_delta=target_delta, seed=seed)
        if clipping_norm <= 0:
            raise ConfigError(f"clipping_norm={clipping_norm} must be > 0 (every update is clipped to it)")
        if not 0 < target_delta < 1:
            raise ConfigError(f"target_delta={target_delta} must be in (0, 1)")
        if type(strategy).update_coefficient is Strategy.update_coefficient:
            raise ConfigError(f"{type(strategy).__name__}'s server step is not a weighted sum of updates with "
                              "public coefficients, so no noise scale bounds one client's effect on it; wrap "
                              "FedBuff or FedAsync")
        if getattr(getattr(strategy, "config", None), "aggregation", "mean") != "mean":
            raise ConfigError(f"{type(strategy).__name__}(aggregation={strategy.config.aggregation!r}) combines the "
                              "buffer by order statistics, not a weighted sum: no noise scale is calibrated to it; "
                              "use aggregation='mean' (the fixed clip already bounds every update)")
        if getattr(getattr(strategy, "config", None), "pace", None) == "measured" and not strategy.config.server_lr:
            raise ConfigError(f"{type(strategy).__name__}(pace='measured') sets its step from the clients' measured "
                              "updates, which the noise does not cover: give it a fixed server_lr, or "
                              "pace='stable' (set from the concurrency alone)")
        self.strategy = strategy
        self.ledger = ClientPrivacyLedger(noise_multiplier, target_delta)
        self._rng = np.random.default_rng([seed, 17])
        self._pending: list[tuple[int, float]] = []  # (client, coefficient) of the updates in the coming step
        self._last_epsilon = 0.0

    # the wrapped strategy's identity and Flower options
    @property
    def flower(self):
        return self.strategy.flower

    @property
    def name(self) -> str:
        return f"DP({self.strategy.name})"

    @property
    def synchronous(self) -> bool:
        return self.strategy.synchronous

    def overrides(self, hook: str) -> bool:
        return self.strategy.overrides(hook)

    def configure_train(self, server_round, arrays, config, grid):
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def on_start(self, num_clients: int, concurrency: int = 1) -> None:
        super().on_start(num_clients, concurrency)
        self.strategy.trained_entries = getattr(self, "trained_entries", None)
        self.strategy.on_start(num_clients, concurrency=concurrency)

    def dispatch_model(self, client: int, current: np.ndarray) -> np.ndarray | None:
        return self.strategy.dispatch_model(client, current)

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
            new = new + self._rng.normal(0.0, sd, new.shape).astype(np.float32)
            shares: dict[int, float] = {}
            for client, c in self._pending:
                shares[client] = shares.get(client, 0.0) + c / largest
            self.ledger.compose(shares)
        self._pending = []
        self._report()
        return new

    def _report(self) -> None:
        epsilon = self.ledger.epsilon()
        if math.floor(epsilon) > math.floor(self._last_epsilon) or self.ledger.releases == 1:
            log.info("privacy spent: epsilon=%.4f at delta=%g after %d releases (the most any client spent)",
                     epsilon, self.config.target_delta, self.ledger.releases)
        self._last_epsilon = epsilon

    def privacy_spent(self) -> dict:
        """``epsilon`` (the most any client spent) at ``target_delta``, and the releases so far."""
        return {"dp-epsilon": round(self.ledger.epsilon(), 6), "dp-delta": self.config.target_delta,
                "dp-releases": self.ledger.releases, "dp-noise-multiplier": self.config.noise_multiplier,
                "dp-clipping-norm": self.config.clipping_norm,
                "dp-most-participations": round(self.ledger.worst_rho, 6)}

    def summary(self) -> dict:
        return {**(self.strategy.summary() or {}), **self.privacy_spent()}

    # ------------------------------------------------------------------- its state
    def state_dict(self) -> dict:
        own = super().state_dict()
        own["wrapped"] = self.strategy.state_dict()
        return own

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.strategy.load_state_dict(state["wrapped"])

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        self.strategy.check_state(state["wrapped"])

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


class DifferentialPrivacyClientSideFixedClipping(DifferentialPrivacyServerSideFixedClipping):
    """Central DP with the clipping done by the clients (Flower's ``fixedclipping_mod`` on the ClientApp).

    Every train request carries ``clipping_norm`` in its config, the key Flower's ``fixedclipping_mod``
    reads; the mod clips the client's update to it before the reply leaves the node. The server then
    noises each step as :class:`DifferentialPrivacyServerSideFixedClipping` does, and checks every
    arriving update: one beyond ``clipping_norm`` (a ClientApp without the mod) is clipped here all
    the same and counted (``dp-clipped-by-server``), so the guarantee does not rest on the clients.
    """

    TOLERANCE = 1e-4  # float32 rounding of a norm computed on the client

    def __init__(self, strategy: Strategy, noise_multiplier: float = 1.0, clipping_norm: float = 1.0, *,
                 target_delta: float = 1e-5, seed: int = 0) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, target_delta=target_delta, seed=seed)
        self.clipped_by_server = 0

    state_attributes = DifferentialPrivacyServerSideFixedClipping.state_attributes + ("clipped_by_server",)

    def overrides(self, hook: str) -> bool:
        return hook == "configure_train" or self.strategy.overrides(hook)

    def configure_train(self, server_round, arrays, config, grid):
        from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
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
