"""Engine behaviour against a fake Grid: ordering, failures, exact buffering, determinism."""

import time
import types
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message

from asyncfl import protocol
from asyncfl.config import ConfigError, EngineConfig
from asyncfl.errors import ClientAppsFailing
from asyncfl.options import RunOptions
from asyncfl.server_app.clock import CAP_AFTER_REPLIES
from asyncfl.server_app.codec import ModelCodec
from asyncfl.server_app.engine import AsyncEngine
from asyncfl.server_app.puller import ThreadedPuller
from asyncfl.simulation.delays import ComponentDelay, DelayModel
from asyncfl.simulation.presets import DELAY_PRESETS
from asyncfl.strategies import FedAvg, FedBuff, Strategy
from tests.fake_grid import FakeGrid, trained_reply

CODEC = ModelCodec.from_state(OrderedDict(w=np.zeros(2, np.float32), b=np.zeros(1, np.float32)))
FIXED = DelayModel(
    download=ComponentDelay("constant", ((1.0, 0.0),)),
    train=ComponentDelay("constant", ((1.0, 1.0),)),
    upload=ComponentDelay("constant", ((1.0, 0.0),)),
)


#: engine settings that come from the run, not from RunOptions (Flower's start() or the nodes that came)
_FROM_THE_RUN = {"concurrency": "concurrency", "round_arrivals": "round_arrivals", "timeout": "timeout",
                 "wait_for_nodes": "node_wait", "num_rounds": "num_rounds"}


def engine_config(strategy: Strategy | None = None, **overrides) -> EngineConfig:
    """The engine's settings through the users' door, as ``Strategy.start`` builds and checks them
    (``RunOptions.check_run``, ``check_strategy`` for ``strategy``, ``engine_config``): the tests' clock, delays and
    stops; every other option a user's default."""
    options = dict(clock="virtual", max_arrivals=6, evaluate_every_time=1.0, seed=7, delay_model=FIXED, progress=False)
    run = dict(concurrency=3, timeout=5.0, node_wait=0.0, num_rounds=0, round_arrivals=0)
    for name, value in overrides.items():
        if name in _FROM_THE_RUN:
            run[_FROM_THE_RUN[name]] = value
        else:
            options[name] = value
    checked = RunOptions(**options)
    checked.check_run(run["num_rounds"], run["timeout"])
    if strategy is not None:
        checked.check_strategy(type(strategy), strategy.name)
    return checked.engine_config(**run)


def plus_one(node, message):
    """Each client returns the received model + 1 everywhere."""
    received = message.content.array_records["arrays"]
    flat = CODEC.decode(received) + 1.0
    return trained_reply(message, CODEC.to_record(flat))


class Recording(Strategy):
    """Records arrivals and applies nothing."""

    def __init__(self):
        self.seen = []

    def on_arrival(self, arrival, current):
        self.seen.append((arrival.time, arrival.client_index, arrival.staleness))
        return None


def make_engine(grid, strategy, **overrides):
    return AsyncEngine(grid, strategy, CODEC, np.zeros(3, np.float32), engine_config(strategy, **overrides), {},
                       lambda m: (0.0, float(m[0])))


def test_virtual_order_ignores_reversed_physical_order():
    # Prepare: heterogeneous constant train times per client; the grid returns newest first.
    tiers = ComponentDelay("uniform", ((0.5, 1.0), (0.5, 3.0)), spread=0.5)
    delays = DelayModel(FIXED.download, tiers, FIXED.upload)
    forward = make_engine(FakeGrid(6, plus_one), Recording(), delay_model=delays, max_arrivals=12)
    backward = make_engine(FakeGrid(6, plus_one, release=lambda w: list(reversed(w))[:1]), Recording(), delay_model=delays, max_arrivals=12)
    # Execute
    forward.run()
    backward.run()
    # Assert: accepted strictly by virtual time, identically in both physical orders
    times = [t for t, _, _ in forward.strategy.seen]
    assert times == sorted(times)
    assert forward.strategy.seen == backward.strategy.seen


def test_ties_are_broken_by_dispatch_order():
    strategy = Recording()
    engine = make_engine(FakeGrid(3, plus_one, release=lambda w: list(reversed(w))), strategy, max_arrivals=3)
    engine.run()
    dispatched = [m.metadata.dst_node_id for m in engine.grid.pushed if m.metadata.message_type == "train"][:3]
    accepted_nodes = [engine.clients[c] for _, c, _ in strategy.seen]
    assert accepted_nodes == dispatched
    assert [t for t, _, _ in strategy.seen] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("batch", [1, 2, 5, 100])
def test_fedbuff_aggregates_exactly_b_however_replies_are_batched(batch):
    strategy = FedBuff(buffer_size=4, server_lr=1.0)
    grid = FakeGrid(8, plus_one, release=lambda w: w[:batch])
    engine = make_engine(grid, strategy, concurrency=5, max_arrivals=12)
    engine.run()
    # Every model update consumed exactly 4 arrivals: 12 arrivals -> versions 3.
    assert strategy.aggregations == 3
    assert engine.versions.version == 3
    assert strategy.buffered == 0


def test_error_replies_are_counted_and_the_slot_is_reused():
    calls = {"n": 0}

    def flaky(node, message):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            return Message(Error(code=1, reason="client crashed"), reply_to=message)
        return plus_one(node, message)

    engine = make_engine(FakeGrid(4, flaky), Recording(), max_arrivals=6)
    stats = engine.run()
    assert stats.arrivals == 6
    assert stats.rejected["error-reply"] >= 2
    assert not engine.state.in_flight


def test_lost_replies_time_out_and_the_run_finishes():
    lost_nodes = {101}

    def sometimes_silent(node, message):
        return None if node in lost_nodes else plus_one(node, message)

    engine = make_engine(FakeGrid(4, sometimes_silent), Recording(), max_arrivals=5, timeout=0.05)
    stats = engine.run()
    assert stats.arrivals == 5
    assert stats.rejected["lost"] >= 1


