"""The ``device_speed`` mod: emulated device time as waiting, on a fake clock (nothing sleeps for real)."""

from types import SimpleNamespace

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import MessageType

from asyncfl import protocol
from asyncfl.client_app import device_speed as ds
from asyncfl.client_app.device_speed import DeviceProfile, DeviceSpeed, device_speed


class FakeTime:
    """A clock that moves only when the handler 'computes' or the mod 'sleeps'."""

    def __init__(self):
        self.now = 100.0
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def _message(message_type=MessageType.TRAIN, config=None):
    content = RecordDict({"arrays": ArrayRecord()})
    if config is not None:
        content["config"] = ConfigRecord(config)
    return Message(content, dst_node_id=7, message_type=message_type)


def _context(node_config=None, run_config=None, node_id=7):
    return Context(run_id=1, node_id=node_id, node_config=dict(node_config or {}), state=RecordDict(),
                   run_config=dict(run_config or {}))


def _handler(fake, seconds, metrics=None):
    """A train handler that computes for ``seconds`` of fake time and replies with ``metrics``."""
    calls = []

    def train(msg, context):
        calls.append(msg)
        fake.now += seconds
        content = RecordDict({"arrays": ArrayRecord()})
        if metrics is not None:
            content["metrics"] = MetricRecord(dict(metrics))
        return Message(content, reply_to=msg)

    train.calls = calls
    return train


def _mod(fake, *args, **kwargs):
    return DeviceSpeed(*args, sleep=fake.sleep, clock=fake.clock, **kwargs)


# ------------------------------------------------------------------------------------------- node timing


def test_a_node_5x_slower_waits_4x_its_measured_train_time_and_reports_it_as_training():
    fake = FakeTime()
    reply = _mod(fake)(_message(), _context({"device-slowdown": 5}),
                       _handler(fake, 2.0, {"num-examples": 10, protocol.TRAIN_SECONDS: 2.0}))
    assert fake.slept == [pytest.approx(8.0)]
    assert fake.now == pytest.approx(100.0 + 10.0)  # the job took 5x the handler's 2 s
    assert reply.content["metrics"][protocol.TRAIN_SECONDS] == pytest.approx(10.0)
    assert reply.content["metrics"]["num-examples"] == 10


def test_with_a_nominal_duration_the_job_is_padded_to_slowdown_times_it_whatever_the_host_took():
    fake = FakeTime()
    mod = _mod(fake)
    context = _context({"device-slowdown": 2.0}, {"device-seconds": 3.0})
    mod(_message(), context, _handler(fake, 1.0))
    mod(_message(), context, _handler(fake, 2.5))
    assert fake.slept == [pytest.approx(5.0), pytest.approx(3.5)]  # both jobs last 2 x 3 s


def test_the_requests_emulate_seconds_sets_the_duration_before_any_slowdown():
    fake = FakeTime()
    message = _message(config={protocol.EMULATE_SECONDS: 4.0})
    _mod(fake)(message, _context({"device-slowdown": 10}), _handler(fake, 1.5))
    assert fake.slept == [pytest.approx(2.5)]  # padded to the server's 4 s, as pad_to_emulated_duration did


def test_a_host_slower_than_the_emulated_device_waits_nothing():
    fake = FakeTime()
    _mod(fake)(_message(config={protocol.EMULATE_SECONDS: 1.0}), _context(), _handler(fake, 3.0))
    _mod(fake)(_message(), _context({"device-slowdown": 0.5}), _handler(fake, 3.0))
    assert fake.slept == []


def test_evaluate_and_query_messages_pass_at_once():
    fake = FakeTime()
    mod = _mod(fake)
    for message_type in (MessageType.EVALUATE, MessageType.QUERY):
        handler = _handler(fake, 2.0, {"eval-acc": 0.5})
        reply = mod(_message(message_type), _context({"device-slowdown": 5}), handler)
        assert len(handler.calls) == 1 and dict(reply.content["metrics"]) == {"eval-acc": 0.5}
    assert fake.slept == []


