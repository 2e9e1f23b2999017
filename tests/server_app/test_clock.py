"""The two clocks on hand-made jobs: which reply is accepted next, what a job is stamped with."""

import time

import numpy as np
import pytest

from asyncfl import protocol
from asyncfl.server_app.clock import CAP_AFTER_REPLIES, ClientWindow, VirtualClock, WallClock
from asyncfl.server_app.engine import Job
from asyncfl.server_app.engine_state import WORKER_NAMES, EngineStats


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
    assert clock.new_job(2) == (3.5, {})
    assert clock.now(7.25) == 7.25


def test_wall_clock_loses_jobs_on_nodes_that_left_before_accepting_replies():
    clock = WallClock(FixedDelays())
    in_flight = {"a": job("a", 101, 0.0, 0), "b": job("b", 102, 0.0, 1)}
    picked, reply = clock.pick(in_flight, {"a": "reply-a"}, online={101}, last_event=0.0, timeout=60)
    assert (picked.message_id, reply, picked.lost_reason) == ("b", None, "node-offline")
    picked, reply = clock.pick({"a": in_flight["a"]}, {"a": "reply-a"}, online={101}, last_event=0.0, timeout=60)
    assert (picked.message_id, reply) == ("a", "reply-a") and picked.finish >= 0.0


def test_wall_clock_costs_no_server_time_and_asks_emulated_durations_only_when_scaled():
    assert WallClock(FixedDelays()).new_job(1) == (0.0, {})
    assert WallClock(FixedDelays(), emulate_delay_scale=0.5).new_job(1) == (0.0, {protocol.EMULATE_SECONDS: 1.25})
    assert WallClock(FixedDelays()).server_time_scale == 0.0


def test_hold_window_adds_the_measured_start_wait_on_the_wall_clock_only():
    # jobs that train 1 s but come back after 6 s waited 5 s for a worker: a freed slot may wait that long for
    # the next version on top of a tenth of a job's compute; without train-seconds the round trip is the job
    out = {"a": Job("a", 101, 1, 0, 2.0, 0.0, 0, 0.0), "b": Job("b", 102, 2, 0, 1.0, 0.0, 1, 0.0)}
    wall = WallClock(FixedDelays())
    assert wall.next_version(out, 1, 0.1) is None  # no job came back yet: no estimate of a job's duration
    wall.recent_durations.extend([6.0, 6.0])
    due, window = wall.next_version(out, 2, 0.1)  # the second job due: b at 1 + 6, a at 2 + 6
    assert due == 8.0 and window == pytest.approx(0.6)
    for finish, seconds in ((6.0, 1.0), (6.5, 1.2), (5.5, 0.8)):
        wall.observe_train_seconds(Job("m", 101, 1, 0, 0.0, finish, 0, 0.0), seconds, 3)
    assert wall.next_version(out, 1, 0.1)[1] == pytest.approx(0.1 * 1.0 + 5.0)
    wall.observe_train_seconds(Job("m", 101, 1, 0, 0.0, 2.0, 0, 0.0), 3.0, 3)  # longer than its round trip: ignored
    assert len(wall.reported) == 3
    virtual = VirtualClock(FixedDelays())
    virtual.observe_train_seconds(Job("m", 101, 1, 0, 0.0, 6.0, 0, 0.0), 1.0, 3)
    drawn = {"a": Job("a", 101, 1, 0, 0.0, 6.0, 0, 0.0), "b": Job("b", 102, 2, 0, 1.0, 3.0, 1, 0.0)}
    assert virtual.next_version(drawn, 1, 0.1) == (3.0, pytest.approx(0.1 * 4.0))  # finishes as drawn; median 4


def test_train_seconds_reads_only_a_finite_non_negative_number():
    assert protocol.train_seconds({"train-seconds": 2}) == 2.0
    for metrics in (None, {}, {"train-seconds": float("nan")}, {"train-seconds": -1.0}, {"train-seconds": [1.0]},
                    {"train-seconds": True}, {"train-seconds": float("inf")}):
        assert protocol.train_seconds(metrics) is None


def _observe(clock, jobs, processes=2):
    """``jobs``: (train seconds, wait to start, jobs in flight) per accepted reply, trained in turn by ``processes``
    processes (0: replies name none)."""
    for i, (train, wait, in_flight) in enumerate(jobs):
        clock.observe_train_seconds(Job("m", 101, 1, 0, 0.0, train + wait, 0, 0.0), train, in_flight,
                                    f"host:{i % processes}" if processes else None)