@pytest.mark.parametrize(
    "bad_record, reason",
    [
        (ArrayRecord(OrderedDict(w=Array(np.zeros(3, np.float32)), b=Array(np.zeros(1, np.float32)))), "wrong-shape"),
        (ArrayRecord(OrderedDict(w=Array(np.array([np.nan, 0], np.float32)), b=Array(np.zeros(1, np.float32)))), "non-finite"),
        (ArrayRecord(OrderedDict(w=Array(np.zeros(2, np.float32)))), "wrong-layout"),
    ],
)
def test_malformed_updates_are_rejected_never_aggregated(bad_record, reason):
    def bad_from_node_101(node, message):
        if node == 101:
            return trained_reply(message, bad_record)
        return plus_one(node, message)

    strategy = FedBuff(buffer_size=1, server_lr=1.0)
    engine = make_engine(FakeGrid(3, bad_from_node_101), strategy, max_arrivals=6)
    stats = engine.run()
    assert stats.rejected[reason] >= 1
    assert np.isfinite(engine.global_model).all()
    # Each accepted FedBuff(B=1) step adds exactly +1 (client = base + 1).
    assert np.allclose(engine.global_model, 6.0)


def test_reply_without_arrays_is_rejected():
    from flwr.app import MetricRecord, RecordDict

    def no_arrays(node, message):
        if node == 102:
            return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=message)
        return plus_one(node, message)

    engine = make_engine(FakeGrid(3, no_arrays), Recording(), max_arrivals=4)
    assert engine.run().rejected["no-arrays"] >= 1


def test_staleness_is_versions_since_dispatch():
    strategy = FedBuff(buffer_size=1)
    seen = []
    original = strategy.on_arrival

    def spy(arrival, current):
        seen.append(arrival.staleness)
        return original(arrival, current)

    strategy.on_arrival = spy
    engine = make_engine(FakeGrid(3, plus_one), strategy, concurrency=3, max_arrivals=3)
    engine.run()
    # Three jobs dispatched at version 0 finish together; each accepted update advances the version.
    assert seen == [0, 1, 2]
    # per client: one arrival each, with the staleness it had (clients.csv's figures)
    by_client = engine.stats.by_client
    assert sorted((int(t[0]), int(t[1])) for t in by_client.values()) == [(1, 0), (1, 1), (1, 2)]
    assert sum(t[0] for t in by_client.values()) == engine.stats.arrivals


def test_synchronous_fedavg_waits_for_the_slowest_job():
    tiers = ComponentDelay("constant", ((0.5, 1.0), (0.5, 4.0)))
    delays = DelayModel(FIXED.download, tiers, FIXED.upload)
    strategy = FedAvg(server_lr=1.0)
    engine = make_engine(FakeGrid(4, plus_one), strategy, delay_model=delays, concurrency=4, max_arrivals=8)
    engine.run()
    assert strategy.rounds == 2
    assert np.allclose(engine.global_model, 2.0)
    # Each round lasts as long as its slowest client.
    profiles = [engine.delays.profile(c).train for c in range(4)]
    assert engine.now == pytest.approx(2 * max(profiles))


def test_version_store_keeps_only_versions_in_use():
    engine = make_engine(FakeGrid(10, plus_one), FedBuff(buffer_size=1), concurrency=4, max_arrivals=40,
                         delay_model=DELAY_PRESETS["fedrevive-default"])
    engine.run()
    assert engine.versions.peak_versions <= 4 + 1
    assert engine.versions.stored == 1


def test_same_seed_same_evaluations_different_seed_differs():
    def run(seed):
        engine = make_engine(FakeGrid(6, plus_one, release=lambda w: w[::-1][:2]), FedBuff(buffer_size=2, server_lr=0.5),
                             seed=seed, delay_model=DELAY_PRESETS["fedrevive-default"], max_arrivals=20)
        engine.run()
        return engine.stats.evaluations, engine.stats.staleness

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_max_virtual_time_stops_at_the_limit():
    engine = make_engine(FakeGrid(3, plus_one), FedBuff(buffer_size=1), max_arrivals=0, max_time=2.5, concurrency=1,
                         evaluate_every=0)  # the clock's points only (rounds add rows of their own)
    stats = engine.run()
    assert stats.arrivals == 2
    assert engine.now == 2.5
    assert [row["time"] for row in stats.evaluations] == [0.0, 1.0, 2.0, 2.5]


def test_nodes_without_query_handler_still_train_and_only_one_is_asked(caplog):
    # Prepare: a stock ClientApp (no query handler) on every node
    caplog.set_level("INFO")
    grid = FakeGrid(3, plus_one, partition_ids=False)
    engine = make_engine(grid, FedBuff(buffer_size=1), max_arrivals=3)
    # Execute / Assert: the run trains; the first node's refusal stops the identity queries (each refusal is a
    # traceback in Flower's simulation log), and one INFO line says why the order follows node ids
    assert engine.run().arrivals == 3
    assert sum(m.metadata.message_type == "query" for m in grid.pushed) == 1
    assert caplog.text.count("clients follow node-id order: the ClientApp has no query handler") == 1
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "start at all zeros" not in r.getMessage()]


def test_identify_nodes_off_sends_no_query():
    grid = FakeGrid(3, plus_one)
    make_engine(grid, FedBuff(buffer_size=1), max_arrivals=3, identify_nodes=False).run()
    assert not any(m.metadata.message_type == "query" for m in grid.pushed)


