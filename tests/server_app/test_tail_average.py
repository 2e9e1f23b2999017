"""``tail-average-rounds``: the scored and returned model is the mean over the last rounds (Polyak averaging)."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord

from asyncfl import FedAsync, FedBuff
from asyncfl.callbacks import Callback
from asyncfl.errors import ConfigError
from asyncfl.server_app.engine_state import EngineStats
from asyncfl.server_app.scoring import ModelState, Scoring, TailAverage
from tests.fake_grid import FakeGrid
from tests.test_library import FIXED, client, initial_record


def test_the_mean_is_over_the_last_round_ends_and_the_current_model():
    # Prepare: a window of 3
    tail = TailAverage(3)
    # Execute: rounds end at versions 1, 2, 3 with models 1, 2, 4
    for version, value in ((1, 1.0), (2, 2.0), (3, 4.0)):
        tail.round_ended(version, np.full(2, value, dtype=np.float32))
    # Assert: at the last round's end (version 3 current) the mean of the 3 ends; once the model moved on
    # (version 4, model 8), the current model and the 2 last ends
    assert tail.mean(3, np.full(2, 4.0, dtype=np.float32)).tolist() == pytest.approx([7 / 3, 7 / 3])
    assert tail.mean(4, np.full(2, 8.0, dtype=np.float32)).tolist() == pytest.approx([14 / 3, 14 / 3])
    assert tail.mean(4, np.zeros(2, dtype=np.float32)).dtype == np.float32


def test_a_round_end_on_the_current_version_leaves_the_mean_and_its_identity_as_they_were():
    # Prepare: a window of 2 holding version 0's end; the current model is version 1
    tail = TailAverage(2, to_record=lambda model: model)
    tail.round_ended(0, np.zeros(2, dtype=np.float32))
    current = np.full(2, 2.0, dtype=np.float32)
    before = (tail.identity(1), tail.mean(1, current).tolist())
    # Execute: a round closes on version 1 (no new version)
    tail.round_ended(1, current)
    # Assert: the same two models are averaged, so the score cache and the callbacks see the same model
    assert before == (tail.identity(1), tail.mean(1, current).tolist()) == ((0, 1), [1.0, 1.0])


def test_one_round_is_the_current_model_itself_and_keeps_nothing():
    tail = TailAverage(1)
    tail.round_ended(1, np.ones(2, dtype=np.float32))
    current = np.zeros(2, dtype=np.float32)
    assert tail.mean(2, current) is current and not tail._ends


def test_a_round_end_is_a_copy_not_the_live_array():
    tail = TailAverage(2)
    model = np.ones(2, dtype=np.float32)
    tail.round_ended(1, model)
    model += 10  # a strategy that steps in place must not change the window
    assert tail.mean(2, np.zeros(2, dtype=np.float32)).tolist() == [0.5, 0.5]


def test_scoring_rescores_a_version_when_a_round_end_changed_the_mean():
    # Prepare: score every round; a window of 2
    stats, seen = EngineStats(), []
    scoring = Scoring(0.0, 1, lambda model: seen.append(float(model[0])) or (0.0, float(model[0])), stats,
                      tail=TailAverage(2, to_record=lambda model: model))
    # Execute: round 1 closes at version 1 (model 2), round 2 at version 2 (model 4), round 3 on version 2 still
    for round_, version, value in ((1, 1, 2.0), (2, 2, 4.0), (3, 2, 4.0)):
        state = ModelState(version, round_, np.full(1, value, dtype=np.float32), lambda: None, [0])
        scoring.round_closed(round_, float(round_), lambda: state)
    # Assert: round 1 scores its own end, round 2 the mean of the two ends, round 3 (same version, a new end in
    # the window) is scored again: the mean of version 2's two ends
    assert seen == [2.0, 3.0, 4.0]
    assert [row["round"] for row in stats.evaluations] == [1, 2, 3]


def test_a_round_that_ends_on_the_version_of_the_last_end_is_scored_again_not_read_from_the_cache():
    # Prepare: a window of 2 holding versions 1 (model 10) and 2 (model 20); scores by the clock only
    stats, seen = EngineStats(), []
    tail = TailAverage(2, to_record=lambda model: model)
    scoring = Scoring(2.0, 0, lambda model: seen.append(float(model[0])) or (0.0, float(model[0])), stats, tail=tail)
    for version, value in ((1, 10.0), (2, 20.0)):
        tail.round_ended(version, np.full(1, value, dtype=np.float32))
    current = ModelState(2, 3, np.full(1, 20.0, dtype=np.float32), lambda: None, [0])
    # Execute: a clock point at version 2; then a round closes on version 2 again (a buffer larger than the round)
    # and the run stops there
    scoring.until(0.0, lambda: current)
    scoring.round_closed(3, 1.0, lambda: current)
    scoring.final(1.0, current)
    # Assert: the point scored (10 + 20) / 2; the stop scored the new window (20, 20), which Result.arrays holds too
    assert seen == [15.0, 20.0]
    assert stats.evaluations[-1]["accuracy"] == 20.0 == float(tail.mean(2, current.model)[0])


def test_the_stops_federated_evaluation_gets_the_mean_also_when_the_stop_reuses_the_last_row():
    class Federated:
        sent = []

        def dispatch(self, round_, version, record, clients):
            self.sent.append((round_, float(record[0])))

    # Prepare: a window of 2 with version 1's end (model 2); the current model (version 2) is 4
    tail = TailAverage(2, to_record=lambda model: model)
    tail.round_ended(1, np.full(1, 2.0, dtype=np.float32))
    scoring = Scoring(2.0, 0, lambda model: (0.0, float(model[0])), EngineStats(), federated_eval=Federated(),
                      tail=tail)
    current = ModelState(2, 2, np.full(1, 4.0, dtype=np.float32), lambda: np.full(1, 4.0), [0], rounds_done=1)
    # Execute: a clock point at the stop's time (round 1 goes out), then the stop (round 2 goes out)
    scoring.until(2.0, lambda: current)
    scoring.final(2.0, current)
    # Assert: both carried the mean (2 + 4) / 2, not the current model
    assert Federated.sent == [(1, 3.0), (2, 3.0)]


@pytest.mark.parametrize("end", [np.ones(3, dtype=np.float32), np.array([np.nan, 1.0], dtype=np.float32), [1.0, 1.0]])
def test_a_checkpoints_window_that_does_not_fit_the_model_is_refused(end):
    from asyncfl.errors import CheckpointError

    tail = TailAverage(3)
    tail._ends.append((4, end))  # as a changed checkpoint would restore it
    with pytest.raises(CheckpointError, match="tail average holds a model for version 4"):
        tail.check(np.zeros(2, dtype=np.float32))
    TailAverage(3).check(np.zeros(2, dtype=np.float32))  # an empty window fits


def _run(tail_rounds: int) -> tuple[dict, dict]:
    """A seeded FedAsync run of 5 rounds on the fake Grid: its server-side scores by round, and every model the
    evaluator saw (fc.weight's mean; the model is linear in it)."""
    seen: dict[int, float] = {}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        seen[server_round] = float(arrays.to_torch_state_dict()["fc.weight"].mean())
        return MetricRecord({"accuracy": seen[server_round], "loss": 1.0})

    result = FedAsync(fraction_evaluate=0.0).start(
        FakeGrid(4, client), initial_record(), num_rounds=5, clock="virtual", delay_model=FIXED, concurrency=2,
        seed=3, evaluate_fn=evaluate, update_norm_bound=0.0, tail_average_rounds=tail_rounds)
    final = float(result.arrays.to_torch_state_dict()["fc.weight"].mean())
    return seen, {"final": final, "arrivals": result.summary["arrivals"]}


def test_a_run_scores_and_returns_the_mean_of_the_last_rounds_models_and_trains_the_same():
    # Prepare: the run without averaging: the models at each round's end
    plain, plain_end = _run(1)
    # Execute: the same seeded run, averaged over 3 rounds
    averaged, averaged_end = _run(3)
    # Assert: clients trained the same models (same arrivals, and the raw trajectory is unchanged), each round
    # scored the mean of its own and the two ends before it (round 0, the initial model, is no round's end),
    # and the Result holds the last such mean
    assert averaged_end["arrivals"] == plain_end["arrivals"] == 20
    assert len({round(v, 4) for v in plain.values()}) == 6  # the model moved every round
    for round_, value in averaged.items():
        window = [plain[r] for r in range(max(1, round_ - 2), round_ + 1)] if round_ else [plain[0]]
        assert value == pytest.approx(np.mean(window), abs=1e-5), round_
    assert averaged_end["final"] == pytest.approx(np.mean([plain[3], plain[4], plain[5]]), abs=1e-5)
    assert plain_end["final"] == pytest.approx(plain[5], abs=1e-6)


@pytest.mark.parametrize("rounds", [0, 101, 2.5, "3"])
def test_a_window_that_is_not_1_to_100_rounds_is_refused_before_any_message(rounds):
    grid = FakeGrid(2, client)
    with pytest.raises(ConfigError, match="tail_average_rounds") as refused:
        FedAsync().start(grid, initial_record(), num_rounds=1, clock="virtual", delay_model=FIXED,
                         tail_average_rounds=rounds)
    assert "\n" not in str(refused.value) and not grid.pushed
    assert torch is not None


def _mean_weight(arrays: ArrayRecord) -> float:
    return float(arrays.to_torch_state_dict()["fc.weight"].mean())


@pytest.mark.parametrize("tail_rounds", [1, 3])
def test_a_clock_point_at_the_stops_own_time_does_not_keep_the_final_model_from_being_scored(tail_rounds):
    class Told(Callback):
        rows: list = []

        def on_evaluation(self, info, metrics):
            self.rows.append((info.version, metrics["accuracy"], _mean_weight(info.arrays)))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": _mean_weight(arrays), "loss": 1.0})

    # Prepare / Execute: fixed delays put the stop (two arrivals at t = 10) on a point of the clock's schedule, which
    # is scored before those arrivals are taken in
    told = Told()
    result = FedAsync(fraction_evaluate=0.0).start(
        FakeGrid(4, client), initial_record(), num_rounds=5, clock="virtual", delay_model=FIXED, concurrency=2,
        seed=3, evaluate_fn=evaluate, evaluate_every=0, evaluate_every_time=1.0, update_norm_bound=0.0,
        tail_average_rounds=tail_rounds, callbacks=[told])
    # Assert: the stop scores the model after them (the last server version), the one the Result holds and the
    # callbacks are told last, not the point's model two versions before it
    final = _mean_weight(result.arrays)
    assert result.summary["server-versions"] == 20
    assert result.evaluate_metrics_serverapp[5]["accuracy"] == pytest.approx(final, abs=1e-5)
    assert told.rows[-1][0] == 20 and told.rows[-1][1:] == pytest.approx((final, final), abs=1e-5)
    assert told.rows[-2][0] == 18  # the point at t = 10 scored version 18 and was told too


def test_a_stop_on_a_round_end_that_made_no_version_scores_the_new_window():
    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": _mean_weight(arrays), "loss": 1.0})

    # Prepare / Execute: rounds of 2 arrivals, a version every 4 (round 5 ends on round 4's version 2); a clock point
    # at the stop's time scores the window before round 5's end joins it
    result = FedBuff(buffer_size=4, fraction_train=0.5, fraction_evaluate=0.0).start(
        FakeGrid(4, client), initial_record(), num_rounds=5, clock="virtual", delay_model=FIXED, seed=3,
        evaluate_fn=evaluate, evaluate_every=0, evaluate_every_time=0.5, update_norm_bound=0.0, tail_average_rounds=3)
    # Assert: the last row is the mean the Result holds (the ends of rounds 3, 4 and 5: versions 1, 2, 2), not the
    # one the point scored before round 5's end joined the window (the ends of rounds 2, 3 and 4: versions 1, 1, 2)
    scores = {r: m["accuracy"] for r, m in result.evaluate_metrics_serverapp.items()}
    assert result.summary["server-versions"] == 2 and max(scores) == 5
    assert scores[5] == pytest.approx(_mean_weight(result.arrays), abs=1e-5) and scores[5] != pytest.approx(scores[4])
