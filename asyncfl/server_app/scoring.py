"""When the global model is scored, and the row each score becomes.

The model is scored at every multiple of ``eval-every`` clock time, at the end of every
``evaluate_every`` rounds, at the start and at the end, and never twice for the same
version and test data (a repeated point reuses the last score). Each point also sends the
model out for federated evaluation once per round, when a strategy evaluates on clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from asyncfl.server_app.jobs import EngineStats, FederatedEvaluator, Recorder

EvaluateFn = Callable[[np.ndarray], tuple]


@dataclass(frozen=True)
class ModelState:
    """What a scoring point needs to know about the server at that moment."""

    version: int
    round: int
    model: np.ndarray
    record: Callable[[], object]  # the version's ArrayRecord, built only if federated evaluation needs it
    clients: list[int]


class Scoring:
    """Scores the global model on the engine's schedule and records the rows.

    Parameters
    ----------
    every_time : float
        Clock units between scheduled points (0: none by the clock).
    every_rounds : int
        Rounds between scheduled points (0: none by rounds).
    evaluate_fn : EvaluateFn or None
        ``flat model -> (loss, accuracy[, per-class accuracies])``; None: rows without scores.
    stats : EngineStats
        Where rows go (``evaluations``) and the counts they carry.
    recorder, federated_eval : optional
        The run folder; federated evaluation on a sample of nodes.
    on_row : callable, optional
        Called with the model state and each scored row (the run's callbacks).
    """

    state_attributes = ("_next", "_last", "_sent_round")  # what a checkpoint keeps (asyncfl.state)

    def __init__(self, every_time: float, every_rounds: int, evaluate_fn: EvaluateFn | None, stats: EngineStats,
                 recorder: Recorder | None = None, federated_eval: FederatedEvaluator | None = None,
                 on_row: Callable[[ModelState, dict], None] | None = None) -> None:
        self.every_time = every_time
        self.every_rounds = every_rounds
        self.evaluate_fn = evaluate_fn
        self.stats = stats
        self.recorder = recorder
        self.federated_eval = federated_eval
        self.on_row = on_row
        self._next = 0.0
        self._last: tuple | None = None
        self._sent_round = -1  # the last round whose model went out for federated evaluation

    def until(self, clock: float, state: Callable[[], ModelState]) -> None:
        """Score at every scheduled point ``<= clock`` (the model in effect is the current one)."""
        while self.every_time and self._next <= clock:
            self.score(self._next, state())
            self._next += self.every_time

    def round_closed(self, round_: int, clock: float, state: Callable[[], ModelState]) -> None:
        """Round ``round_`` closed at ``clock``: score it if the round schedule says so."""
        if self.every_rounds and round_ % self.every_rounds == 0:
            self.score(clock, state())

    def score(self, at: float, state: ModelState) -> None:
        """One row at clock ``at``: the only place rows are made."""
        # as Flower: the ClientApps evaluate each round's model after training, not the initial one
        if self.federated_eval is not None and state.round > 0 and self._sent_round != state.round:
            self._sent_round = state.round
            self.federated_eval.dispatch(state.round, state.version, state.record(), state.clients)
        if self.evaluate_fn is None:
            self.stats.evaluations.append({"time": round(at, 6), "server_version": state.version,
                                           "round": state.round})
            return
        # an evaluator whose test data changes over time (variant data) says which data is in effect at `at`
        key = (state.version, self.evaluate_fn.select(at) if hasattr(self.evaluate_fn, "select") else None)
        if self._last is None or self._last[0] != key:
            # the app's evaluator is told where the run is (round, version, arrivals); a plain one gets the model
            result = self.evaluate_fn.score(state, self.stats.arrivals) if hasattr(self.evaluate_fn, "score") \
                else self.evaluate_fn(state.model)
            per_class = [round(float(a), 6) for a in result[2]] if len(result) > 2 else None
            self._last = (key, float(result[0]), float(result[1]), per_class)
        _, loss, accuracy, per_class = self._last
        row = {"time": round(at, 6), "server_version": state.version, "arrivals": self.stats.arrivals,
               "rejected": self.stats.rejected_total, "accuracy": round(accuracy, 6), "loss": round(loss, 6),
               "round": state.round}
        if per_class is not None:
            row["class_accuracy"] = per_class
        self.stats.evaluations.append(row)
        if self.recorder is not None:
            self.recorder.on_evaluation(row)
        if self.on_row is not None:
            self.on_row(state, row)

    def final(self, at: float, state: ModelState) -> None:
        """The last row, unless the last scheduled one already scored this time, round and version."""
        last = self.stats.evaluations[-1] if self.stats.evaluations else None
        new_round = bool(self.every_rounds) and last is not None and (last["round"], last["server_version"]) != (
            state.round, state.version)
        if last is None or last["time"] < at or new_round:
            self.score(at, state)
