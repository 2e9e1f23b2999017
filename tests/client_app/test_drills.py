"""Attack drills: what a poisoned node returns, which nodes make the attack, and bad drill settings."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from asyncfl.client_app.drills import NOISE_SD, apply_fault, check_drill, fault_of
from asyncfl.config import ConfigError, parse_run_config
from tests.server_app.test_relay import DEFAULTS


def record(w, steps=3) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.asarray(w, np.float32)), "steps": Array(np.array([steps], np.int64))})


RECEIVED, TRAINED = record([1.0, 2.0], steps=3), record([1.5, 1.0], steps=7)


@pytest.mark.parametrize("fault, expected", [("sign-flip", [0.5, 3.0]), ("scale", [6.0, -8.0]),
                                             ("flip-scale", [-4.0, 12.0]), ("forged-count", [0.5, 3.0]),
                                             ("replace", [-2.0, -4.0])])
def test_sign_flip_and_scale_move_the_received_model_by_minus_and_ten_times_the_update(fault, expected):
    out = apply_fault(fault, TRAINED, RECEIVED, seed=1)
    assert out["w"].numpy().tolist() == pytest.approx(expected)
    assert out["steps"].numpy().tolist() == [7]  # integer buffers are returned as trained


def test_forged_count_reports_a_billion_examples_and_other_faults_the_honest_count():
    from asyncfl.client_app.drills import FORGED_COUNT, reported_examples
    assert reported_examples("forged-count", 12) == FORGED_COUNT == 10**9
    assert reported_examples("flip-scale", 12) == reported_examples("", 12) == 12


def test_noise_is_drawn_from_the_jobs_seed_at_sd_ten():
    big = record(np.zeros(20000))
    first, again, other = (apply_fault("noise", big, big, seed=s)["w"].numpy() for s in (5, 5, 6))
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert first.std() == pytest.approx(NOISE_SD, rel=0.03)


def test_no_fault_returns_the_trained_model_itself():
    assert apply_fault("", TRAINED, RECEIVED, seed=1) is TRAINED


def test_the_first_partitions_attack_and_a_node_config_fault_wins():
    run = {"drill-attack": "scale", "drill-attackers": 2}
    assert [fault_of({}, run, p) for p in range(4)] == ["scale", "scale", "", ""]
    assert fault_of({"fault": "nan"}, run, 3) == "nan"


@pytest.mark.parametrize("attack, attackers, says", [
    ("flip", 1, "drill-attack='flip' is not valid"),
    ("noise", -1, "drill-attackers=-1 must be an integer >= 0"),
    ("noise", 0, "set both"),
    ("", 2, "set both"),
])
def test_bad_drill_settings_are_refused_before_the_run(attack, attackers, says):
    with pytest.raises(ValueError, match=says):
        check_drill({"drill-attack": attack, "drill-attackers": attackers})
    with pytest.raises(ConfigError, match=says):
        parse_run_config({**DEFAULTS, "drill-attack": attack, "drill-attackers": attackers})


def test_an_in_process_grid_poisons_only_the_attackers_train_replies():
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from asyncfl.simulation.inprocess import InProcessGrid

    app = ClientApp()

    @app.train()
    def train(msg, context):  # one step of +1 on every weight
        trained = ArrayRecord({"w": Array(msg.content["arrays"]["w"].numpy() + 1.0)})
        return Message(RecordDict({"arrays": trained, "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    grid = InProcessGrid(app, 3, {}, drill=("scale", 1))
    sent = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    requests = [Message(RecordDict({"arrays": sent, "config": ConfigRecord({"job-seed": 1})}), dst_node_id=node,
                        message_type="train") for node in grid.get_node_ids()]
    replies = grid.send_and_receive(requests)
    assert [r.content["arrays"]["w"].numpy().tolist() for r in replies] == [[10.0, 10.0], [1.0, 1.0], [1.0, 1.0]]