def test_wall_clock_accepts_in_pull_order():
    # Prepare: replies become pullable one at a time, newest job first.
    schedule: list[str] = []

    def newest_first(waiting):
        trains = [m.metadata.message_id for m in grid.pushed if m.metadata.message_type == "train"]
        if not trains:
            return waiting  # the discovery queries
        if not schedule:
            schedule.extend(reversed(trains[:3]))
        if schedule and schedule[0] in waiting:
            return [schedule.pop(0)]
        return []

    grid = FakeGrid(3, plus_one, release=newest_first)
    strategy = Recording()
    engine = make_engine(grid, strategy, clock="wall", max_arrivals=3)
    # Act
    engine.run()
    # Assert: accepted in the order they became available, not in dispatch order.
    accepted_nodes = [engine.clients[c] for _, c, _ in strategy.seen]
    pushed = [m.metadata.dst_node_id for m in grid.pushed if m.metadata.message_type == "train"][:3]
    assert accepted_nodes == list(reversed(pushed))
    # every reply came through a pull of its own, and the count of those pulls is kept (summary "reply-pulls")
    assert engine.state.stats.reply_pulls >= 3
    # two of the three were found after pulls that missed them: the summary says how late they may have been seen
    from asyncfl.server_app.recorder import transport_summary

    gap_sum, gaps = engine.state.stats.reply_miss_gap
    assert gaps >= 2 and transport_summary(engine.state.stats)["reply-miss-gap-s-mean"] == round(gap_sum / gaps, 4)


def test_wall_clock_a_stuck_pull_does_not_block_other_replies():
    # Prepare: pulling node 101's reply blocks (like a reply whose upload died with its SuperNode).
    import threading

    release_stuck = threading.Event()
    grid = FakeGrid(3, plus_one)
    plain_pull = grid.pull_messages

    def pull(message_ids):
        owners = [m.metadata.dst_node_id for m in grid.pushed
                  if m.metadata.message_id in set(message_ids) and m.metadata.message_type == "train"]
        if 101 in owners:
            release_stuck.wait(timeout=30)
        return plain_pull(message_ids)

    grid.pull_messages = pull
    strategy = Recording()
    engine = make_engine(grid, strategy, clock="wall", concurrency=3, max_arrivals=8, timeout=3600.0)
    # Act
    engine.run()
    release_stuck.set()
    # Assert: the run finished on the other two nodes while 101's pull hung.
    assert engine.stats.arrivals == 8
    assert 0 not in {client for _, client, _ in strategy.seen}


def test_a_clientapp_that_always_fails_aborts_instead_of_spinning():
    def broken(node, message):
        return Message(Error(code=1, reason="Traceback ...\nRuntimeError: broken model"), reply_to=message)

    engine = make_engine(FakeGrid(3, broken), Recording(), max_arrivals=5)
    with pytest.raises(ClientAppsFailing, match="all failed") as error:
        engine.run()
    assert engine.stats.rejected["error-reply"] == 5 * 3 + 10
    assert "timeout" not in str(error.value)  # broken, not slow: no hint to wait longer


def test_jobs_that_never_reply_abort_with_a_hint_to_raise_job_timeout():
    engine = make_engine(FakeGrid(2, lambda node, message: None), Recording(), max_arrivals=5, timeout=0.01)
    with pytest.raises(ClientAppsFailing, match="raise timeout") as error:
        engine.run()
    assert "timeout = 0.01 s" in str(error.value)
    assert engine.stats.rejected["lost"] == 5 * engine.config.concurrency + 10


def test_codec_round_trip_keeps_dtypes_and_values():
    state = OrderedDict(w=np.arange(6, dtype=np.float32).reshape(2, 3), n=np.array(7, dtype=np.int64))
    codec = ModelCodec.from_state(state)
    flat = codec.flatten(list(state.values()))
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7]
    record = codec.to_record(flat)
    assert record["n"].numpy().dtype == np.int64 and int(record["n"].numpy()) == 7
    assert np.array_equal(codec.decode(record), flat)
    # A float64 reply of the right shape is accepted and cast.
    as_f64 = ArrayRecord(OrderedDict(w=Array(state["w"].astype(np.float64)), n=Array(state["n"])))
    assert np.array_equal(codec.decode(as_f64), flat)


def test_engine_tells_the_strategy_how_many_clients_there_are():
    from asyncfl.strategies import CA2FL

    strategy = CA2FL(buffer_size=2)
    engine = make_engine(FakeGrid(5, plus_one), strategy, max_arrivals=6)
    engine.run()
    assert strategy.num_clients == 5
    assert strategy.aggregations == 3


def test_size_tied_runtime_categories_make_the_biggest_clients_slow():
    # Prepare: 10 clients reporting sizes 10..100; gamma 0 ranks categories by size alone.
    from asyncfl.simulation.categories import RuntimeCategories

    spec = RuntimeCategories(short=(1.0, 1.0), medium=(3.0, 3.0), long=(50.0, 50.0), gamma=0.0)
    strategy = Recording()
    grid = FakeGrid(10, plus_one, sizes=[10 * (i + 1) for i in range(10)])
    engine = make_engine(grid, strategy, delay_model=spec, concurrency=10, max_arrivals=10)
    # Act
    engine.run()
    # Assert: the biggest client is the 10% long one, the next three are medium.
    assert engine.client_sizes == [10 * (i + 1) for i in range(10)]
    assert list(engine.delays.categories) == [0] * 6 + [1] * 3 + [2]
    assert engine.delays.counts() == {"short": 6, "medium": 3, "long": 1}
    assert {client for _, client, _ in strategy.seen} <= set(range(6))  # only short jobs finish by t=2
    assert [t for t, _, _ in strategy.seen] == [1.0] * 6 + [2.0] * 4


def test_wall_clock_gives_work_to_nodes_that_join_and_none_to_nodes_that_left():
    grid = FakeGrid(3, plus_one)
    later = 104  # joins after the first replies
    gone = 101   # leaves after the first replies

    def membership_change(waiting):
        if len(grid.pushed) > 6 and later not in grid.nodes:
            grid.nodes.remove(gone)
            grid.nodes.append(later)
        return waiting

    grid.release = membership_change
    strategy = Recording()
    engine = make_engine(grid, strategy, clock="wall", concurrency=2, max_arrivals=12)
    engine.roster.refresh_every = 0.0  # look at the online nodes at every step
    engine.run()
    trains = [m for m in grid.pushed if m.metadata.message_type == "train"]
    first_after_change = next(i for i, m in enumerate(trains) if m.metadata.dst_node_id == later)
    assert later in engine.clients
    assert all(m.metadata.dst_node_id != gone for m in trains[first_after_change + 2:])