def test_a_train_action_is_slowed_like_train():
    fake = FakeTime()
    _mod(fake)(_message("train.gossip"), _context({"device-slowdown": 3}), _handler(fake, 1.0))
    assert fake.slept == [pytest.approx(2.0)]


def test_a_failing_handler_waits_as_the_device_would_have_computed_and_its_error_is_kept():
    fake = FakeTime()
    mod = _mod(fake)

    def error_reply(msg, context):
        fake.now += 1.0
        return Message(Error(code=0, reason="boom"), reply_to=msg)

    reply = mod(_message(), _context({"device-slowdown": 3}), error_reply)
    assert reply.has_error() and reply.error.reason == "boom"

    def raising(msg, context):
        fake.now += 1.0
        raise RuntimeError("fault injection")

    with pytest.raises(RuntimeError, match="fault injection"):
        mod(_message(), _context({"device-slowdown": 3}), raising)
    assert fake.slept == [pytest.approx(2.0), pytest.approx(2.0)]


# ---------------------------------------------------------------------------------------- pass-through


def test_the_reply_call_next_returns_is_passed_through_unchanged():
    fake = FakeTime()
    replies = []

    def train(msg, context):
        fake.now += 1.0
        replies.append(Message(RecordDict({"arrays": ArrayRecord(), "metrics": MetricRecord({"train_loss": 0.3})}),
                               reply_to=msg))
        return replies[-1]

    message = _message()
    for node_config in ({}, {"device-slowdown": 4}):  # no slowdown; and one that waits
        reply = _mod(fake)(message, _context(node_config), train)
        assert reply is replies[-1]
        assert dict(reply.content["metrics"]) == {"train_loss": 0.3}  # no train-seconds added where none was
        assert reply.metadata.reply_to_message_id == message.metadata.message_id


def test_without_any_setting_the_mod_reads_no_clock_and_waits_nothing():
    def no_clock():
        raise AssertionError("the clock was read")

    reply = DeviceSpeed(sleep=lambda s: None, clock=no_clock)(_message(), _context(), _handler(FakeTime(), 1.0))
    assert not reply.has_error()


@pytest.mark.parametrize("outer", [True, False])
def test_in_a_clientapp_with_report_train_seconds_the_wait_counts_as_training_in_either_order(outer, monkeypatch):
    from asyncfl.client_app import extras

    fake = FakeTime()
    monkeypatch.setattr(extras, "time", SimpleNamespace(monotonic=fake.clock))  # report_train_seconds' clock
    mod = _mod(fake)
    app = ClientApp(mods=[mod, extras.report_train_seconds] if outer else [extras.report_train_seconds, mod])
    app.train()(_handler(fake, 2.0, {"num-examples": 1}))
    reply = app(_message(), _context({"device-slowdown": 3}))
    assert fake.slept == [pytest.approx(4.0)]
    assert reply.content["metrics"][protocol.TRAIN_SECONDS] == pytest.approx(6.0)