def test_in_flight_cap_is_the_measured_parallelism_plus_one_on_the_wall_clock_only():
    # 10 jobs out, each trains 1 s; one started after 1 s (transport), seven queued 3 s: a round trip of 3.75 s on
    # average, of which 2 s every job pays, so the workers run 10 x 2 / 3.75 = 5.33 jobs at once: cap 7
    wall = WallClock(FixedDelays())
    _observe(wall, [(1.0, 1.0, 10)] + [(1.0, 3.0, 10)] * 6, processes=6)
    assert wall.parallelism() is None and wall.in_flight_cap(10) == 10  # 7 replies: not measured yet
    _observe(wall, [(1.0, 3.0, 10)], processes=6)
    assert wall.parallelism() == pytest.approx(10 * 2.0 / 3.75)
    assert wall.in_flight_cap(10) == 7 and wall.in_flight_cap(6) == 6  # never above concurrency
    virtual = VirtualClock(FixedDelays())
    _observe(virtual, [(1.0, 3.0, 10)] * 8)
    assert virtual.in_flight_cap(10) == 10


def test_in_flight_cap_never_below_the_processes_that_train_and_only_where_they_are_fewer_than_the_jobs():
    # the same replies: 2 processes trained them (the waits are a queue): at least 2 + 1; 10 processes or
    # replies that name none (a wait may be a SuperNode's idle poll, and a node trains one job at a time): no cap
    replies = [(1.0, 1.0, 10)] + [(1.0, 3.0, 10)] * 15  # 10 x 2 / 3.875 = 5.2 at once
    for processes, cap in ((2, 7), (10, 10), (0, 10)):
        wall = WallClock(FixedDelays())
        _observe(wall, replies, processes)
        assert wall.in_flight_cap(10) == cap
    # 4 processes, and every job waited 9 s beyond the shortest wait: 10 x 1 / 9.75 = 1.03 at once by Little's law,
    # but 4 processes trained: the cap keeps 4 + 1
    wall = WallClock(FixedDelays())
    _observe(wall, [(1.0, 0.0, 10)] + [(1.0, 9.0, 10)] * 31, processes=4)
    assert wall.parallelism() == pytest.approx(10 * 1.0 / (1.0 + 279 / 32)) and wall.in_flight_cap(10) == 5


def test_in_flight_cap_grows_back_when_nothing_queues():
    # 4 jobs out and none waits beyond the 0.2 s every job pays: the workers could run more, the cap offers one more
    wall = WallClock(FixedDelays())
    _observe(wall, [(1.0, 0.2, 4)] * 8)
    assert wall.parallelism() == pytest.approx(4.0) and wall.in_flight_cap(10) == 5
    _observe(wall, [(1.0, 0.2, 5)] * 32)  # the window holds the latest 32 replies
    assert wall.in_flight_cap(10) == 6


def _report(clock, client, train, wait, in_flight=10, process=None):
    clock.observe_train_seconds(Job("m", 100 + client, client, 0, 0.0, train + wait, 0, 0.0), train, in_flight,
                                process)


def test_a_client_holds_at_most_three_even_shares_of_a_window():
    window = ClientWindow(8)
    kept = [window.add(0, i, clients=4) for i in range(10)]  # an even share of 8 among 4 clients is 2: at most 6
    assert kept == [True] * 6 + [False] * 4 and window.counts == {0: 6}
    assert window.add(1, "x", clients=4) and len(window) == 7


def test_reports_of_clients_that_no_longer_reply_do_not_make_a_quorum():
    # 16 clients report once and leave; 32 stock clients reply after them: the reports stay in the window, but
    # their clients are no longer among the latest 32 that replied, so they measure nothing
    wall = WallClock(FixedDelays())
    wall.online = 48
    for client in range(16):
        _report(wall, client, 0.0, 1.0, in_flight=4, process="host:0")
    assert wall.parallelism() is not None  # 16 of the 32 (the nodes online, early) replying lately report
    for client in range(16, 48):
        wall._replied(client, 100 + client, reported=False)
    assert wall.parallelism() is None and wall.in_flight_cap(8) == 8


def test_a_process_per_job_is_no_queue_however_many_jobs_are_out():
    # a deployment's ClientApps: every reply names another process; with 200 jobs out the window of 128 names
    # holds 128 distinct ones, which is every job its own process, not 128 workers for 200 jobs (the waits, 1 s or
    # 5 s, a SuperNode's idle poll, say 200 x 2 / 4 = 100 at once: the cap was 129)
    wall = WallClock(FixedDelays())
    for i in range(200):
        _report(wall, i % 100, 1.0, 1.0 + 4 * (i % 2), in_flight=200, process=f"host:{i}")
    assert wall.parallelism() is not None and wall.in_flight_cap(200) == 200


def test_a_cap_measured_before_the_nodes_came_online_is_dropped_when_they_do():
    wall = WallClock(FixedDelays())
    jobs = {f"m{i}": Job(f"m{i}", 100, 0, 0, 0.0, 0.0, i, 0.0) for i in range(8)}
    for i in range(8):  # one node online, its 8 replies report no compute from one process: 2 jobs out
        wall.pick(jobs, {f"m{i}": "reply"}, {100}, 0.0, timeout=60)
        _report(wall, 0, 0.0, 1.0 + 9 * (i % 2), in_flight=4, process="host:0")
    assert wall.in_flight_cap(8) == 2
    wall.pick({}, {}, set(range(100, 108)), 0.0, timeout=60)  # 8 nodes online now: one of 8 reports
    assert wall.in_flight_cap(8) == 8


