"""An update loses its component against the server's descent on trusted data: hand-computed cases, the engine."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from asyncfl import FedAsync, FedBuff
from asyncfl.errors import ConfigError
from asyncfl.server_app.codec import ModelCodec, RejectedReply
from asyncfl.server_app.trusted_direction import TrustedDirection
from asyncfl.strategies.arrival import Arrival
from tests.adversaries import digits_trusted_steps, drill, toy_trusted_step
from tests.fake_grid import FakeGrid

LAYOUT = OrderedDict([("w", np.zeros(3, np.float32)), ("num_batches_tracked", np.zeros((), np.int64))])


def moving_to(target, calls=None):
    """A trusted program that steps the float entries half-way to ``target`` (and counts its calls by version)."""
    def train(version, arrays):
        if calls is not None:
            calls.append(version)
        w = arrays["w"].numpy()
        return ArrayRecord(OrderedDict([("w", Array((w + 0.5 * (np.float32(target) - w)).astype(np.float32))),
                                        ("num_batches_tracked", arrays["num_batches_tracked"])]))
    return train


def arrival(delta, counter=0.0, version=0, base=(0.0, 0.0, 0.0, 0.0)) -> Arrival:
    base = np.asarray(base, np.float32)
    return Arrival(0, version, 0, base + np.asarray([*delta, counter], np.float32), base, 1, 0.0, 0.0)


def check(target=(2.0, 0.0, 0.0), calls=None, kept=4) -> TrustedDirection:
    return TrustedDirection(moving_to(np.asarray(target, np.float32), calls), ModelCodec.from_state(LAYOUT), kept)


def test_an_update_against_the_trusted_descent_loses_that_component_and_nothing_else():
    direction = check()  # the server moves w from 0 towards (2, 0, 0): its direction is e1
    out, against = direction.apply(arrival([-3.0, 1.0, 2.0], counter=5.0))
    assert against
    assert out.delta.tolist() == [0.0, 1.0, 2.0, 5.0]  # the integer counter is not descent: untouched
    assert (direction.checked, direction.projected) == (1, 1)
    assert direction.summary()["trusted-direction-removed-share-mean"] == pytest.approx(3.0 / np.sqrt(14.0), abs=1e-4)


def test_an_update_along_or_across_the_trusted_descent_passes_as_it_came():
    direction = check(target=(1.0, 1.0, 0.0))
    along, across = arrival([1.0, 0.0, 0.0]), arrival([1.0, -1.0, 3.0])  # <., (1,1,0)> = 1 and 0
    assert direction.apply(along) == (along, False) and direction.apply(across) == (across, False)
    assert (direction.checked, direction.projected) == (2, 0)


def test_the_direction_is_taken_at_the_arrivals_base_model():
    direction = check(target=(0.0, 0.0, 0.0))  # from the base (4, 0, 0) the server moves towards 0: -e1
    out, _ = direction.apply(arrival([2.0, 1.0, 0.0], base=(4.0, 0.0, 0.0, 0.0)))
    assert out.delta.tolist() == [0.0, 1.0, 0.0, 0.0] and out.weights.tolist() == [4.0, 1.0, 0.0, 0.0]


def test_the_server_trains_once_per_version_and_again_only_after_the_version_left_its_cache():
    calls = []
    direction = check(calls=calls, kept=2)
    for version in (0, 0, 1, 0, 2, 1, 0):
        direction.apply(arrival([1.0, 0.0, 0.0], version=version))
    # 0 and 1 kept, 0 used last; 2 pushes 1 out, 1 pushes 0 out: each is trained again
    assert calls == [0, 1, 2, 1, 0]
    assert direction.trainings == 5


def test_a_huge_finite_update_is_projected_without_overflow_or_rejected_where_the_projection_overflows():
    direction = check()
    out, _ = direction.apply(arrival([-3e38, 3e38, 0.0]))  # along e1: the remainder is the update's own entries
    assert np.isfinite(out.weights).all() and out.delta[0] == 0.0 and out.delta[1] == pytest.approx(3e38)
    tilted = check(target=(2.0 * np.cos(np.pi / 8), 2.0 * np.sin(np.pi / 8), 0.0))
    out, against = tilted.apply(arrival([-3.4e38, 3.4e38, 0.0]))  # an entry would grow past float32's largest
    assert against and isinstance(out, RejectedReply) and out.reason == "non-finite"


def test_a_base_made_for_one_job_gets_its_own_direction_not_its_versions():
    """W-Pred sends each client a look-ahead of the version: such a base is trained on its own, not cached."""
    calls = []
    direction = check(calls=calls)
    out, _ = direction.apply(arrival([-1.0, 0.0, 0.0], base=(4.0, 0.0, 0.0, 0.0)), shared_base=False)
    assert out.delta[0] == -1.0  # from (4, 0, 0) the server moves towards (2, 0, 0): -1 agrees with it
    direction.apply(arrival([-1.0, 0.0, 0.0]), shared_base=True)  # the version's own model: trained again
    assert calls == [0, 0] and direction.trainings == 2


def test_a_server_function_that_returns_the_model_unmoved_is_said_once_and_checks_nothing(caplog):
    direction = check(target=(0.0, 0.0, 0.0))
    with caplog.at_level("WARNING", logger="asyncfl.engine"):
        for version in range(3):
            direction.apply(arrival([-5.0, 0.0, 0.0], version=version))
    assert [r.message for r in caplog.records if "unmoved" in r.message][:1] and \
        len([r for r in caplog.records if "unmoved" in r.message]) == 1
    assert direction.summary()["trusted-direction-unmoved"] == 3 and direction.checked == 0


def test_what_remains_of_an_update_against_the_descent_is_held_to_the_median_movement_not_three_times_it():
    """Three clients' norms 1, 2, 3 (median 2, the run's bound 3 x 2 = 6). An update (-4, 8, 0) opposing the trusted
    e1 keeps (0, 8, 0), norm 8: clipped to the median 2, where an update of the same remainder that never opposed
    the descent, (0, 8, 0), is clipped at 6 only."""
    import types

    from asyncfl.server_app.participants import ParticipantBounds

    def bounds():
        strategy = types.SimpleNamespace(synchronous=False, update_coefficient=lambda arrival: None)
        slots = types.SimpleNamespace(held_back_checks=0)
        made = ParticipantBounds(3.0, "clip", [None], slots, strategy, check())
        for client, norm in enumerate((1.0, 2.0, 3.0)):
            made.apply(replace_client(arrival([0.0, 0.0, norm]), client))
        return made

    opposed = bounds().apply(replace_client(arrival([-4.0, 8.0, 0.0]), 3))
    assert opposed.delta[:3] == pytest.approx([0.0, 2.0, 0.0])
    orthogonal = bounds().apply(replace_client(arrival([0.0, 8.0, 0.0]), 3))
    assert orthogonal.delta[:3] == pytest.approx([0.0, 6.0, 0.0])
    held = bounds()
    held.apply(replace_client(arrival([-4.0, 5.0, 0.0]), 3))  # held to 2, remembered at its movement 5 (< 6)
    assert held.norm.latest[0][3] == pytest.approx(5.0)  # honest updates held tighter do not drag the median down


def test_with_the_norm_bound_off_only_the_projection_applies():
    import types

    from asyncfl.server_app.participants import ParticipantBounds

    strategy = types.SimpleNamespace(synchronous=False, update_coefficient=lambda arrival: None)
    bounds = ParticipantBounds(0.0, "clip", [None], types.SimpleNamespace(), strategy, check())
    out = bounds.apply(arrival([-4.0, 80.0, 0.0]))
    assert out.delta[:3] == pytest.approx([0.0, 80.0, 0.0])
    assert bounds.summary()["trusted-direction-projected"] == 1 and "update-norm-clipped" not in bounds.summary()


def replace_client(made: Arrival, client: int) -> Arrival:
    from dataclasses import replace

    return replace(made, client_index=client)


def test_a_server_function_that_returns_another_layout_is_a_one_line_error():
    def wrong(version, arrays):
        return ArrayRecord(OrderedDict([("a", Array(np.zeros(3, np.float32)))]))

    direction = TrustedDirection(wrong, ModelCodec.from_state(LAYOUT), 2)
    with pytest.raises(ValueError, match="trusted_train_fn's model for version 0 does not fit") as error:
        direction.apply(arrival([1.0, 0.0, 0.0]))
    assert "\n" not in str(error.value)


def test_start_refuses_a_trusted_train_fn_that_is_not_a_function_before_any_message():
    grid = FakeGrid(4, lambda node, message: None)
    with pytest.raises(ConfigError, match="trusted_train_fn=.* must be a function"):
        FedBuff().start(grid, ArrayRecord({"w": Array(np.zeros(3, np.float32))}), num_rounds=1,
                        train_config=ConfigRecord({}), clock="virtual", delay_model="uniform-speed",
                        trusted_train_fn="trusted.py")
    assert grid.pushed == [] and grid.pull_calls == 0


@pytest.mark.parametrize("strategy", [FedBuff, FedAsync])
def test_a_fast_sign_flipping_node_loses_all_its_pull_and_honest_nodes_lose_nothing(monkeypatch, strategy):
    """Toy learner, one node of eight 3x faster sending received - 10 x its update. Honest toy updates point
    exactly along the server's descent (to the target), the attacker's exactly against it: only the attacker's
    are projected, each losing its whole update, and the run ends where the clean run does."""
    clean, _ = drill(monkeypatch, "toy", strategy(), seed=1)
    attacked, _ = drill(monkeypatch, "toy", strategy(), "flip-scale", speed=3.0, seed=1)
    guarded, summary = drill(monkeypatch, "toy", strategy(), "flip-scale", speed=3.0, seed=1,
                             trusted_train_fn=toy_trusted_step)
    assert summary["trusted-direction-projected"] > 0
    assert summary["trusted-direction-removed-share-mean"] == pytest.approx(1.0, abs=1e-6)
    assert guarded > attacked and guarded == pytest.approx(clean, abs=1e-4)
    assert summary["trusted-direction-trainings"] <= summary["arrivals"]


def test_on_honest_digits_the_trusted_direction_costs_no_accuracy(monkeypatch):
    """Softmax regression on digits, no attacker, the server's trusted set the first 120 training rows."""
    honest, _ = drill(monkeypatch, "digits", FedBuff(), seed=1)
    guarded, summary = drill(monkeypatch, "digits", FedBuff(), seed=1, trusted_train_fn=digits_trusted_steps)
    assert guarded >= honest - 0.02 and summary["trusted-direction-checked"] == summary["arrivals"]