def test_a_node_that_joins_and_never_answers_the_identity_query_does_not_hold_the_run():
    """Asked mid-run, a joining node's identity is collected at later looks: the engine dispatches meanwhile, and
    takes the node in, unidentified, once its wait is over (it used to stop the engine for the whole wait)."""
    later = 104

    class SilentJoiner(FakeGrid):
        def _identify(self, node, message):
            return None if node == later else super()._identify(node, message)

    def slow_plus_one(node, message):
        time.sleep(0.01)  # the run lasts about 2 s of wall time: well past the joiner's wait
        return plus_one(node, message)

    def membership_change(waiting):
        if len(grid.pushed) > 6 and later not in grid.nodes:
            grid.nodes.append(later)
        return waiting

    grid = SilentJoiner(3, slow_plus_one, release=membership_change)
    engine = make_engine(grid, Recording(), clock="wall", concurrency=2, max_arrivals=200, identify_nodes=True)
    engine.roster.refresh_every = 0.0  # look at the online nodes at every step
    engine.roster.join_wait_s = 0.5
    taken_in_at = []  # how many messages were out when the roster took the joiner in
    look = engine.roster.refresh

    def watched_look():
        changed = look()
        if later in engine.roster.nodes and not taken_in_at:
            taken_in_at.append(len(grid.pushed))
        return changed

    engine.roster.refresh = watched_look
    engine.run()
    kinds = [(m.metadata.message_type, m.metadata.dst_node_id) for m in grid.pushed]
    asked = kinds.index(("query", later))
    assert sum(kind == "train" for kind, _ in kinds[asked:taken_in_at[0]]) > 0  # jobs went out while it was awaited
    assert later in engine.clients and engine.stats.unidentified_nodes == 1


def test_wall_clock_requests_carry_the_emulated_duration():
    strategy = Recording()
    grid = FakeGrid(3, plus_one)
    make_engine(grid, strategy, clock="wall", emulate_delay_scale=0.5, max_arrivals=3).run()
    seconds = [m.content.config_records["config"]["emulate-seconds"] for m in grid.pushed
               if m.metadata.message_type == "train"]
    assert seconds and all(s == pytest.approx(0.5) for s in seconds)  # FIXED delays: 1 time unit each


def test_wall_clock_job_on_a_node_that_went_offline_is_lost_without_waiting_for_the_timeout():
    crashed = 102

    def handler(node, message):
        if node == crashed:
            grid.nodes.remove(crashed)  # it crashes while training: no reply, and it leaves the SuperLink's list
            return None
        return plus_one(node, message)

    grid = FakeGrid(3, handler)
    engine = make_engine(grid, Recording(), clock="wall", concurrency=3, max_arrivals=6, timeout=3600.0)
    engine.roster.refresh_every = 0.0  # look at the online nodes at every step
    engine.run()
    assert engine.stats.rejected == {"node-offline": 1}
    assert engine.stats.arrivals == 6


def test_transport_figures_are_recorded_per_accepted_reply():
    from asyncfl.server_app.recorder import transport_summary

    def timed(node, message):
        reply = plus_one(node, message)
        reply.content.metric_records["metrics"]["train-seconds"] = 0.25
        return reply

    engine = make_engine(FakeGrid(3, timed), Recording(), max_arrivals=4)
    engine.run()
    stats = engine.stats
    assert len(stats.reply_bytes) == len(stats.round_trip_seconds) == len(stats.client_train_seconds) == 4
    assert all(b > 3 * 4 for b in stats.reply_bytes)  # 3 float32 values plus the .npy headers
    summary = transport_summary(stats)
    assert summary["client-train-s-mean"] == 0.25
    assert summary["dispatch-overhead-s-mean"] == pytest.approx(summary["job-round-trip-s-mean"] - 0.25)
    # the steady rate spans the first train push to the last accepted reply, start-up excluded
    assert stats.first_push_wall <= stats.last_arrival_wall
    assert summary["accepted-per-training-s"] == pytest.approx(4 / (stats.last_arrival_wall - stats.first_push_wall), rel=1e-3)


def test_negative_batchnorm_variances_are_clamped_without_touching_the_strategys_array():
    state = OrderedDict([("bn.weight", np.ones(2, np.float32)), ("bn.running_var", np.ones(2, np.float32))])
    codec = ModelCodec.from_state(state)
    flat = np.array([-1.0, 2.0, -0.5, 3.0], np.float32)
    clamped, count = codec.clamp_variances(flat)
    assert count == 1 and clamped.tolist() == [-1.0, 2.0, 0.0, 3.0]  # weights may be negative, variances not
    assert flat.tolist() == [-1.0, 2.0, -0.5, 3.0]
    same, none = codec.clamp_variances(clamped)
    assert none == 0 and same is clamped


class EveryArrivalUpdates(Strategy):
    """FedAsync-like: each arrival advances the version (model + 1)."""

    def __init__(self, pause: float = 0.0):
        self.pause = pause
        self.bases = []

    def on_arrival(self, arrival, current):
        import time as _time

        _time.sleep(self.pause)
        self.bases.append(arrival.base_version)
        return current + 1.0


def _dispatched_versions(grid):
    return [m.content.config_records["config"]["model-version"] for m in grid.pushed
            if m.metadata.message_type == "train"]


def test_overlap_dispatches_the_freed_slot_with_the_pre_update_model():
    plain, overlapped = FakeGrid(4, plus_one), FakeGrid(4, plus_one)
    make_engine(plain, EveryArrivalUpdates(), concurrency=2, max_arrivals=4).run()
    make_engine(overlapped, EveryArrivalUpdates(), concurrency=2, max_arrivals=4, overlap_server_compute=True).run()
    # Jobs 0-1 start on version 0; the job replacing the first arrival gets version 1 without overlap,
    # version 0 (the model before that arrival's update) with it.
    assert _dispatched_versions(plain)[2] == 1
    assert _dispatched_versions(overlapped)[2] == 0