def test_timings_one_node_of_many_reports_do_not_cap_the_fleet():
    # eight clients replied lately, a stock ClientApp on seven of them (no train-seconds, no process): the eighth's
    # reports of no compute from one named process used to cap the jobs out at 2 for all; now they are too few
    wall = WallClock(FixedDelays())
    wall.recent_repliers = {client: (100 + client, False) for client in range(8)}
    for _ in range(CAP_AFTER_REPLIES):
        _report(wall, 0, 0.0, 1.0, in_flight=4, process="host:0")
    assert wall.parallelism() is None and wall.in_flight_cap(8) == 8
    for client in range(1, 4):  # half the clients report: measured (4 out, no queue: 4 at once; 4 processes, 4 + 1)
        _report(wall, client, 1.0, 1.0, in_flight=4, process=f"host:{client}")
    assert wall.parallelism() == pytest.approx(4.0) and wall.in_flight_cap(8) == 5


def test_a_hold_window_reads_reported_timings_only_from_most_of_the_fleet():
    # 8 nodes online, one reports 1 s of compute in a 10 s round trip: the window is 0.1 x the round trip, as if
    # no node reported; once 4 of 8 report, 0.1 x the median compute + the median wait
    wall = WallClock(FixedDelays())
    wall.online = 8
    wall.recent_durations.extend([10.0] * 4)
    out = {"a": Job("a", 101, 1, 0, 0.0, 0.0, 0, 0.0)}
    _report(wall, 0, 1.0, 9.0)
    assert wall.next_version(out, 1, 0.1)[1] == pytest.approx(1.0)
    for client in (1, 2, 3):
        _report(wall, client, 1.0, 9.0)
    assert wall.next_version(out, 1, 0.1)[1] == pytest.approx(0.1 + 9.0)


def test_process_names_and_ray_node_names_are_kept_short_and_few():
    from flwr.app import Array, ArrayRecord, RecordDict

    wall = WallClock(FixedDelays())
    _report(wall, 0, 1.0, 1.0, process="p" * 10_000)
    for not_a_name in (b"x" * 10_000, 7, ["a"], True):  # not read as a name (nor turned into one)
        _report(wall, 0, 1.0, 1.0, process=not_a_name)
    assert wall.recent_processes.values() == ["p" * protocol.WORKER_NAME_CHARS] and len(wall.reported) == 5
    stats, content = EngineStats(), RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(1, np.float32))})})
    for i in range(1100):
        stats.count_reply(Job("m", 101, 0, 0, 0.0, 1.0, 0, 0.0), content, "arrays", None, None, f"{i}" + "n" * 500)
    assert len(stats.by_worker) == WORKER_NAMES + 1 and stats.by_worker["other"] == 1100 - WORKER_NAMES
    assert max(map(len, stats.by_worker)) == protocol.WORKER_NAME_CHARS


def _reply(wall, client, online, train=None, wait=1.0):
    """A reply of ``client`` (node ``100 + client``) picked from the inbox, then its timings, if it reports any."""
    job = Job("m", 100 + client, client, 0, 0.0, 0.0, 0, 0.0)
    wall.pick({"m": job}, {"m": "reply"}, online, 0.0, timeout=60)
    if train is not None:
        wall.observe_train_seconds(Job("m", 100 + client, client, 0, 0.0, train + wait, 0, 0.0), train, 4, "host:0")


def test_a_reporting_reply_counts_once_toward_the_early_replies():
    # one node of 8 online replies 40 times, reporting each time: 40 replies, still one client of 8
    wall = WallClock(FixedDelays())
    online = set(range(100, 108))
    for _ in range(40):
        _reply(wall, 0, online, train=0.0, wait=1.0)
    assert wall.replies_seen == 40 and wall.parallelism() is None and wall.in_flight_cap(8) == 8


def test_reporters_that_left_or_stopped_reporting_no_longer_make_a_quorum():
    # 4 of 8 report (a queue: 4 x (0 + 0.1) / 1.05 = 0.4 at once -> 2 out); then they leave, or stay and report
    # nothing: the 4 stock nodes replying after them are all that replies lately, and none of them reports
    for leave in (True, False):
        wall = WallClock(FixedDelays())
        online = set(range(100, 108))
        for i in range(4):
            for client in range(4):
                _reply(wall, client, online, train=0.0, wait=0.1 if i == 0 else 2.0)
            for client in range(4, 8):
                _reply(wall, client, online)
        assert wall.in_flight_cap(8) == 2
        stock = set(range(104, 108)) if leave else online
        for client in range(4, 8) if leave else range(8):
            _reply(wall, client, stock)
        assert wall.parallelism() is None and wall.in_flight_cap(8) == 8, leave