def test_the_ready_made_mod_reads_the_run_config(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(ds._DEFAULT, "sleep", fake.sleep)
    monkeypatch.setattr(ds._DEFAULT, "clock", fake.clock)
    run_config = {"device-profile": "all-3x-slower", "device-seed": 1}
    device_speed(_message(), _context({"partition-id": 0, "num-partitions": 4}, run_config), _handler(fake, 1.0))
    assert fake.slept == [pytest.approx(2.0)]


def test_the_builtin_clientapp_applies_emulate_delay_scale_through_the_mod():
    from asyncfl.client_app.app import app

    assert app._mods == [device_speed]


# --------------------------------------------------------------------------------------------- profiles


def test_a_profile_is_parsed():
    profile = DeviceProfile.parse("quarter-5x-slower")
    assert (profile.slow_share, profile.slow_factor, profile.sigma) == (0.25, 5.0, ds.LOGNORMAL_SIGMA)
    assert DeviceProfile.parse("tenth-2.5x-slower").slow_factor == 2.5
    assert DeviceProfile.parse("uniform").fleet(6) == [1.0] * 6
    lognormal = DeviceProfile.parse("lognormal").fleet(6, seed=3)
    assert all(f > 0 for f in lognormal) and len(set(lognormal)) == 6


def test_a_quarter_of_the_partitions_is_5x_slower_the_same_ones_for_the_same_seed():
    profile = DeviceProfile.parse("quarter-5x-slower")
    fleet = profile.fleet(8, seed=42)
    assert fleet.count(5.0) == 2 and len(fleet) == 8
    assert profile.fleet(8, seed=42) == fleet
    assert all(profile.slowdown(42, p, 8) == fleet[p] for p in range(8))
    assert DeviceProfile.parse("quarter-5x-slower", sigma=0).fleet(8, seed=42) == [5.0 if f == 5.0 else 1.0
                                                                                  for f in fleet]
    assert DeviceProfile.parse("half-2x-slower").fleet(10).count(2.0) == 5


def test_without_a_partition_the_profile_deals_by_node_id_deterministically():
    profile = DeviceProfile.parse("half-4x-slower")
    draws = [profile.slowdown(0, node_id=n) for n in range(200)]
    assert draws == [profile.slowdown(0, node_id=n) for n in range(200)]
    assert 0 < draws.count(4.0) < 200  # each node slow with probability 1/2


def test_a_profile_from_the_node_config_gives_the_node_its_partitions_slowdown():
    fake = FakeTime()
    profile = DeviceProfile.parse("quarter-5x-slower", sigma=0)
    slow = profile.fleet(4, seed=9).index(5.0)
    node = {"partition-id": slow, "num-partitions": 4, "device-profile": "quarter-5x-slower"}
    _mod(fake, sigma=0)(_message(), _context(node, {"device-seed": 9}), _handler(fake, 1.0))
    assert fake.slept == [pytest.approx(4.0)]


@pytest.mark.parametrize("name", ["fast", "quarter-5x-faster", "eighth-5x-slower", "quarter-0.5x-slower",
                                  "Quarter-5x-slower", "", 5])
def test_a_wrong_profile_is_refused_in_one_line_naming_the_valid_ones(name):
    with pytest.raises(ValueError) as error:
        DeviceProfile.parse(name)
    text = str(error.value)
    assert "\n" not in text and repr(name) in text
    assert "'uniform'" in text and "'lognormal'" in text and "quarter-5x-slower" in text
    with pytest.raises(ValueError, match="valid: 'uniform'"):
        DeviceSpeed(name)


def test_a_wrong_profile_in_the_config_fails_before_the_handler_runs():
    fake = FakeTime()
    handler = _handler(fake, 1.0)
    with pytest.raises(ValueError, match="device-profile = 'slow' is not a profile; valid: "):
        _mod(fake)(_message(), _context({"device-profile": "slow"}), handler)
    assert handler.calls == [] and fake.slept == []


@pytest.mark.parametrize("node_config, match", [
    ({"device-slowdown": "abc"}, "device-slowdown = 'abc' must be a finite number > 0"),
    ({"device-slowdown": 0}, "device-slowdown = 0 must be a finite number > 0"),
    ({"device-slowdown": -2.0}, "device-slowdown = -2.0 must be"),
    ({"device-profile": "uniform", "device-seed": -1}, "device-seed = -1 must be an integer >= 0"),
    ({"device-profile": "uniform", "device-seed": 1.5}, "device-seed = 1.5 must be an integer >= 0"),
    ({"device-slowdown": 2, "device-seconds": -1}, "device-seconds = -1 must be a finite number >= 0"),
])
def test_a_wrong_value_in_the_node_config_is_refused_in_one_line(node_config, match):
    fake = FakeTime()
    with pytest.raises(ValueError, match=match):
        _mod(fake)(_message(), _context(node_config), _handler(fake, 1.0))


def test_wrong_constructor_values_are_refused():
    with pytest.raises(ValueError, match="device-seed"):
        DeviceSpeed(seed=-3)
    with pytest.raises(ValueError, match="device-seconds"):
        DeviceSpeed(seconds=float("inf"))
    with pytest.raises(ValueError, match="sigma"):
        DeviceSpeed(sigma=-0.1)