def test_server_time_scale_charges_server_compute_to_the_virtual_clock():
    free = make_engine(FakeGrid(3, plus_one), EveryArrivalUpdates(), max_arrivals=4)
    free.run()
    charged = make_engine(FakeGrid(3, plus_one), EveryArrivalUpdates(pause=0.05), max_arrivals=4, server_time_scale=10.0)
    charged.run()
    # Each arrival's >= 0.05 s of server work costs >= 0.5 virtual units; later jobs start that much later.
    assert charged.now >= free.now + 0.5


class RoundRecording(FedAvg):
    """FedAvg that also records (round, client, staleness, time) of every arrival."""

    def __init__(self):
        super().__init__(server_lr=1.0)
        self.seen = []

    def on_arrival(self, arrival, current):
        self.seen.append((self.rounds, arrival.client_index, arrival.staleness, arrival.time))
        return super().on_arrival(arrival, current)


def three_rounds_late_run(**overrides):
    """6 clients; class 5 is held mostly by clients 1 and 4, which are 3 rounds late; 6 one-unit rounds."""
    from asyncfl.simulation.intertwined import IntertwinedDelays

    counts = [[5] * 10 for _ in range(6)]
    counts[1][5], counts[4][5] = 50, 40
    spec = IntertwinedDelays(affected_class=5, delayed_clients=2, staleness=3)
    strategy = RoundRecording()
    grid = FakeGrid(6, plus_one, label_counts=counts)
    engine = make_engine(grid, strategy, delay_model=spec, concurrency=6, round_deadline=1.0,
                         max_arrivals=0, max_time=6.0, **overrides)
    engine.run()
    on_time = [s for s in strategy.seen if s[1] not in (1, 4)]
    late = [s for s in strategy.seen if s[1] in (1, 4)]
    return engine, grid, on_time, late


def test_round_deadline_lets_delayed_clients_arrive_exactly_s_rounds_late():
    engine, _, on_time, late = three_rounds_late_run()
    # Assert: rounds close every unit without waiting for the late jobs ...
    assert list(engine.delays.delayed) == [1, 4]
    assert [s[3] for s in on_time][:8] == [1.0] * 4 + [2.0] * 4 and all(s[2] == 0 for s in on_time)
    # ... and each delayed job lands mid-round 3 rounds after dispatch, with tau = 3.
    assert [(r, tau, t) for r, _, tau, t in late] == [(3, 3, 3.5), (3, 3, 3.5)]
    assert engine.strategy.rounds == 6 and engine.versions.version == 6


def test_pipelined_late_clients_train_every_round_and_each_job_lands_s_rounds_after_dispatch():
    # A late client may be picked again while its late job is out, so all 6 clients start a job every round.
    engine, grid, on_time, late = three_rounds_late_run(pipeline_late_clients=True)
    # Assert: the late clients' jobs started at t = 0, 1, 2 land in rounds 3, 4, 5, each with tau = 3 (without
    # pipelining only the t = 0 pair lands by t = 6, see the test above) ...
    assert [(r, tau, t) for r, _, tau, t in late] == [(3, 3, 3.5)] * 2 + [(4, 3, 4.5)] * 2 + [(5, 3, 5.5)] * 2
    # ... while the on-time clients still report once per round, never stale.
    assert [s[3] for s in on_time][:8] == [1.0] * 4 + [2.0] * 4 and all(s[2] == 0 for s in on_time)
    trains = [m for m in grid.pushed if m.metadata.message_type == "train"]
    assert sum(engine.clients.index(m.metadata.dst_node_id) in (1, 4) for m in trains) >= 6
    assert not any(engine.slots.busy[c] < 0 for c in engine.slots.busy)


def test_label_counts_are_asked_for_only_when_the_delay_model_needs_them():
    grid = FakeGrid(3, plus_one, label_counts=[[1, 2], [3, 4], [5, 6]])
    make_engine(grid, Recording(), max_arrivals=3).run()
    queries = [m for m in grid.pushed if m.metadata.message_type == "query"]
    assert queries and not any(m.content.config_records["config"]["asyncfl-label-counts"] for m in queries)


def test_clients_reporting_no_training_data_get_no_jobs():
    strategy = Recording()
    grid = FakeGrid(4, plus_one, sizes=[10, 0, 10, 0])
    make_engine(grid, strategy, concurrency=4, max_arrivals=6).run()
    assert {client for _, client, _ in strategy.seen} == {0, 2}


class SlowToStart(FakeGrid):
    """Partition ids run against node ids; query replies come back only after ``delay_s`` (a worker starting),
    and the nodes in ``silent`` never answer the query."""

    def __init__(self, num_nodes, handler, delay_s, silent=()):
        super().__init__(num_nodes, handler, release=self._release)
        self.delay_s, self.silent, self.started = delay_s, set(silent), time.monotonic()

    def _identify(self, node, message):
        if node in self.silent:
            return None
        reply = super()._identify(node, message)
        reply.content.config_records["config"]["partition-id"] = len(self.nodes) - 1 - self.nodes.index(node)
        return reply

    def _release(self, waiting):
        queries = {m.metadata.message_id for m in self.pushed if m.metadata.message_type == "query"}
        late = time.monotonic() - self.started < self.delay_s
        return [mid for mid in waiting if not (late and mid in queries)]


def test_slow_nodes_are_waited_for_so_the_client_order_follows_partition_ids():
    grid = SlowToStart(4, plus_one, delay_s=0.5)
    engine = make_engine(grid, FedBuff(buffer_size=1), max_arrivals=2, wait_for_nodes=0.0, timeout=5.0)
    engine.run()
    assert engine.clients == [104, 103, 102, 101] and engine.stats.unidentified_nodes == 0


def test_nodes_that_never_answer_are_counted_and_follow_by_node_id(caplog):
    grid = SlowToStart(4, plus_one, delay_s=0.0, silent={101})
    engine = make_engine(grid, FedBuff(buffer_size=1), max_arrivals=2, wait_for_nodes=0.0, timeout=0.5)
    engine.run()
    assert engine.clients == [104, 103, 102, 101] and engine.stats.unidentified_nodes == 1
    assert "may not repeat exactly" in caplog.text


