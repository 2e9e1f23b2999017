"""The two clocks on hand-made jobs: which reply is accepted next, what a job is stamped with."""

import time

import pytest

from asyncfl import protocol
from asyncfl.server_app.clock import VirtualClock, WallClock
from asyncfl.server_app.engine import Job


class FixedDelays:
    def job_duration(self, client):
        return 1.5 + client


def job(message_id, node, finish, seq, sent=None):
    return Job(message_id, node, node - 100, 0, 0.0, finish, seq, time.monotonic() if sent is None else sent)


def test_virtual_clock_waits_for_the_earliest_finish_even_when_later_replies_are_in():
    clock = VirtualClock(FixedDelays())
    in_flight = {"a": job("a", 101, 2.0, 0), "b": job("b", 102, 1.0, 1)}
    inbox = {"a": "reply-a"}
    assert clock.pick(in_flight, inbox, set(), 0.0, timeout=60) is None  # b finishes first and is not back yet
    inbox["b"] = "reply-b"
    picked, reply = clock.pick(in_flight, inbox, set(), 0.0, timeout=60)
    assert (picked.message_id, reply) == ("b", "reply-b") and "a" in inbox


def test_virtual_clock_loses_the_head_job_after_the_timeout_and_stamps_drawn_durations():
    clock = VirtualClock(FixedDelays(), server_time_scale=2.0)
    in_flight = {"a": job("a", 101, 1.0, 0, sent=time.monotonic() - 10)}
    picked, reply = clock.pick(in_flight, {}, set(), 0.0, timeout=5)
    assert picked.message_id == "a" and reply is None
    assert clock.job_duration(2) == 3.5 and clock.request_keys(2) == {}
    assert clock.now(7.25) == 7.25 and clock.server_time(0.5) == 1.0


def test_wall_clock_loses_jobs_on_nodes_that_left_before_accepting_replies():
    clock = WallClock(FixedDelays())
    in_flight = {"a": job("a", 101, 0.0, 0), "b": job("b", 102, 0.0, 1)}
    picked, reply = clock.pick(in_flight, {"a": "reply-a"}, online={101}, last_event=0.0, timeout=60)
    assert (picked.message_id, reply, picked.lost_reason) == ("b", None, "node-offline")
    picked, reply = clock.pick({"a": in_flight["a"]}, {"a": "reply-a"}, online={101}, last_event=0.0, timeout=60)
    assert (picked.message_id, reply) == ("a", "reply-a") and picked.finish >= 0.0


def test_wall_clock_costs_no_server_time_and_asks_emulated_durations_only_when_scaled():
    assert WallClock(FixedDelays()).request_keys(1) == {}
    assert WallClock(FixedDelays(), emulate_delay_scale=0.5).request_keys(1) == {protocol.EMULATE_SECONDS: 1.25}
    assert WallClock(FixedDelays()).job_duration(1) == 0.0 and WallClock(FixedDelays()).server_time(3.0) == 0.0


def test_hold_window_adds_the_measured_start_wait_on_the_wall_clock_only():
    # jobs that train 1 s but come back after 6 s waited 5 s for a worker: a freed slot may wait that long for
    # the next version on top of a tenth of a job's compute; without train-seconds the round trip is the job
    wall = WallClock(FixedDelays())
    assert wall.hold_window(0.1, 6.0) == pytest.approx(0.6)
    for finish, seconds in ((6.0, 1.0), (6.5, 1.2), (5.5, 0.8)):
        wall.observe_train_seconds(Job("m", 101, 1, 0, 0.0, finish, 0, 0.0), seconds)
    assert wall.hold_window(0.1, 6.0) == pytest.approx(0.1 * 1.0 + 5.0)
    wall.observe_train_seconds(Job("m", 101, 1, 0, 0.0, 2.0, 0, 0.0), 3.0)  # longer than its round trip: ignored
    assert len(wall.recent_compute) == 3
    virtual = VirtualClock(FixedDelays())
    virtual.observe_train_seconds(Job("m", 101, 1, 0, 0.0, 6.0, 0, 0.0), 1.0)
    assert virtual.hold_window(0.1, 6.0) == pytest.approx(0.6)


def test_train_seconds_reads_only_a_finite_non_negative_number():
    assert protocol.train_seconds({"train-seconds": 2}) == 2.0
    for metrics in (None, {}, {"train-seconds": float("nan")}, {"train-seconds": -1.0}, {"train-seconds": [1.0]},
                    {"train-seconds": True}, {"train-seconds": float("inf")}):
        assert protocol.train_seconds(metrics) is None
