"""Step 3b's opt-in part: no update moves the model against the descent the server sees on data it trusts.

With ``trusted_train_fn`` (a :meth:`~asyncfl.strategies.base.Strategy.start` keyword), the server trains the
model an update was computed from on data of its own that no client controls, and takes the difference as
the trusted direction ``s``. An arriving update ``Delta`` whose component along ``s`` is negative loses that
component (trained entries only: BatchNorm statistics and integer counters are not descent)::

    Delta' = Delta - min(0, <Delta, s_hat>) s_hat,        s_hat = s / ||s||

An update that agrees with the trusted descent, or is orthogonal to it, passes unchanged. One that pointed
against it keeps only its part orthogonal to ``s``, and the norm bound (:class:`~asyncfl.server_app.participants.UpdateNormBound`)
holds that part to the participants' median movement (multiple 1 instead of ``update-norm-bound``): an update
that opposed the server's descent has no claim to the headroom the bound leaves large honest updates. A
sign-flipped update of ten times an honest norm thus moves the model no further than a median honest update,
and not backwards. The rule has no threshold to tune.

It takes the trusted-data reference of Zeno++ (Xie, Koyejo and Gupta, 2020, "Zeno++: Robust fully
asynchronous SGD", which scores an update by its descent on a trusted gradient) and of AFLGuard (Fang, Liu,
Gong and Bentley, 2022, "AFLGuard: Byzantine-robust asynchronous federated learning", which accepts an update
close to the server's own update on trusted data). Both reject. Here the opposing component is removed
instead: late in a run honest updates are mostly SGD noise and point against the trusted direction about as
often as along it, and the server's held-out data has a larger gradient than the clients' fitted data, so a
distance or sign test drops honest work (the study's probe: ``benchmarks/adversaries/README.md``). Removing the
component alone left the attacker's orthogonal remainder at three times an honest norm (the ablation there).

What it does not stop (``docs/security.md``): an update orthogonal to ``s`` (it passes whole, up to the norm
bound), an attacker who knows the server's data, and a trusted set unlike the clients' data (``s`` then
points elsewhere and honest updates lose their opposing parts too).

The server trains once per model version that updates arrive from (a small cache of recent versions); the
function is given the version number so that its randomness can be seeded by it: a resumed run then
computes the same directions as the run it continues.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Callable

import numpy as np
from flwr.app import ArrayRecord

from asyncfl.server_app.codec import ModelCodec, RejectedReply
from asyncfl.strategies.arrival import Arrival

log = logging.getLogger("asyncfl.engine")

TrustedTrainFn = Callable[[int, ArrayRecord], ArrayRecord]


#: The most versions whose directions are kept (float32, one model each); an older one is trained again if asked.
MOST_VERSIONS_KEPT = 16


class TrustedDirection:
    """Removes each update's component against the server's update on trusted data (module docstring).

    Parameters
    ----------
    train_fn : callable
        ``(server_version, ArrayRecord) -> ArrayRecord``: the model of that version trained on the server's
        trusted data (the same local program as the clients' is the natural choice).
    codec : ModelCodec
        The run's model layout: the trained entries, and the records ``train_fn`` receives and returns.
    versions_kept : int
        How many versions' directions are kept (about the jobs in flight, at most ``MOST_VERSIONS_KEPT``).
    """

    state_attributes = ("checked", "projected", "trainings", "removed_share", "unmoved")

    def __init__(self, train_fn: TrustedTrainFn, codec: ModelCodec, versions_kept: int) -> None:
        self.train_fn = train_fn
        self.codec = codec
        self.mask = codec.trained_entries()  # None: every entry is trained
        self.versions_kept = max(1, min(versions_kept, MOST_VERSIONS_KEPT))
        self._directions: OrderedDict[int, np.ndarray | None] = OrderedDict()
        self.checked = 0  # arrivals compared with a trusted direction
        self.projected = 0  # arrivals that lost a component against it
        self.trainings = 0  # calls of train_fn
        self.removed_share = 0.0  # sum over projected arrivals of the removed component's share of the norm
        self.unmoved = 0  # calls whose model came back unmoved (nothing to judge by)
        self.seconds = 0.0  # time in train_fn (not checkpointed: a resumed run counts its own)

    def apply(self, arrival: Arrival, shared_base: bool = True,
              delta: np.ndarray | None = None) -> tuple[Arrival | RejectedReply, bool]:
        """``arrival`` with its component against the trusted direction at its base removed, and whether it had
        one (the norm bound then holds the rest to the median: :class:`ParticipantBounds`).

        ``shared_base``: the arrival's base is its version's global model, so the version's direction serves
        every job of it; False for a base made for this job (W-Pred's look-ahead), trained on its own. ``delta``:
        ``arrival.delta`` when the caller has it."""
        unit = self.direction(arrival.base_version, arrival.base, cached=shared_base)
        if unit is None:  # the trusted data does not move this model: nothing to judge by
            return arrival, False
        self.checked += 1
        delta = arrival.delta if delta is None else delta
        update = (delta if self.mask is None else delta[self.mask]).astype(np.float64)
        along = float(np.dot(update, unit))  # float64: a huge finite update cannot overflow
        if along >= 0.0:
            return arrival, False
        self.projected += 1
        norm = float(np.linalg.norm(update))
        self.removed_share += -along / norm if norm > 0 else 0.0
        entries = slice(None) if self.mask is None else self.mask
        with np.errstate(over="ignore", invalid="ignore"):
            projected = (arrival.base[entries].astype(np.float64) + update - along * unit).astype(np.float32)
        if not np.isfinite(projected).all():  # an entry near float32's limit can grow when a component leaves
            return RejectedReply("non-finite", "the update less its component against the trusted descent "
                                               "overflows float32"), True
        weights = arrival.weights.copy()
        weights[entries] = projected
        return replace(arrival, weights=weights), True

    def direction(self, version: int, base: np.ndarray, cached: bool = True) -> np.ndarray | None:
        """The unit trusted direction (trained entries) at ``base``, the model of ``version``; None when the trusted
        data does not move it. ``cached``: kept for, and taken from, the version's other jobs."""
        if cached and version in self._directions:
            self._directions.move_to_end(version)
            return self._directions[version]
        unit = self._train(version, base)
        if cached:
            self._directions[version] = unit
            if len(self._directions) > self.versions_kept:
                self._directions.popitem(last=False)
        return unit

    def _train(self, version: int, base: np.ndarray) -> np.ndarray | None:
        """``train_fn`` at ``base``: the unit step it takes (float32), or None for no step."""
        started = time.perf_counter()
        trained = self.train_fn(version, self.codec.to_record(base))
        self.seconds += time.perf_counter() - started
        self.trainings += 1
        if not isinstance(trained, ArrayRecord):
            raise TypeError(f"trusted_train_fn returned {type(trained).__name__} for version {version}; it must return "
                            "the trained model as an ArrayRecord of the model's layout")
        try:
            weights = self.codec.decode(trained)
        except RejectedReply as exc:  # the server's own function: its error stops the run, with what was wrong
            raise ValueError(f"trusted_train_fn's model for version {version} does not fit the run's model "
                             f"({exc.reason}: {exc}); "
                             "it must return the model it was given, trained (same names, shapes, dtypes, finite)") \
                from None
        step = weights.astype(np.float64) - base.astype(np.float64)
        step = step if self.mask is None else step[self.mask]
        norm = float(np.linalg.norm(step))
        if norm > 0:
            return (step / norm).astype(np.float32)
        if not self.unmoved:
            log.warning("trusted_train_fn returned the model of version %d unmoved: updates from it are not checked "
                        "(is the server's data or learning rate empty?)", version)
        self.unmoved += 1
        return None

    def summary(self) -> dict:
        """The check's figures for ``summary.json``."""
        return {"trusted-direction-checked": self.checked, "trusted-direction-projected": self.projected,
                "trusted-direction-removed-share-mean": round(self.removed_share / self.projected, 4)
                if self.projected else 0.0,
                "trusted-direction-trainings": self.trainings, "trusted-direction-unmoved": self.unmoved,
                "trusted-direction-seconds": round(self.seconds, 3)}