@pytest.mark.parametrize("jobs_per_client, first_wave", [(1, 2), (2, 4)])
def test_jobs_per_client_queues_a_clients_next_job_while_it_trains(jobs_per_client, first_wave):
    # Prepare: 2 nodes, 4 slots; the grid answers identity queries at once but keeps train replies back until
    # 4 train messages were pushed (forever with one job per client, where the engine can only have 2 out).
    def release(waiting):
        queries = {m.metadata.message_id for m in grid.pushed if m.metadata.message_type == "query"}
        trains = len(grid.pushed) - len(queries)
        return waiting if trains >= 4 else [mid for mid in waiting if mid in queries]

    grid = FakeGrid(2, plus_one, release=release)
    engine = make_engine(grid, Recording(), clock="wall", concurrency=4, max_arrivals=6, timeout=3600.0,
                         jobs_per_client=jobs_per_client, cap_in_flight=False)
    if jobs_per_client == 1:
        engine.discover_clients()
        engine.dispatcher.top_up(0)
        trains = [m for m in grid.pushed if m.metadata.message_type == "train"]
        assert len(trains) == first_wave and sorted(m.metadata.dst_node_id for m in trains) == [101, 102]
        return
    engine.run()
    trains = [m.metadata.dst_node_id for m in grid.pushed if m.metadata.message_type == "train"]
    assert sorted(trains[:first_wave]) == [101, 101, 102, 102]  # each node has its next job waiting
    assert engine.stats.arrivals == 6
    assert max(engine.slots.busy.values(), default=0) <= 2


def test_jobs_per_client_above_one_needs_the_wall_clock():
    with pytest.raises(ConfigError, match="jobs-per-client.*clock = 'wall'"):
        RunOptions(clock="virtual", delay_model=FIXED, jobs_per_client=2, cap_in_flight=False)
    with pytest.raises(ConfigError, match="jobs-per-client.*queues.*on purpose.*set cap-in-flight = false"):
        RunOptions(clock="wall", jobs_per_client=2)
    with pytest.raises(ConfigError, match="jobs_per_client=0 must be >= 1.*jobs-per-client"):
        RunOptions(clock="wall", jobs_per_client=0)


def test_jobs_per_client_waits_only_for_the_nodes_that_fill_the_slots(caplog):
    # 2 nodes with 2 jobs each fill a concurrency of 4: nothing to wait for (the wait used to run out its 60 s)
    caplog.set_level("INFO")
    engine = make_engine(FakeGrid(2, plus_one), Recording(), clock="wall", concurrency=4, jobs_per_client=2, cap_in_flight=False,
                         wait_for_nodes=60.0)
    engine.discover_clients()
    assert "waiting up to" not in caplog.text
    lonely = make_engine(FakeGrid(1, plus_one), Recording(), clock="wall", concurrency=4, jobs_per_client=2, cap_in_flight=False,
                         wait_for_nodes=0.2)
    lonely.discover_clients()
    assert "1 node(s) connected, 2 fill the concurrency of 4" in caplog.text


def _dispatch_versions(strategy):
    """Record each arrival's (base version, staleness) on ``strategy``."""
    seen = []
    original = strategy.on_arrival

    def spy(arrival, current):
        seen.append((arrival.base_version, arrival.staleness))
        return original(arrival, current)

    strategy.on_arrival = spy
    return seen


@pytest.mark.parametrize("hold, second_wave", [(0.0, [(0, 1), (0, 1), (1, 0)]), (0.5, [(1, 0), (1, 0), (1, 0)])])
def test_dispatch_hold_starts_the_next_jobs_from_the_buffers_step(hold, second_wave):
    # three equal jobs finish together at t=1; the buffer of 3 steps at the third. Without a hold the first two
    # slots get version 0 again (their update not in it); held, all three wait for version 1, at no time cost
    strategy = FedBuff(buffer_size=3, server_lr=1.0)
    seen = _dispatch_versions(strategy)
    engine = make_engine(FakeGrid(3, plus_one), strategy, concurrency=3, max_arrivals=6, dispatch_hold=hold)
    engine.run()
    assert seen[:3] == [(0, 0), (0, 0), (0, 0)]
    assert seen[3:] == second_wave
    assert engine.now == pytest.approx(2.0)


def test_dispatch_hold_never_waits_for_a_slow_buffer():
    # client speeds 1 and 10, a buffer of 2: the fast client's slot would wait 9 units for the slow job, far more
    # than half a job, so it goes out at once and the fast client's second update is in before the slow one
    tiers = ComponentDelay("constant", ((0.5, 1.0), (0.5, 10.0)))
    strategy = FedBuff(buffer_size=2, server_lr=1.0)
    seen = []
    original = strategy.on_arrival
    strategy.on_arrival = lambda arrival, current: (seen.append(round(arrival.time, 3)), original(arrival, current))[1]
    engine = make_engine(FakeGrid(2, plus_one), strategy, concurrency=2, max_arrivals=3, dispatch_hold=0.5,
                         delay_model=DelayModel(FIXED.download, tiers, FIXED.upload))
    engine.run()
    durations = sorted(engine.delays.profile(c).train for c in range(2))
    assert seen[:2] == [pytest.approx(durations[0]), pytest.approx(2 * durations[0])]
    assert engine.state.held_since == -1.0


