"""Variant data (the GI paper's Sec. 4.3): clients' and the test split's samples drift over virtual time."""

import numpy as np
import pytest

from asyncfl.config import ConfigError, parse_run_config
from asyncfl.data.drift import DriftConfig, drifted
from asyncfl.data.unlabeled import resized_digits_with_labels
from asyncfl.server_app.engine import AsyncEngine
from asyncfl.server_app.evaluation import DriftingEvaluator
from asyncfl.models import build_model
from tests.fake_grid import FakeGrid
from tests.server_app.test_engine import CODEC, Recording, engine_config, plus_one
from tests.server_app.test_relay import DEFAULTS


def _images(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 1, 28, 28)).astype(np.float32), np.arange(n) % 10


def test_fraction_grows_with_time_and_caps_at_one():
    drift = DriftConfig("inverted", 0.1)
    assert [drift.fraction(t) for t in (0.0, 2.5, 10.0, 50.0)] == [0.0, 0.25, 1.0, 1.0]
    assert DriftConfig().fraction(100.0) == 0.0


def test_inverted_replaces_a_growing_fixed_set_of_rows():
    x, y = _images()
    assert drifted(x, y, 0.0, "inverted", (1, 3)) is x
    early, late = drifted(x, y, 0.25, "inverted", (1, 3)), drifted(x, y, 0.5, "inverted", (1, 3))
    changed_early = {i for i in range(len(x)) if not np.array_equal(early[i], x[i])}
    changed_late = {i for i in range(len(x)) if not np.array_equal(late[i], x[i])}
    assert len(changed_early) == 10 and len(changed_late) == 20 and changed_early < changed_late
    for i in changed_early:
        np.testing.assert_array_equal(early[i], -x[i])
    other_client = drifted(x, y, 0.25, "inverted", (1, 4))
    assert {i for i in range(len(x)) if not np.array_equal(other_client[i], x[i])} != changed_early
    np.testing.assert_array_equal(x, _images()[0])  # the input is never modified


def test_digits_replacements_keep_the_label():
    x, y = _images()
    out = drifted(x, y, 1.0, "digits", (2, 0))
    pool_x, pool_y = resized_digits_with_labels(28, 28)
    for i in range(len(x)):
        match = np.flatnonzero(np.all(pool_x.reshape(len(pool_x), -1) == out[i].reshape(-1), axis=1))
        assert match.size >= 1 and pool_y[match[0]] == y[i]
    np.testing.assert_array_equal(drifted(x, y, 1.0, "digits", (2, 0)), out)  # seeded


def test_bad_drift_settings_are_refused_before_anything_runs():
    base = {**DEFAULTS}
    with pytest.raises(ConfigError, match="drift.source.*none, digits, inverted"):
        parse_run_config({**base, "drift.source": "svhn", "drift.rate": 0.1})
    with pytest.raises(ConfigError, match="drift.rate > 0"):
        parse_run_config({**base, "drift.source": "inverted", "drift.rate": 0.0})
    with pytest.raises(ConfigError, match="mnist5k or mnist"):
        parse_run_config({**base, "dataset": "cifar10", "drift.source": "digits", "drift.rate": 0.1})
    with pytest.raises(ConfigError, match="gossip"):
        parse_run_config({**base, "strategy": "pushcen", "max-time": 5.0, "drift.source": "inverted",
                          "drift.rate": 0.1})
    assert parse_run_config({**base, "drift.source": "digits", "drift.rate": 0.05}).drift.fraction(10.0) == 0.5


def test_drifting_evaluator_scores_the_data_in_effect():
    x, y = _images(50)
    model = build_model("mlp", (1, 28, 28), 10, False, seed=0)
    evaluator = DriftingEvaluator(model, x, y, 25, 10, DriftConfig("inverted", 0.1), seed=1)
    assert evaluator.select(0.0) == 0 and evaluator.x is x
    assert evaluator.select(5.0) == 25 and sum(not np.array_equal(a, b) for a, b in zip(evaluator.x, x)) == 25
    assert evaluator.select(20.0) == 50


def test_engine_re_evaluates_an_unchanged_model_when_the_test_data_drifted():
    calls = []

    class Drifting:
        def select(self, at):
            return int(at // 2)  # the data changes every 2 time units

        def __call__(self, flat):
            calls.append(flat.copy())
            return 0.0, 0.5

    strategy = Recording()
    engine = AsyncEngine(FakeGrid(3, plus_one), strategy, CODEC, np.zeros(3, np.float32),
                         engine_config(strategy, max_arrivals=6), {}, Drifting())
    engine.run()
    # Recording never changes the model: a fixed evaluator is scored once; this one at t = 0, 2 and 4 data sets
    times = [row["time"] for row in engine.stats.evaluations]
    assert len(calls) == len({int(t // 2) for t in times}) > 1
    dispatched = [m for m in engine.grid.pushed if m.metadata.message_type == "train"]
    assert [m.content.config_records["config"]["dispatch-time"] for m in dispatched[:3]] == [0.0, 0.0, 0.0]


def test_client_trains_on_the_share_of_drifted_samples_of_the_job_start():
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

    from asyncfl.client_app.app import train

    def trained(dispatch_time, **drift):
        run_config = {**DEFAULTS, "dataset": "digits", "model": "mlp", "local-steps": 3, **drift}
        model = build_model("mlp", (1, 8, 8), 10, False, seed=0)
        context = Context(run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 4},
                          state=RecordDict(), run_config=run_config)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "config": ConfigRecord({"job-seed": 3, "dispatch-time": dispatch_time})})
        reply = train(Message(content, dst_node_id=5, message_type="train"), context)
        return np.concatenate([a.numpy().ravel() for a in reply.content.array_records["arrays"].values()])

    fixed = trained(8.0)
    drift = {"drift.source": "inverted", "drift.rate": 0.1}
    np.testing.assert_array_equal(trained(0.0, **drift), fixed)  # nothing replaced yet
    assert not np.allclose(trained(8.0, **drift), fixed)  # 80% of the samples inverted
