"""When the global model is scored, and the row each score becomes.

The model is scored at every multiple of ``evaluate-every-time`` clock time, at the end of every
``evaluate_every`` rounds, at the start and at the end, and never twice for the same
version and test data (a repeated point reuses the last score, also for the round it falls in).
Each point also sends the model out for federated evaluation once per round, when a strategy
evaluates on clients.

With ``tail-average-rounds`` N > 1 the model scored (and returned) is the mean of the current model
and the models at the ends of the N - 1 rounds before it (:class:`TailAverage`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from asyncfl.errors import CheckpointError
from asyncfl.server_app.engine_state import EngineStats, FederatedEvaluator, Recorder

EvaluateFn = Callable[[np.ndarray], tuple]


@dataclass(frozen=True)
class ModelState:
    """What a scoring point needs to know about the server at that moment."""

    version: int
    round: int  # the round in progress, from 1 as Flower's (0: the initial model)
    model: np.ndarray
    record: Callable[[], object]  # the version's ArrayRecord, built only if federated evaluation needs it
    clients: list[int]
    rounds_done: int | None = None  # rounds complete (None: ``round``)


class TailAverage:
    """The mean of the models at the last ``rounds`` points that were a round's end or now.

    Polyak and Juditsky, 1992, "Acceleration of stochastic approximation by averaging": the average of
    stochastic iterates has a smaller error than the last one. Averaged here over a window of rounds,
    so the scored model keeps up with training while a model that swings from one round to the next
    (an asynchronous one, whose every stale update moves it) is read at the middle of its swing. At a
    round's end the window is that round's model and the ``rounds - 1`` ends before it; between two
    ends, the current model and the ``rounds - 1`` last ends. Clients never see the mean; they train the
    current model.

    Parameters
    ----------
    rounds : int
        Models averaged (1: the current model as it is).
    to_record : callable, optional
        ``flat model -> ArrayRecord``, for the mean's record (federated evaluation, callbacks).
    """

    state_attributes = ("_ends",)  # what a checkpoint keeps (asyncfl.state)

    def __init__(self, rounds: int = 1, to_record: Callable[[np.ndarray], object] | None = None) -> None:
        self.rounds = rounds
        self.to_record = to_record
        self._ends: deque[tuple[int, np.ndarray]] = deque(maxlen=rounds if rounds > 1 else 0)

    def identity(self, version: int) -> tuple:
        """The server versions the mean at ``version`` averages (as :meth:`mean` picks them): two points with the
        same identity score the same model; () when nothing is averaged."""
        return tuple(v for v, _ in self._averaged(version, None))

    def _averaged(self, version: int, model: np.ndarray | None) -> list[tuple[int, np.ndarray | None]]:
        """The (version, model) pairs the mean at ``version`` averages: the window, or when the model moved since the
        last round's end, the window's newest ``rounds - 1`` and ``model`` (a window exists only with rounds > 1)."""
        ends = list(self._ends)
        if ends and ends[-1][0] != version:
            ends = ends[1 - self.rounds:] + [(version, model)]
        return ends

    def check(self, model: np.ndarray) -> None:
        """Refuse a window (from a checkpoint) whose models do not fit ``model``, the current one, or are not finite."""
        for version, end in self._ends:
            if not isinstance(end, np.ndarray) or end.shape != model.shape or not np.isfinite(end).all():
                raise CheckpointError(f"the checkpoint's tail average holds a model for version {version!r} that is "
                                      f"not a finite array of shape {model.shape}: the file was changed or is damaged; "
                                      "resume from another checkpoint")

    def round_ended(self, version: int, model: np.ndarray) -> None:
        """A round closed with ``model`` (server version ``version``) current: it joins the window."""
        if self.rounds > 1:
            self._ends.append((version, model.copy()))

    def mean(self, version: int, model: np.ndarray) -> np.ndarray:
        """The mean of the window's models, ``model`` (server version ``version``, the current one) included."""
        ends = [end for _, end in self._averaged(version, model)]
        if not ends:
            return model
        total = np.zeros(model.shape, dtype=np.float64)
        for end in ends:
            total += end
        return (total / len(ends)).astype(model.dtype)

    def of(self, state: ModelState) -> ModelState:
        """``state`` with its model averaged (its record built from the mean)."""
        if not self._ends:
            return state
        averaged = self.mean(state.version, state.model)
        return replace(state, model=averaged, record=lambda: self.to_record(averaged))


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
    changed_only : bool
        Skip a scheduled clock point whose model (version and round) the last row already scored, unless the
        test data drifts: on the wall clock points come every few seconds whether or not an update arrived.
    tail : TailAverage, optional
        What is scored: the mean over the last rounds (``tail-average-rounds``); None: the current model.
    """

    state_attributes = ("_next", "_last", "_sent_round", "tail")  # what a checkpoint keeps (asyncfl.state)

    def __init__(self, every_time: float, every_rounds: int, evaluate_fn: EvaluateFn | None, stats: EngineStats,
                 recorder: Recorder | None = None, federated_eval: FederatedEvaluator | None = None,
                 on_row: Callable[[ModelState, dict], None] | None = None, changed_only: bool = False,
                 tail: TailAverage | None = None) -> None:
        self.tail = tail if tail is not None else TailAverage()
        self.every_time = every_time
        self.changed_only = changed_only
        self.every_rounds = every_rounds
        self.evaluate_fn = evaluate_fn
        self.stats = stats
        self.recorder = recorder
        self.federated_eval = federated_eval
        self.on_row = on_row
        self._next = 0.0
        self._last: tuple | None = None
        self._sent_round = -1  # the last round whose model went out for federated evaluation

    def until(self, clock: float, state: Callable[[], ModelState]) -> int:
        """Score at every scheduled point ``<= clock`` (the model in effect is the current one); returns how many
        points were passed, skipped ones (``changed_only``) included."""
        passed = 0
        while self.every_time and self._next <= clock:
            current = state()
            if not (self.changed_only and self._scored(current)):
                self.score(self._next, current)
            self._next += self.every_time
            passed += 1
        return passed

    def _scored(self, state: ModelState) -> bool:
        """Whether the last row scored ``state``'s model on test data that has not changed since."""
        last = self.stats.evaluations[-1] if self.stats.evaluations else None
        return (last is not None and (last["server_version"], last["round"]) == (state.version, state.round)
                and not hasattr(self.evaluate_fn, "select")
                and self._same_mean(state))

    def _same_mean(self, state: ModelState) -> bool:
        """Whether the last score's model averages the versions the mean at ``state`` would (always without one)."""
        return self._last is None or self._last[0][2:] == self.tail.identity(state.version)

    def round_closed(self, round_: int, clock: float, state: Callable[[], ModelState]) -> None:
        """Round ``round_`` closed at ``clock``: its model joins the tail average's window; score it if the round
        schedule says so."""
        if self.tail.rounds > 1:
            current = state()
            self.tail.round_ended(current.version, current.model)
        if self.every_rounds and round_ % self.every_rounds == 0:
            self.score(clock, state())

    def score(self, at: float, state: ModelState, at_end: bool = False) -> None:
        """One row at clock ``at``: the only place rows are made (``at_end``: the run's final point)."""
        state = self.tail.of(state)
        # a round goes out once complete (a point inside the next one sends it), the last one also when partial
        self._send_federated(state.round if at_end or state.rounds_done is None else state.rounds_done, state)
        if self.evaluate_fn is None:
            self.stats.evaluations.append({"time": round(at, 6), "server_version": state.version,
                                           "round": state.round})
            return
        # an evaluator whose test data changes over time (variant data) says which data is in effect at `at`
        key = (state.version, self.evaluate_fn.select(at) if hasattr(self.evaluate_fn, "select") else None,
               *self.tail.identity(state.version))  # a round's end may change the mean, not the version
        if self._last is not None and self._last[0] == key:
            self._reused_for(state.round)
        else:
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

    def _reused_for(self, round_: int) -> None:
        """The last score is reused (same model, same test data) at round ``round_``: an evaluator that keeps its
        results by round (the library's ``evaluate_fn``, Flower's ``evaluate_metrics_serverapp``) gets that
        round's entry too, the one the last row of its score was keyed by (a partial last round that made no new
        version is still reported)."""
        by_round = getattr(self.evaluate_fn, "by_round", None)
        scored = self.stats.evaluations[-1]["round"] if self.stats.evaluations else None
        if isinstance(by_round, dict) and scored in by_round and scored != round_:
            by_round[round_] = by_round[scored]

    def final(self, at: float, state: ModelState) -> None:
        """The last row, unless the last scheduled one already scored this time, round and model (a point at the
        stop's own time scores the model before the updates that arrived at that time: the stop scores again)."""
        last = self.stats.evaluations[-1] if self.stats.evaluations else None
        new_round = bool(self.every_rounds) and last is not None and (last["round"], last["server_version"]) != (
            state.round, state.version)
        other_model = last is not None and (last["server_version"] != state.version or not self._same_mean(state))
        if last is None or last["time"] < at or new_round or other_model:
            self.score(at, state, at_end=True)
        else:  # the model of the last row: its (partial) round still goes out to the ClientApps
            self._send_federated(state.round, self.tail.of(state))

    def _send_federated(self, round_: int, state: ModelState) -> None:
        """Send ``state``'s model for federated evaluation as round ``round_``, once per round; as Flower, the
        ClientApps evaluate each round's model after training, not the initial one (round 0)."""
        if self.federated_eval is not None and round_ > 0 and self._sent_round != round_:
            self._sent_round = round_
            self.federated_eval.dispatch(round_, state.version, state.record(), state.clients)