@pytest.mark.parametrize("reports_train_seconds, second_wave_bases", [(False, [0, 1]), (True, [1, 1])])
def test_wall_clock_hold_covers_the_time_jobs_wait_to_start(reports_train_seconds, second_wave_bases):
    # replies come 0.6 s (node 101) and 0.9 s (node 102's first) after their push. Without train-seconds a job is
    # its 0.6 s round trip and a tenth of it cannot cover the 0.3 s to the buffer's step: 101's second job goes out
    # on version 0. Replies saying they trained 1 ms show 0.6 s of waiting to start, so the slot waits for version 1
    pushed_at = {}

    def handler(node, message):
        pushed_at[message.metadata.message_id] = (node, time.monotonic())
        reply = plus_one(node, message)
        if reports_train_seconds:
            reply.content.metric_records["metrics"][protocol.TRAIN_SECONDS] = 0.001
        return reply

    def after_their_wait(waiting):
        now, firsts = time.monotonic(), {}
        for message_id in pushed_at:
            firsts.setdefault(pushed_at[message_id][0], message_id)
        return [w for w in waiting  # identity queries (not in pushed_at) come back at once
                if w not in pushed_at or now - pushed_at[w][1] >= (0.9 if w == firsts[102] else 0.6)]

    strategy = FedBuff(buffer_size=2, server_lr=1.0)
    seen = _dispatch_versions(strategy)
    engine = make_engine(FakeGrid(2, handler, release=after_their_wait), strategy, clock="wall", concurrency=2,
                         max_arrivals=4, dispatch_hold=0.1, timeout=30.0)
    engine.run()
    assert [base for base, _ in seen[2:]] == second_wave_bases


def test_wall_clock_a_held_slot_goes_out_when_its_wait_is_over():
    # node 102's first reply comes back only once a third job was pushed: the freed slot of node 101 waits for
    # the buffer's step (102's update) no longer than half a job, then goes out while 102 is still out
    def held_back(waiting):
        trains = [m for m in grid.pushed if m.metadata.message_type == "train"]
        first_of_102 = next((m.metadata.message_id for m in trains if m.metadata.dst_node_id == 102), None)
        return [w for w in waiting if w != first_of_102 or len(trains) >= 3]

    grid = FakeGrid(2, plus_one, release=held_back)
    engine = make_engine(grid, FedBuff(buffer_size=2, server_lr=1.0), clock="wall", concurrency=2, max_arrivals=4,
                         dispatch_hold=0.5, timeout=30.0)
    engine.run()
    assert engine.stats.arrivals == 4
    assert engine.stats.rejected == {}


class TwoWorkers(FakeGrid):
    """Train jobs queue for 2 workers that train each for ``train_s`` wall seconds (a simulation on 2 cores); replies
    say so in ``train-seconds``."""

    def __init__(self, num_nodes, train_s):
        super().__init__(num_nodes, self._train, release=self._done)
        self.train_s, self.free_at, self.back_at, self.in_flight_at_push = train_s, [0.0, 0.0], {}, []

    def _train(self, node, message):
        worker = min(range(2), key=self.free_at.__getitem__)
        start = max(time.monotonic(), self.free_at[worker])
        self.free_at[worker] = start + self.train_s
        self.back_at[message.metadata.message_id] = start + self.train_s
        reply = plus_one(node, message)
        reply.content.metric_records["metrics"][protocol.TRAIN_SECONDS] = self.train_s
        reply.content.config_records[protocol.WORKER_RECORD] = ConfigRecord({protocol.PROCESS: f"host:{worker}"})
        return reply

    def _done(self, waiting):
        now = time.monotonic()
        return [w for w in waiting if self.back_at.get(w, 0.0) <= now]

    def push_messages(self, messages):
        if any(m.metadata.message_type == "train" for m in messages):
            self.in_flight_at_push.append(len(self.engine.state.in_flight) + len(messages))
        return super().push_messages(messages)


@pytest.mark.parametrize("cap", [True, False])
def test_wall_clock_caps_jobs_in_flight_at_the_workers_parallelism_and_keeps_the_strategys_concurrency(cap):
    # 8 jobs in flight on 2 workers: 6 wait in a queue, growing stale. Once 8 replies told how long they trained,
    # the cap keeps about 2 + 1 out; FedBuff's buffer is still the one for 8 in flight
    grid = TwoWorkers(8, train_s=0.3)  # long next to the engine loop's lag on a loaded machine
    strategy = FedBuff()
    engine = make_engine(grid, strategy, clock="wall", concurrency=8, max_arrivals=32, timeout=30.0,
                         cap_in_flight=cap)
    grid.engine, engine._puller = engine, ThreadedPuller(grid, min_interval=0.002, max_interval=0.005)  # notice soon
    engine.run()
    late = grid.in_flight_at_push[len(grid.in_flight_at_push) // 2:]  # dispatches of the run's second half
    assert strategy.buffer_size == 2 and engine.stats.arrivals == 32
    # the engine names each job's client to the puller, which learns when that client's replies become ready
    assert engine._puller.ready_after and set(engine._puller.ready_after) <= set(range(len(engine.roster.sizes)))
    if cap:
        assert max(late) <= 5 and 2 <= engine.stats.in_flight_cap_min <= 5
    else:
        assert min(late) >= 7 and engine.stats.capped_checks == 0


class OneTimedNode(FakeGrid):
    """Eight nodes: seven stock ClientApps that reply after ``honest_s`` and report no timings, and node 101, which
    says it trained 0 s in one named process and comes back after 0.005 s or 0.3 s in turn (queue-like waits);
    ``burst``: it reports only in its first 8 replies, 0.05 s apart, all in before any other node's."""

    def __init__(self, burst=False):
        super().__init__(8, self._reply, release=self._done)
        self.back_at, self.replies_of_101, self.burst = {}, 0, burst

    def _reply(self, node, message):
        reply = plus_one(node, message)
        delay = 1.0 if self.burst else 0.1
        if node == 101 and (not self.burst or self.replies_of_101 < CAP_AFTER_REPLIES):
            self.replies_of_101 += 1
            delay = 0.05 if self.burst else 0.005 if self.replies_of_101 % 2 else 0.3
            reply.content.metric_records["metrics"][protocol.TRAIN_SECONDS] = 0.0
            reply.content.config_records[protocol.WORKER_RECORD] = ConfigRecord({protocol.PROCESS: "host:1"})
        self.back_at[message.metadata.message_id] = time.monotonic() + delay
        return reply

    def _done(self, waiting):
        now = time.monotonic()
        return [w for w in waiting if self.back_at.get(w, 0.0) <= now]


@pytest.mark.parametrize("burst", [False, True])
def test_one_nodes_timings_do_not_cap_the_jobs_of_a_fleet_that_reports_none(burst):
    # the wall clock's cap on jobs in flight measures the workers from the replies' train-seconds; one node of eight
    # reporting them (no compute, waits of 0.005 s and 0.3 s: Little's law says 0.3 jobs at once) kept 2 jobs out of
    # 8 and left 6 nodes idle; its word alone is no measurement now, also when its reports all come first (the first
    # node to reply is one of the 8 online, and a cap measured then is dropped once others reply)
    grid = OneTimedNode(burst)
    engine = make_engine(grid, FedBuff(), clock="wall", concurrency=8, max_arrivals=48 if burst else 96,
                         timeout=30.0, cap_in_flight=True)
    engine._puller = ThreadedPuller(grid, min_interval=0.002, max_interval=0.005)
    engine.run()
    assert engine.stats.arrivals == (48 if burst else 96) and grid.replies_of_101 >= CAP_AFTER_REPLIES  # measurable
    assert engine.stats.capped_checks == 0


def test_every_run_end_says_why_in_summary_json(tmp_path):
    """A run that reaches its budget and one whose nodes all fail both leave summary.json with the stop reason."""
    import json

    from flwr.app import Array, ArrayRecord, ConfigRecord

    from asyncfl import FedBuff

    def honest(node, message):
        w = message.content.array_records["arrays"]["w"].numpy()
        return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(0.1))}))

    def broken(node, message):
        return Message(Error(code=1, reason="RuntimeError: broken"), reply_to=message)

    common = dict(num_rounds=0, train_config=ConfigRecord({}), clock="virtual", delay_model="uniform-speed",
                  max_arrivals=6, concurrency=2, output_dir=str(tmp_path))
    initial = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    result = FedBuff(fraction_evaluate=0.0).start(FakeGrid(3, honest), initial, run_name="done", **common)
    assert result.summary["stop-reason"] == "max-arrivals 6 reached"
    with pytest.raises(ClientAppsFailing):
        FedBuff(fraction_evaluate=0.0).start(FakeGrid(3, broken), initial, run_name="failing", **common)
    summary = json.loads((tmp_path / "failing" / "summary.json").read_text())
    assert summary["stop-reason"].startswith("all nodes failing: ClientAppsFailing: the last 20 jobs all failed")


def test_a_later_unavailable_error_for_a_pulled_reply_does_not_replace_it():
    """The threaded puller may pull a job's id again after the SuperLink delivered (and deleted) its reply; the
    second pull answers Flower's MESSAGE_UNAVAILABLE error. While the reply waits in the inbox for its turn, that
    error must not overwrite it (a reply the client computed would be counted lost)."""
    from flwr.app import Metadata, RecordDict
    from flwr.app.message import make_message

    from asyncfl.server_app.transport import unavailable_reply

    class TwoPulls:
        pulls, miss_gap = 0, (0.0, 0)

        def __init__(self, *answers):
            self.answers = list(answers)

        def poll(self, waiting, sources):
            return self.answers.pop(0) if self.answers else []

    engine = make_engine(FakeGrid(2, plus_one), Recording(), max_arrivals=2)
    metadata = Metadata(run_id=1, message_id="", src_node_id=1, dst_node_id=0, reply_to_message_id="job-x",
                        group_id="", created_at=time.time(), ttl=60.0, message_type="train")
    computed = make_message(metadata=metadata, content=RecordDict())
    job = types.SimpleNamespace(client=0)
    engine.state.in_flight["job-x"] = engine.state.in_flight["job-y"] = job  # job-y keeps the engine pulling
    engine._puller = TwoPulls([computed], [unavailable_reply("job-x", "deleted after delivery")])
    assert engine._pull() == 1
    engine._pull()  # the error the re-pull queued in the first poll comes out with the next one
    assert engine.state.inbox["job-x"] is computed


def _scored_with_jobs_out(clock: str, refill_first: bool | None = None) -> tuple[list[tuple[int, int]], int]:
    """A run of 3 jobs out and rounds of 3 updates scored at their close: (rounds closed, jobs out) at each score,
    and how many train jobs went out; ``refill_first`` overrides the engine's choice."""
    grid = FakeGrid(3, plus_one)
    seen: list[tuple[int, int]] = []

    def evaluate(model):
        seen.append((engine.state.rounds_closed, len(engine.state.in_flight)))
        return 0.0, float(model[0])

    config = engine_config(None, clock=clock, max_arrivals=9, round_arrivals=3, evaluate_every=1,
                           evaluate_every_time=0.0)
    engine = AsyncEngine(grid, FedBuff(buffer_size=1), CODEC, np.zeros(3, np.float32), config, {}, evaluate)
    if refill_first is not None:
        engine._refill_first = refill_first
    engine.run()
    assert engine.stats.arrivals == 9 and not engine.state.in_flight
    return seen, sum(m.metadata.message_type == "train" for m in grid.pushed)


@pytest.mark.parametrize("clock, out_at_a_score", [("wall", 3), ("virtual", 2)])
def test_on_the_wall_clock_a_rounds_free_slot_gets_its_job_before_the_round_is_scored(clock, out_at_a_score):
    # Act
    seen, pushed = _scored_with_jobs_out(clock)
    # Assert: rounds 1 and 2 are scored with every slot out again on the wall clock (the virtual clock, whose order a
    # seed fixes, fills the freed slot in its loop, after the score)
    at_round_closes = [out for closed, out in seen if closed in (1, 2)]
    assert len(at_round_closes) == 2 and all(out == out_at_a_score for out in at_round_closes)
    if clock == "wall":  # the same jobs go out, only sooner: the stopping round sends none more out
        late_seen, late_pushed = _scored_with_jobs_out(clock, refill_first=False)
        assert [out for closed, out in late_seen if closed in (1, 2)] == [2, 2] and late_pushed == pushed
