"""Checkpoints: every strategy's state round-trips, a crashed run resumes to identical files, bad checkpoints
are refused before anything is overwritten."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from asyncfl.errors import CheckpointError
from asyncfl.models import build_model
from asyncfl.models.flat import model_to_flat
from asyncfl.server_app import checkpoint
from asyncfl.state import MOVED, capture, restore
from asyncfl.strategies import AFLDW, CA2FL, FADAS, FedAsync, FedAvg, FedBuff, FedFa, Strategy
from asyncfl.strategies.arrival import Arrival
from asyncfl.strategies.fedadt import FedADT, ServerSet
from asyncfl.strategies.fedecho import FedEcho
from asyncfl.strategies.fedrevive import DDFedRevive, FedRevive
from asyncfl.strategies.gi.strategy import GICompensation
from asyncfl.strategies.gi.unrolled import LocalProgram
from asyncfl.strategies.registry import STRATEGY_CLASSES
from asyncfl.strategies.stale_compensation import DCASGD, AsynTiers, StaleWeighted, WPred
from tests.fake_grid import FakeGrid, trained_reply

SHAPE, CLASSES = (1, 8, 8), 3


def _mlp():
    return build_model("mlp", SHAPE, CLASSES)


def _inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *SHAPE)).astype(np.float32)


#: One of every registered class, set so that each mechanism acts within a dozen arrivals.
STRATEGIES = {
    "fedavg": lambda: FedAvg(server_lr=0.9),
    "fedasync": lambda: FedAsync(),
    "fedbuff": lambda: FedBuff(buffer_size=3, staleness_weighting="sqrt"),
    "afl-dw": lambda: AFLDW(max_staleness=6.0),
    "ca2fl": lambda: CA2FL(buffer_size=3),
    "fadas": lambda: FADAS(buffer_size=2, staleness_threshold=2),
    "fedfa": lambda: FedFa(queue_size=3),
    "fedadt": lambda: FedADT(_mlp, ServerSet(_inputs(24), np.arange(24) % CLASSES), kd_batch_size=8, seed=3),
    "fedecho": lambda: FedEcho(_mlp, _inputs(30), buffer_size=2, distill_steps=2, distill_batch_size=8, seed=3),
    "fedrevive": lambda: FedRevive(_mlp, CLASSES, SHAPE, max_staleness=6.0, synthesis_start=0, synthesis_every=2,
                                   kd_start=2, kd_steps=2, latent_dim=8, synthesis_batch_size=8,
                                   teacher_buffer_size=3, seed=3),
    "dd-fedrevive": lambda: DDFedRevive(_mlp, CLASSES, SHAPE, (_inputs(24), np.arange(24) % CLASSES),
                                        lambda client, n: np.arange(1, CLASSES + 1), kd_start=1, kd_steps=2, seed=3),
    "stale-weighted": lambda: StaleWeighted(),
    "dc-asgd": lambda: DCASGD(),
    "w-pred": lambda: WPred(),
    "asyn-tiers": lambda: AsynTiers(boundary=1),
    "gi-compensation": lambda: GICompensation(_mlp, SHAPE, CLASSES, LocalProgram(epochs=1, steps=0, batch_size=10,
                                                                                 lr=0.1),
                                              inversion_iterations=3, warm_iterations=2, max_reconstruction=6,
                                              uniqueness=False, switch_window=0.5, seed=3),
}
STALENESS = [0, 2, 3, 0, 1, 4, 0, 2, 5, 1, 0, 3, 2, 0, 1, 4]


def _drive(strategy: Strategy, model: np.ndarray, steps: range) -> tuple[np.ndarray, list[np.ndarray]]:
    """Arrivals ``steps`` (each a function of its index and the model in effect), rounds of 3 for synchronous
    strategies; returns the final model and every model (and dispatched look-ahead) along the way."""
    seen = []
    for step in steps:
        rng = np.random.default_rng(step)
        staleness = STALENESS[step % len(STALENESS)]
        base = model - np.float32(0.002) * staleness
        weights = (base + np.float32(0.01) * rng.standard_normal(model.size).astype(np.float32)).astype(np.float32)
        arrival = Arrival(step % 5, max(0, step - staleness), staleness, weights, base.astype(np.float32),
                          10 + step % 3, 0.1, float(step))
        new = strategy.on_arrival(arrival, model)
        if new is not None:
            model = new
        if strategy.synchronous and step % 3 == 2:
            new = strategy.on_round_end(model)
            if new is not None:
                model = new
        lookahead = strategy.dispatch_model(step % 5, model)
        seen += [model.copy()] + ([lookahead] if lookahead is not None else [])
    return model, seen


def test_every_registered_strategy_is_covered():
    assert set(STRATEGIES) == set(STRATEGY_CLASSES)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_state_dict_round_trip_gives_identical_later_updates(name, tmp_path):
    # Prepare: one strategy runs 8 arrivals; its state goes through a checkpoint file into a fresh one
    torch.manual_seed(0)
    initial = model_to_flat(build_model("mlp", SHAPE, CLASSES, seed=1))
    first = STRATEGIES[name]()
    first.on_start(5, concurrency=3)
    model, _ = _drive(first, initial, range(8))
    path = tmp_path / "state.npz"
    checkpoint.write(path, {"strategy": first.state_dict()})
    second = STRATEGIES[name]()
    second.on_start(5, concurrency=3)
    second.load_state_dict(checkpoint.read(path)["strategy"])
    # Execute: both take the same next 10 arrivals
    torch.manual_seed(123)  # a strategy's draws must come from its own saved streams, not the global one
    end_first, along_first = _drive(first, model, range(8, 18))
    torch.manual_seed(456)
    end_second, along_second = _drive(second, model, range(8, 18))
    # Assert: bit for bit the same models and summaries
    assert len(along_first) == len(along_second)
    assert all(np.array_equal(a, b) for a, b in zip(along_first, along_second))
    assert not np.array_equal(end_first, model) or name == "fedavg"
    drop = ("seconds", "ms-per", "-ms-", "wall")  # wall-clock figures
    same = lambda s: repr({k: v for k, v in s.items() if not any(d in k for d in drop)})  # noqa: E731 (NaN == NaN)
    assert same(first.summary()) == same(second.summary())


def test_a_strategy_that_does_not_declare_its_state_cannot_be_checkpointed():
    class Mine(Strategy):
        def on_arrival(self, arrival, current):
            return None

    with pytest.raises(CheckpointError, match="state_attributes"):
        Mine().state_dict()
    assert not Mine().checkpointable and FedBuff().checkpointable


def test_state_from_another_class_or_other_knobs_is_refused():
    state = FedBuff(buffer_size=3).state_dict()
    with pytest.raises(CheckpointError, match="FedBuff, this run's is CA2FL"):
        CA2FL(buffer_size=3).load_state_dict(state)
    with pytest.raises(CheckpointError, match="buffer_size=3 there, 4 here"):
        FedBuff(buffer_size=4).load_state_dict(state)


def test_capture_copies_and_restore_loads_in_place():
    net = _mlp()
    generator = torch.Generator().manual_seed(5)
    saved = capture({"net": net, "gen": generator, "rng": np.random.default_rng(2), "bytes": b"ab", 3: (1, [2.5])})
    with torch.no_grad():
        next(net.parameters()).add_(1.0)
    torch.rand(3, generator=generator)
    back = restore({"net": net}, saved)
    assert back[3] == (1, [2.5]) and back["bytes"] == b"ab"
    live = restore(net, saved["items"][0][1])
    assert live is net and torch.equal(next(net.parameters()), next(iter(restore(_mlp(), saved["items"][0][1])
                                                                        .parameters())))
    assert torch.equal(torch.rand(2, generator=restore(generator, saved["items"][1][1])),
                       torch.rand(2, generator=torch.Generator().manual_seed(5)))


# ------------------------------------------------------------------ engine: crash and resume
NODES = 6


def _initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)),
                        "steps": Array(np.zeros(1, dtype=np.int64))})


class Crash(RuntimeError):
    """Stands in for the ServerApp process dying."""


def _grid(first_node: int = 101, crash_after: int | None = None) -> FakeGrid:
    """A client whose update depends on its partition, the model it got and its job seed; the server "dies"
    when the ``crash_after``-th train job is pushed."""
    pushed = {"train": 0}

    def client(node: int, message: Message) -> Message:
        partition = grid.nodes.index(node)
        record = message.content.array_records["arrays"]
        w = record["w"].numpy()
        if message.metadata.message_type == "evaluate":
            return Message(RecordDict({"metrics": MetricRecord({"num-examples": 5, "accuracy": float(np.abs(w).mean())})}),
                           reply_to=message)
        pushed["train"] += 1
        if crash_after is not None and pushed["train"] > crash_after:
            raise Crash("the server process died")
        seed = int(message.content.config_records["config"]["job-seed"])
        target = np.float32((seed % 89) / 89.0 + 0.05 * partition)
        out = ArrayRecord({"w": Array(w + np.float32(0.3) * (target - w)), "steps": Array(record["steps"].numpy() + 1)})
        return trained_reply(message, out, num_examples=10 + partition)

    grid = FakeGrid(NODES, client)
    grid.nodes = list(range(first_node, first_node + NODES))  # a resumed run meets new node ids
    return grid


def _evaluate(round_, arrays):
    w = arrays["w"].numpy()
    return MetricRecord({"accuracy": float(1.0 / (1.0 + np.abs(w - 0.5).sum())), "loss": float(np.square(w).sum())})


def _start(strategy, grid, folder, **options):
    return strategy.start(grid, _initial(), num_rounds=0, train_config=ConfigRecord({"lr": 0.1}),
                          evaluate_fn=_evaluate, clock="virtual", delay_model="fedrevive-default", seed=5,
                          max_arrivals=40, evaluate_every_time=1.0, output_dir=str(folder.parent),
                          run_name=folder.name, **options)


def _files(folder):
    return (folder / "metrics.csv").read_bytes()


def _digest(result) -> str:
    return hashlib.sha256(result.arrays["w"].numpy().tobytes() + result.arrays["steps"].numpy().tobytes()).hexdigest()


class AggregatingFedBuff(FedBuff):
    """FedBuff with Flower's aggregate_train overridden: its buffer's arrivals are part of its state."""

    def aggregate_train(self, server_round, replies):
        return super().aggregate_train(server_round, replies)


class ForgetfulFedBuff(AggregatingFedBuff):
    """The same, with a state of its own (state_dict, check_state, load_state_dict) that leaves FedBuff's buffered
    arrivals (``_held``) out."""

    def state_dict(self):
        state = super().state_dict()
        del state["state"]["_held"]
        return state

    def check_state(self, state):
        assert state["class"] == "ForgetfulFedBuff"

    def load_state_dict(self, state):
        for name, value in state["state"].items():
            setattr(self, name, restore(getattr(self, name, None), value, name))


def test_a_resumed_buffer_without_its_arrivals_is_refused_not_aggregated(tmp_path):
    from asyncfl.state import StateError

    # Prepare: B=3, stopped after 40 arrivals: the checkpoint holds 1 buffered update, without its arrival
    _start(ForgetfulFedBuff(buffer_size=3), _grid(), tmp_path / "run", checkpoint_every=4)
    # Execute: resume with a later stop
    # Assert: the first arrival after the resume is refused, saying what the state lacks
    with pytest.raises(StateError, match=r"ForgetfulFedBuff's buffer holds 1 updates but 0 of their arrivals "
                                         r"\(_held\) and 1 rows \(_sum\)"):
        ForgetfulFedBuff(buffer_size=3).start(_grid(), _initial(), num_rounds=0, evaluate_fn=_evaluate,
                                              clock="virtual", delay_model="fedrevive-default", seed=5, max_arrivals=45,
                                              evaluate_every_time=1.0, resume_from=str(tmp_path / "run"))


def _trusted_step(version, arrays):
    """The server's program on its trusted data: towards 0.5, with noise seeded by the version (as a resumed run
    must draw it again)."""
    w = arrays["w"].numpy()
    noise = np.random.default_rng(version).normal(0.0, 0.05, w.shape).astype(np.float32)
    return ArrayRecord({"w": Array(w + np.float32(0.3) * (np.float32(0.5) - w) + noise), "steps": arrays["steps"]})


RUNS = {
    "fedbuff": (lambda: FedBuff(buffer_size=3), {}),
    "fedasync-tail-average": (lambda: FedAsync(), {"tail_average_rounds": 3}),  # the window's round ends
    "fedasync-trusted-direction": (lambda: FedAsync(), {"trusted_train_fn": _trusted_step}),
    "fedbuff-aggregate-train": (lambda: AggregatingFedBuff(buffer_size=3), {}),
    "fedasync-overlap": (lambda: FedAsync(), {"overlap_server_compute": True}),
    "fedavg-deadline-pipelined": (lambda: FedAvg(), {"round_deadline": 1.5, "pipeline_late_clients": True}),
    "wpred": (lambda: WPred(), {"round_deadline": 1.5}),
}


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("crash_after", [10, 23])
def test_a_crashed_run_resumes_to_the_same_metrics_and_model(name, crash_after, tmp_path):
    make, options = RUNS[name]
    # Prepare: the uninterrupted run
    whole = _start(make(), _grid(), tmp_path / "whole", **options)
    # Execute: the same run, checkpointing every version, dies after some jobs; a new process resumes it
    with pytest.raises(Crash):
        _start(make(), _grid(crash_after=crash_after), tmp_path / "broken", checkpoint_every=1, **options)
    assert checkpoint.listed(tmp_path / "broken" / "checkpoints")
    resumed = make().start(_grid(first_node=501), _initial(), num_rounds=0, train_config=ConfigRecord({"lr": 0.1}),
                           evaluate_fn=_evaluate, clock="virtual", delay_model="fedrevive-default", seed=5,
                           max_arrivals=40, evaluate_every_time=1.0, checkpoint_every=1,
                           resume_from=str(tmp_path / "broken"), **options)
    # Assert: byte-identical metrics.csv, the same final model and per-round results
    assert _files(tmp_path / "broken") == _files(tmp_path / "whole")
    assert _digest(resumed) == _digest(whole)
    assert resumed.summary["arrivals"] == whole.summary["arrivals"] == 40
    assert resumed.summary["staleness-histogram"] == whole.summary["staleness-histogram"]
    assert {r: dict(m) for r, m in resumed.evaluate_metrics_serverapp.items()} == \
        {r: dict(m) for r, m in whole.evaluate_metrics_serverapp.items()}
    assert resumed.summary["resumed-from"].startswith(str(tmp_path / "broken"))
    for key in ("trusted-direction-checked", "trusted-direction-projected"):
        assert resumed.summary.get(key) == whole.summary.get(key)
    assert "trusted_train_fn" not in options or whole.summary["trusted-direction-projected"] > 0


@pytest.mark.parametrize("before, after", [(_trusted_step, None), (None, _trusted_step)])
def test_a_resume_that_would_add_or_drop_the_trusted_direction_is_refused_before_any_file_changes(tmp_path, before,
                                                                                                 after):
    with pytest.raises(Crash):
        _start(FedAsync(), _grid(crash_after=20), tmp_path / "run", checkpoint_every=2, trusted_train_fn=before)
    kept = _files(tmp_path / "run")
    with pytest.raises(CheckpointError, match="trusted_train_fn .* resume with the same setting"):
        FedAsync().start(_grid(first_node=501), _initial(), num_rounds=0, train_config=ConfigRecord({"lr": 0.1}),
                         evaluate_fn=_evaluate, clock="virtual", delay_model="fedrevive-default", seed=5, max_arrivals=40,
                         evaluate_every_time=1.0, resume_from=str(tmp_path / "run"), trusted_train_fn=after)
    assert _files(tmp_path / "run") == kept


def test_a_finished_run_resumed_with_a_later_stop_equals_the_longer_run(tmp_path):
    whole = FedBuff(buffer_size=3).start(_grid(), _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="virtual",
                                         delay_model="fedrevive-default", seed=5, max_arrivals=60, evaluate_every_time=1.0,
                                         output_dir=str(tmp_path), run_name="long")
    _start(FedBuff(buffer_size=3), _grid(), tmp_path / "short", checkpoint_every=4)
    extended = FedBuff(buffer_size=3).start(_grid(), _initial(), num_rounds=0, evaluate_fn=_evaluate,
                                            clock="virtual", delay_model="fedrevive-default", seed=5, max_arrivals=60,
                                            evaluate_every_time=1.0, resume_from=str(tmp_path / "short"))
    assert _digest(extended) == _digest(whole)
    assert _files(tmp_path / "short") == _files(tmp_path / "long")


def _broken_run(tmp_path):
    with pytest.raises(Crash):
        _start(FedBuff(buffer_size=3), _grid(crash_after=20), tmp_path / "run", checkpoint_every=2)
    return tmp_path / "run"


def _resume(strategy, folder, initial=None, **options):
    return strategy.start(_grid(), initial or _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="virtual",
                          delay_model=options.pop("delay_model", "fedrevive-default"), seed=options.pop("seed", 5),
                          max_arrivals=40, evaluate_every_time=1.0, resume_from=str(folder), **options)


@pytest.mark.parametrize("case, message", [
    ("other strategy", "strategy is FedBuff, this run's is CA2FL"),
    ("other knobs", "buffer_size=3 there, 4 here"),
    ("other layout", "model layout differs"),
    ("other seed", "seed=5 there, 6 here"),
    ("other delays", 'delay_model="DelayModel.*there'),
    ("truncated", "not a readable checkpoint"),
    ("no checkpoint", "no checkpoint in"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_and_nothing_is_overwritten(tmp_path, case, message):
    folder = _broken_run(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    newest = checkpoint.find(folder)
    location = folder
    if case == "truncated":
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
        location = newest
        before[newest.name] = newest.read_bytes()
    elif case == "no checkpoint":
        location = tmp_path / "elsewhere"
        location.mkdir()
    strategy = {"other strategy": CA2FL(buffer_size=3), "other knobs": FedBuff(buffer_size=4)}.get(
        case, FedBuff(buffer_size=3))
    initial = ArrayRecord({"w": Array(np.zeros((3, 2), np.float32)), "steps": Array(np.zeros(1, np.int64))}) \
        if case == "other layout" else None
    options = {"other seed": {"seed": 6}, "other delays": {"delay_model": "uniform-speed"}}.get(case, {})
    with pytest.raises(CheckpointError, match=message):
        _resume(strategy, location, initial, **options)
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_a_resumed_run_waits_for_all_the_checkpoints_clients_not_only_those_its_concurrency_needs(tmp_path):
    import threading

    # Prepare: a run of 6 clients at concurrency 2 dies; when it resumes, one node connects late.
    folder = tmp_path / "run"
    with pytest.raises(Crash):
        _start(FedBuff(buffer_size=3), _grid(crash_after=20), folder, checkpoint_every=2, concurrency=2)
    grid = _grid()
    late = grid.nodes.pop()
    joins = threading.Timer(0.5, lambda: grid.nodes.append(late))
    # Act: resume (2 nodes would fill its concurrency; the checkpoint knows 6).
    joins.start()
    try:
        result = FedBuff(buffer_size=3).start(grid, _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="virtual",
                                              delay_model="fedrevive-default", seed=5, max_arrivals=40, concurrency=2,
                                              evaluate_every_time=1.0, wait_for_nodes=60.0, resume_from=str(folder))
    finally:
        joins.cancel()
    # Assert: it waited for the late node and went on with all six, from the checkpoint.
    assert result.summary["clients"] == NODES and result.summary["arrivals"] == 40
    assert "resumed-from" in result.summary


def test_a_resume_waits_for_a_late_node_also_when_every_node_fills_its_concurrency_and_a_refusal_keeps_the_folder(
        tmp_path):
    import threading

    # Prepare: a run of 6 clients (concurrency 6, Flower's fraction_train=1.0) dies.
    folder = _broken_run(tmp_path)
    written = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    grid = _grid()
    late = grid.nodes.pop()
    # Act: resume with one node 2.5 s late (longer than the 2 s a fresh run's discovery settles in) ...
    joins = threading.Timer(2.5, lambda: grid.nodes.append(late))
    joins.start()
    try:
        result = _resume(FedBuff(buffer_size=3), folder, wait_for_nodes=60.0)
    finally:
        joins.cancel()
    # ... and once more with that node gone for good.
    gone = _grid()
    gone.nodes.pop()
    refused_folder = _broken_run(tmp_path / "again")
    before = {p.name: p.read_bytes() for p in refused_folder.iterdir() if p.is_file()}
    with pytest.raises(CheckpointError, match=r"after waiting up to 1s .*raise wait-for-nodes"):
        FedBuff(buffer_size=3).start(gone, _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="virtual",
                                     delay_model="fedrevive-default", seed=5, max_arrivals=40, evaluate_every_time=1.0,
                                     wait_for_nodes=1.0, resume_from=str(refused_folder))
    # Assert: the first resume waited and went on with all six; the refused one left the dead run's files as they were.
    assert result.summary["clients"] == NODES and result.summary["arrivals"] == 40 and written
    assert {p.name: p.read_bytes() for p in refused_folder.iterdir() if p.is_file()} == before


def test_checkpoints_are_written_atomically_and_only_the_newest_are_kept(tmp_path):
    store = checkpoint.Checkpoints(tmp_path, every=2, keep=2)
    assert store.due(2) and not store.due(1)
    for version in (2, 4, 6):
        store.save(lambda: {"x": np.arange(version)}, version, 10 * version)
    names = [p.name for p in checkpoint.listed(tmp_path)]
    assert names == ["checkpoint-v000004-a00000040.npz", "checkpoint-v000006-a00000060.npz"]
    assert not list(tmp_path.glob("*.partial"))
    assert np.array_equal(checkpoint.read(checkpoint.find(tmp_path))["x"], np.arange(6))
    assert not store.due(7) and store.due(8)
    assert store.summary()["checkpoints-written"] == 3


def test_a_run_keeps_one_checkpoint_by_default_and_reports_its_size_in_megabytes(tmp_path):
    # Prepare: a crash while writing left a partial file behind
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "checkpoint-v000001-a00000003.npz.partial").write_bytes(b"cut short")
    # Execute: checkpoints every 2 versions, checkpoint_keep left at its default
    result = _start(FedBuff(buffer_size=3), _grid(), tmp_path / "run", checkpoint_every=2)
    # Assert: the newest complete checkpoint alone is kept; sizes in MB of 10^6 bytes, as file listings count
    kept = checkpoint.listed(tmp_path / "run" / "checkpoints")
    assert len(kept) == 1 and result.summary["checkpoints-written"] > 1
    assert not list((tmp_path / "run" / "checkpoints").glob("*.partial"))
    size = kept[0].stat().st_size
    assert result.summary["checkpoints-kept"] == 1
    assert result.summary["checkpoint-mb"] == result.summary["checkpoints-kept-mb"] == round(size / 1e6, 3)


# ------------------------------------------------------------------ Flower's hooks
class HalvingFedBuff(FedBuff):
    """Flower's advanced-pytorch pattern: halve the learning rate every 2 rounds, node 1 of the list trains
    with a tag (a per-node config through the returned messages)."""

    state_attributes = FedBuff.state_attributes
    calls: list[int]

    def configure_train(self, server_round, arrays, config, grid):
        self.calls = getattr(self, "calls", []) + [server_round]
        if server_round % 2 == 0:
            config["lr"] *= 0.5
        messages = list(super().configure_train(server_round, arrays, config, grid))
        messages[1] = Message(RecordDict({"arrays": arrays, "config": ConfigRecord({**dict(config), "tag": 1})}),
                              dst_node_id=messages[1].metadata.dst_node_id, message_type="train")
        return messages


def test_a_configure_train_override_sets_every_jobs_config_per_round(tmp_path):
    strategy = HalvingFedBuff(buffer_size=3)
    grid = _grid()
    strategy.start(grid, _initial(), num_rounds=0, train_config=ConfigRecord({"lr": 0.8}), evaluate_fn=_evaluate,
                   clock="virtual", delay_model="fedrevive-default", seed=5, max_arrivals=40, evaluate_every_time=1.0)
    jobs = [m.content.config_records["config"] for m in grid.pushed if m.metadata.message_type == "train"]
    assert strategy.calls == sorted(set(strategy.calls)) and strategy.calls[0] == 1  # once per round, in order
    for config in jobs:  # halved for good at rounds 2, 4, 6: as under Flower's FedAvg
        assert config["lr"] == 0.8 * 0.5 ** (config["server-round"] // 2)
    tagged = [c for c, m in zip(jobs, [m for m in grid.pushed if m.metadata.message_type == "train"])
              if m.metadata.dst_node_id == grid.nodes[1]]
    assert tagged and all(c.get("tag") == 1 for c in tagged)
    assert all("tag" not in c for c, m in zip(jobs, [m for m in grid.pushed if m.metadata.message_type == "train"])
               if m.metadata.dst_node_id != grid.nodes[1])


def test_a_resumed_run_keeps_what_configure_train_changed(tmp_path):
    whole = HalvingFedBuff(buffer_size=3)
    grid = _grid()
    _start(whole, grid, tmp_path / "whole")
    with pytest.raises(Crash):
        _start(HalvingFedBuff(buffer_size=3), _grid(crash_after=23), tmp_path / "broken", checkpoint_every=1)
    resumed_grid = _grid(first_node=501)
    HalvingFedBuff(buffer_size=3).start(resumed_grid, _initial(), num_rounds=0, train_config=ConfigRecord({"lr": 0.1}),
                                        evaluate_fn=_evaluate, clock="virtual", delay_model="fedrevive-default", seed=5,
                                        max_arrivals=40, evaluate_every_time=1.0, resume_from=str(tmp_path / "broken"))
    assert _files(tmp_path / "broken") == _files(tmp_path / "whole")
    lrs = lambda g: [m.content.config_records["config"]["lr"] for m in g.pushed  # noqa: E731
                     if m.metadata.message_type == "train"]
    assert lrs(resumed_grid) == lrs(grid)[-len(lrs(resumed_grid)):]


def test_callbacks_hear_every_version_and_every_evaluation_with_its_model():
    from asyncfl import Callback

    class Tracker(Callback):
        def __init__(self):
            self.versions, self.rows, self.best = [], [], (-1.0, None)

        def on_version(self, info):
            self.versions.append((info.version, info.round, info.arrivals))

        def on_evaluation(self, info, metrics):
            self.rows.append(metrics)
            if metrics["accuracy"] > self.best[0]:
                self.best = (metrics["accuracy"], info.arrays["w"].numpy().copy())

    tracker = Tracker()
    result = FedBuff(buffer_size=3).start(_grid(), _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="virtual",
                                          delay_model="fedrevive-default", seed=5, max_arrivals=40, evaluate_every_time=1.0,
                                          callbacks=[tracker])
    assert [v for v, _, _ in tracker.versions] == list(range(1, result.summary["server-versions"] + 1))
    assert all(arrivals == 3 * v for v, _, arrivals in tracker.versions)  # FedBuff: a version per 3 updates
    assert len(tracker.rows) >= 10 and [r["server_version"] for r in tracker.rows] == sorted(
        r["server_version"] for r in tracker.rows)
    best_accuracy, best_w = tracker.best
    assert best_accuracy == result.summary["best-accuracy"]
    assert _evaluate(0, ArrayRecord({"w": Array(best_w)}))["accuracy"] == pytest.approx(best_accuracy)


def test_configure_evaluate_and_aggregate_evaluate_overrides_take_effect():
    class Custom(FedBuff):
        def configure_evaluate(self, server_round, arrays, config, grid):
            config["split"] = f"val-{server_round}"
            return super().configure_evaluate(server_round, arrays, config, grid)

        def aggregate_evaluate(self, server_round, replies):
            replies = list(replies)
            return MetricRecord({"replies": len(replies),
                                 "best": max(float(r.content["metrics"]["accuracy"]) for r in replies)})

    grid = _grid()
    result = Custom(buffer_size=3, fraction_evaluate=0.5).start(
        grid, _initial(), num_rounds=4, evaluate_fn=_evaluate, clock="virtual", delay_model="fedrevive-default", seed=5)
    sent = [m.content.config_records["config"] for m in grid.pushed if m.metadata.message_type == "evaluate"]
    assert sent and all(c["split"] == f"val-{c['server-round']}" for c in sent)
    assert set(result.evaluate_metrics_clientapp) == set(range(1, 5))  # rounds 1-4, none before training
    assert all(dict(m)["replies"] == 3 for m in result.evaluate_metrics_clientapp.values())


class Logged(FedBuff):
    """FedBuff that logs every update it takes in (client, examples, the update's bytes)."""

    state_attributes = FedBuff.state_attributes

    def __init__(self, log, **knobs):
        super().__init__(**knobs)
        self.log = log

    def on_arrival(self, arrival, current):
        self.log.append((arrival.client_index, arrival.num_examples, arrival.weights.tobytes()))
        return super().on_arrival(arrival, current)


def _wall_run(strategy, grid, folder, **options):
    """A wall-clock run of 30 arrivals checkpointed every 3 versions into ``folder / "wall"``; no dispatch hold:
    every freed slot goes out at once, so a crash (counted in pushes) comes well after the last checkpoint, with
    accepted updates between them."""
    return strategy.start(grid, _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="wall", seed=5,
                          evaluate_every=1, output_dir=str(folder), run_name="wall",
                          **{"max_arrivals": 30, "checkpoint_every": 3, "dispatch_hold": 0.0, **options})


def _crashed_wall_run(folder) -> tuple[list, object, int]:
    """A logged FedBuff wall-clock run (:func:`_wall_run`) that dies at its 22nd push: what its strategy took in,
    its newest checkpoint and the accepted updates that checkpoint holds."""
    before = []
    with pytest.raises(Crash):
        _wall_run(Logged(before, buffer_size=3), _grid(crash_after=22), folder)
    newest = checkpoint.find(folder / "wall")
    return before, newest, restore(None, checkpoint.read(newest)["stats"])["arrivals"]


def test_a_wall_clock_run_resumes_without_losing_an_accepted_update(tmp_path):
    def run(strategy, grid, **options):
        return _wall_run(strategy, grid, tmp_path, **options)

    (before, newest, at_checkpoint), after = _crashed_wall_run(tmp_path), []
    saved = checkpoint.read(newest)
    journal = checkpoint.read_journal(newest)
    assert len(before) > at_checkpoint and len(journal) >= len(before) - at_checkpoint  # accepted after it
    written = [r.split(",")[:5] for r in (tmp_path / "wall" / "metrics.csv").read_text().splitlines()[1:]]
    resumed = run(Logged(after, buffer_size=3), _grid(first_node=501), resume_from=str(tmp_path / "wall"))
    # every update the dead run accepted after its checkpoint is taken in again, first and in order
    assert after[: len(before) - at_checkpoint] == before[at_checkpoint:]
    assert resumed.summary["arrivals"] == 30 and resumed.summary["server-versions"] == 10
    replayed = {h["seq"] for h, _ in journal}
    lost = [job for job in saved["jobs"] if restore(None, job)["seq"] not in replayed]
    assert resumed.summary["rejected-by-reason"].get("lost-in-restart", 0) == len(lost)
    lines = (tmp_path / "wall" / "metrics.csv").read_text().splitlines()[1:]
    rows = [float(r.split(",")[0]) for r in lines]
    assert rows == sorted(rows)  # the wall clock goes on from the checkpoint's time, never back
    # every row the dead run wrote comes back as it was: the replay scores at the journaled points
    assert [r.split(",")[:5] for r in lines][: len(written)] == written


@pytest.mark.parametrize("make, every, crash, hold", [(lambda: FedBuff(buffer_size=3), 3, 22, 0.0),
                                                     (FedAsync, 7, 25, None)], ids=["fedbuff", "fedasync"])
def test_a_wall_clock_resume_takes_the_journal_s_replies_in_through_the_live_reply_path(tmp_path, monkeypatch, make,
                                                                                       every, crash, hold):
    """Issue 58: the replay is the live path (read, the participant's bounds, the count, the strategy), so after
    each replayed reply the bounds' history, the counters and the train metrics are those the dead run had after
    that reply: a clipped update and a reply the journal cannot hold (refused live and on replay) included.
    FedAsync steps at every arrival: a job sent after the checkpoint with the checkpoint's version is replayed
    after that version was replaced (its base is kept for it)."""
    from asyncfl.server_app.engine import AsyncEngine

    def bounded_state(engine):
        norm, count, stats = engine.bounds.norm, engine.bounds.count, engine.stats
        return (stats.arrivals, dict(stats.rejected), len(stats.reply_bytes), len(stats.round_trip_seconds),
                stats.metrics_trimmed,
                {c: list(t[:2]) for c, t in stats.by_client.items()}, [dict(g) for g in norm.latest],
                list(norm.recent_clients), norm.clipped, dict(count.latest), engine.versions.current.tobytes())

    after_reply: dict[tuple[str, int], tuple] = {}
    phase = ["dead run"]
    live_take_in = AsyncEngine.take_in

    def journal_so_far():
        try:
            return checkpoint.read_journal(checkpoint.find(tmp_path / "wall"))
        except checkpoint.CheckpointError:  # no checkpoint yet
            return []

    def refusals(journal):
        return {h["refused"][0] for h, _ in journal if "refused" in h}

    def take_in(engine, job, reply, base, refused=None):
        live_take_in(engine, job, reply, base, refused)
        if phase[0] == "dead run" or engine.replaying:
            after_reply[("replayed" if engine.replaying else "live", job.seq)] = bounded_state(engine)
        if phase[0] == "dead run" and engine.stats.arrivals >= crash:
            # the server dies once the newest checkpoint's journal holds what the replay must meet: node 4's
            # and node 5's refused replies (wall-clock order decides when that is, so it is waited for)
            if {"unrecordable", "wrong-layout"} <= refusals(journal_so_far()):
                raise Crash("the server process died")

    monkeypatch.setattr(AsyncEngine, "take_in", take_in)

    def hostile(grid):  # node 3's updates are 40 times too large (clipped); node 4 reports an int beyond 64 bits;
        # node 5 sends 50 arrays more than the model has; node 2 sends metrics beyond a report's size (cut, counted)
        reply_of = grid.handler

        def reply(node, message):
            out = reply_of(node, message)
            if message.metadata.message_type == "train" and grid.nodes.index(node) == 3:
                w = out.content.array_records["arrays"]["w"].numpy()
                sent = message.content.array_records["arrays"]["w"].numpy()
                out.content.array_records["arrays"]["w"] = Array(sent + np.float32(40.0) * (w - sent))
            if message.metadata.message_type == "train" and grid.nodes.index(node) == 4:
                out.content["metrics"]["junk"] = 2**64
            if message.metadata.message_type == "train" and grid.nodes.index(node) == 2:
                out.content["metrics"]["accuracy"] = [0.5] * 20_000
            if message.metadata.message_type == "train" and grid.nodes.index(node) == 5:
                extra = {f"extra-{i}": Array(np.zeros(1, np.float32)) for i in range(50)}  # journaled: its refusal
                out.content.array_records["arrays"].update(extra)
            return out

        grid.handler = reply
        return grid

    def run(grid, **options):
        return _wall_run(make(), grid, tmp_path, checkpoint_every=every, dispatch_hold=hold, max_arrivals=90,
                         **options)

    with pytest.raises(Crash):
        run(hostile(_grid()))
    journal = checkpoint.read_journal(checkpoint.find(tmp_path / "wall"))
    assert journal and all(h["kind"] in ("reply", "scored", "round-end") for h, _ in journal)
    phase[0] = "resumed run"
    resumed = run(hostile(_grid(first_node=501)), resume_from=str(tmp_path / "wall"))
    replayed = sorted(seq for kind, seq in after_reply if kind == "replayed")
    assert replayed == sorted(h["seq"] for h, _ in journal if h["kind"] == "reply")
    assert {"unrecordable", "wrong-layout"} <= refusals(journal)  # nodes 4 and 5: refused live, and so on replay
    assert resumed.summary["rejected-by-reason"].get("unrecordable", 0) > 0
    assert resumed.summary["rejected-by-reason"].get("wrong-layout", 0) > 0
    assert any(h["content"].get("metrics_trimmed") for h, _ in journal if "content" in h)
    journaled = {len(h["content"]["arrays"]) for h, _ in journal if "content" in h}
    assert journaled == {2}  # node 5's 52 arrays are journaled as their refusal alone
    for seq in replayed:
        assert after_reply["replayed", seq] == after_reply["live", seq], seq


def test_a_reply_carrying_more_than_the_path_takes_is_journaled_as_its_rejection_alone(tmp_path, monkeypatch):
    """A node pads its model's array with a megabyte the codec would never read, another sends 20,000 metric values:
    the journal (written before a reply is read) keeps the first's rejection, not its bytes, and the second's metrics
    as the path reads them, cut to a report's size (its update is taken)."""
    written: list[int] = []
    live_record = checkpoint.Checkpoints.record

    def record(self, header, *arrays):
        written.append(sum(a.nbytes for a in arrays))
        return live_record(self, header, *arrays)

    monkeypatch.setattr(checkpoint.Checkpoints, "record", record)
    grid = _grid()
    reply_of = grid.handler

    def bulky(node, message):
        out = reply_of(node, message)
        if message.metadata.message_type == "train" and grid.nodes.index(node) == 3:
            w = out.content.array_records["arrays"]["w"]
            out.content.array_records["arrays"]["w"] = Array(dtype=w.dtype, shape=tuple(w.shape), stype=w.stype,
                                                              data=w.data + b"\x00" * 1_000_000)
        if message.metadata.message_type == "train" and grid.nodes.index(node) == 4:
            out.content["metrics"]["accuracy"] = [0.5] * 20_000
        return out

    grid.handler = bulky
    result = _wall_run(FedBuff(buffer_size=3), grid, tmp_path)
    assert result.summary["rejected-by-reason"].get("undecodable", 0) > 0 and result.summary["metrics-trimmed"] > 0
    assert written and max(written) < 10_000  # an honest reply's model and metrics: a few hundred bytes


def test_a_replayed_job_sent_after_the_checkpoint_keeps_its_base_when_the_replay_replaced_that_version(tmp_path):
    # FedAsync steps at every arrival: its first replayed reply replaces the checkpoint's version, which a job sent
    # after the checkpoint carried; that job's reply, replayed later, still finds its base
    def run(grid, **options):
        return _wall_run(FedAsync(), grid, tmp_path, checkpoint_every=7, dispatch_hold=None, **options)

    with pytest.raises(Crash):
        run(_grid(crash_after=25))
    assert run(_grid(first_node=501), resume_from=str(tmp_path / "wall")).summary["arrivals"] == 30


def _moved_part(former: str):
    """A fresh instance of the class ``former`` now names, and some state to save from another one."""
    from asyncfl.server_app.participants import ExampleCountCeiling, UpdateNormBound
    from asyncfl.strategies.pace import ResponseMeter

    if former.endswith("ExampleCountCeiling"):
        return lambda: ExampleCountCeiling(3.0, [10, 12, 14]), {"latest": {1: 12, 2: 30}, "capped": 1}
    if former.endswith("UpdateNormBound"):
        return lambda: UpdateNormBound(3.0), {"latest": [{4: 0.5, 7: 0.25}], "clipped": 2, "largest_ratio": 1.5}
    return ResponseMeter, {"numerator": 0.75, "denominator": 2.5, "pairs": 6, "bound": 1.25}


@pytest.mark.parametrize("former", sorted(MOVED))
def test_a_checkpoint_naming_a_class_s_former_module_still_loads(former):
    make, state = _moved_part(former)
    saved = make()
    for name, value in state.items():
        setattr(saved, name, value)
    tree = capture(saved, "part")
    assert tree["type"] == MOVED[former]
    tree["type"] = former  # as checkpoints written before it moved name it
    live = restore(make(), tree, "part")
    assert {name: getattr(live, name) for name in state} == state


def test_a_journal_written_before_replies_were_kept_as_they_came_still_resumes(tmp_path):
    """A journal of the former format (each update as bounded, ``arrival`` / ``failed`` events) is replayed as it was
    then: its updates, straight to the strategy, first and in order."""
    import json

    (before, newest, at_checkpoint), after = _crashed_wall_run(tmp_path), []
    events = [h for h, _ in checkpoint.read_journal(newest) if h["kind"] == "reply"]
    taken = before[at_checkpoint:]  # what the strategy got after the checkpoint: the former journal's arrays
    assert len(taken) == len(events)
    with open(checkpoint.journal_of(newest), "wb") as handle:
        for header, (client, examples, weights) in zip(events, taken):
            legacy = {"kind": "arrival", "seq": header["seq"], "client": client, "version": header["version"],
                      "num_examples": examples, "train_loss": 0.5, "time": header["finish"],
                      "dispatched": header["dispatched"], "arrays": 1}
            np.save(handle, np.frombuffer(json.dumps(legacy).encode(), dtype=np.uint8))
            np.save(handle, np.frombuffer(weights, dtype=np.float32))
    resumed = _wall_run(Logged(after, buffer_size=3), _grid(first_node=501), tmp_path,
                        resume_from=str(tmp_path / "wall"))
    assert after[: len(taken)] == taken and resumed.summary["arrivals"] == 30


def test_a_wall_clock_run_resumed_keeps_every_row_scored_on_its_clock_before_the_crash(tmp_path):
    def run(grid, **options):
        return FedBuff(buffer_size=3).start(grid, _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="wall",
                                            seed=5, max_arrivals=30, evaluate_every=0, evaluate_every_time=0.005,
                                            output_dir=str(tmp_path), run_name="wall", checkpoint_every=3,
                                            dispatch_hold=0.0, **options)  # as above: updates after the checkpoint

    with pytest.raises(Crash):
        run(_grid(crash_after=22))
    journal = checkpoint.read_journal(checkpoint.find(tmp_path / "wall"))
    written = [r.split(",")[:5] for r in (tmp_path / "wall" / "metrics.csv").read_text().splitlines()[1:]]
    run(_grid(first_node=501), resume_from=str(tmp_path / "wall"))
    lines = (tmp_path / "wall" / "metrics.csv").read_text().splitlines()[1:]
    # the points scored after the checkpoint are in its journal, and the replay scores them between the same
    # events: the dead run's rows come back unchanged (time, version, arrivals, rejected, accuracy)
    assert any(h["kind"] == "scored" for h, _ in journal)
    assert [r.split(",")[:5] for r in lines][: len(written)] == written


def test_a_wall_clock_run_resumes_from_its_checkpoint_and_counts_the_jobs_lost_in_the_crash(tmp_path):
    def run(grid, **options):
        return FedBuff(buffer_size=3).start(grid, _initial(), num_rounds=0, evaluate_fn=_evaluate, clock="wall",
                                            seed=5, max_arrivals=30, evaluate_every=1, output_dir=str(tmp_path),
                                            run_name="wall", checkpoint_every=1, **options)

    with pytest.raises(Crash):
        run(_grid(crash_after=20))
    newest = checkpoint.find(tmp_path / "wall")
    saved = checkpoint.read(newest)
    in_flight, accepted = len(saved["jobs"]), restore(None, saved["stats"])["arrivals"]
    assert in_flight and accepted
    # a job whose reply came after the checkpoint and before the crash is in its journal: replayed, not lost (how
    # many depends on the wall clock's order, so it is read, not assumed)
    replayed = {h["seq"] for h, _ in checkpoint.read_journal(newest)}
    lost = [job for job in saved["jobs"] if restore(None, job)["seq"] not in replayed]
    resumed = run(_grid(first_node=501), resume_from=str(tmp_path / "wall"))
    assert resumed.summary["arrivals"] == 30  # the checkpoint's accepted updates count: only the rest is trained
    assert resumed.summary["dispatched"] >= restore(None, saved["stats"])["dispatched"] + 30 - accepted
    assert resumed.summary["rejected-by-reason"] == ({"lost-in-restart": len(lost)} if lost else {})
    assert resumed.summary["server-versions"] == 10


def test_a_knob_added_after_the_checkpoint_counts_as_saved_at_its_default():
    # Prepare: a checkpoint written before FedBuff had its pace knob
    state = FedBuff().state_dict()
    state["config"]["items"] = [item for item in state["config"]["items"] if item[0] != "pace"]
    # Execute / Assert: the default reproduces the saved run; another value does not
    FedBuff().load_state_dict(state)
    with pytest.raises(CheckpointError, match="pace=None there, 'stable' here"):
        FedBuff(pace="stable").load_state_dict(state)


def test_callbacks_carry_a_trackers_series_as_flowers_result_does():
    from asyncfl import Callback

    class Tracker(Callback):
        def __init__(self):
            self.train, self.federated, self.scored = {}, {}, []

        def on_train_metrics(self, server_round, metrics):
            self.train[server_round] = metrics

        def on_federated_evaluation(self, server_round, metrics):
            self.federated[server_round] = metrics

        def on_evaluation(self, info, metrics):
            self.scored.append((info.version, info.round))

    # Prepare / Execute: 4 rounds with federated evaluation on half the nodes
    tracker = Tracker()
    result = FedBuff(buffer_size=3, fraction_evaluate=0.5).start(
        _grid(), _initial(), num_rounds=4, evaluate_fn=_evaluate, clock="virtual", delay_model="fedrevive-default", seed=5,
        callbacks=[tracker])
    # Assert: the same series as the Result, as they come; each (version, round) scored once
    assert tracker.train == {r: dict(m) for r, m in result.train_metrics_clientapp.items()} and tracker.train
    assert tracker.federated == {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
    assert sorted(tracker.federated) == [1, 2, 3, 4]
    assert len(tracker.scored) == len(set(tracker.scored))


def test_settings_recorded_under_their_former_names_are_read_under_todays(caplog):
    """Checkpoints written before EngineConfig took RunOptions' names (eval_every, eval_every_rounds, overlap, delays)
    still fit the run that made them, still say what differs, and one line says which names were read as what."""
    import logging

    from asyncfl.options import RunOptions

    config = RunOptions(clock="virtual", delay_model="uniform-speed", evaluate_every=2, evaluate_every_time=5.0).engine_config(
        num_rounds=3, timeout=10.0, concurrency=2, round_arrivals=2, node_wait=0.0)
    today = checkpoint.resume_settings(config)
    former = {{"evaluate_every_time": "eval_every", "evaluate_every": "eval_every_rounds",
               "overlap_server_compute": "overlap", "delay_model": "delays"}.get(k, k): v for k, v in today.items()}
    assert "overlap" in former and "overlap_server_compute" not in former and "delays" in former
    with caplog.at_level(logging.INFO, logger="asyncfl.engine"):
        assert checkpoint.saved_settings({"settings": former}) == today  # read again during a resume: silent
        assert checkpoint.saved_settings({"settings": former}, say=True) == today
    notices = [r.getMessage() for r in caplog.records if "former name" in r.getMessage()]
    assert len(notices) == 1 and "delays" in notices[0] and "delay_model" in notices[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="asyncfl.engine"):
        checkpoint.saved_settings({"settings": today}, say=True)
    assert not [r for r in caplog.records if "former name" in r.getMessage()]
    former["eval_every"] = 7.0
    assert checkpoint.saved_settings({"settings": former})["evaluate_every_time"] == 7.0


@pytest.mark.parametrize("name, value", [("concurrency", "4"), ("concurrency", 0), ("round_arrivals", 2.5),
                                         ("round_arrivals", True), ("concurrency", None)])
def test_a_checkpoint_whose_taken_settings_are_not_whole_numbers_is_refused_in_one_line(name, value):
    """A resumed run takes the cohort and the concurrency from its checkpoint: a changed file is refused, not a
    traceback later."""
    from asyncfl.options import RunOptions

    config = RunOptions(clock="virtual", delay_model="uniform-speed").engine_config(
        num_rounds=3, timeout=10.0, concurrency=2, round_arrivals=2, node_wait=0.0)
    settings = {**checkpoint.resume_settings(config), name: value}
    with pytest.raises(CheckpointError, match=f"the checkpoint's {name} is .*, not a whole number") as error:
        checkpoint.saved_settings({"settings": settings})
    assert "\n" not in str(error.value)


def test_a_journal_keeps_of_a_worker_record_only_the_names_the_reply_path_reads():
    """A node may put anything in its ``asyncfl-worker`` record: the journal keeps the process and Ray node names as
    the live path reads them (200 characters, a str or an int), not a megabyte of something else."""
    from flwr.common import serde
    from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

    from asyncfl import protocol
    from asyncfl.server_app.journal import _parts

    worker = ConfigRecord({protocol.PROCESS: "p" * 1000, protocol.RAY_NODE: 7, "junk": b"x" * 1_000_000,
                           "flag": True})
    content = RecordDict({"arrays": ArrayRecord(), protocol.WORKER_RECORD: worker})
    _, _, small, _ = _parts(content, "arrays")
    proto = RecordDictProto()
    proto.ParseFromString(small)
    kept = serde.recorddict_from_proto(proto).config_records[protocol.WORKER_RECORD]
    assert dict(kept) == {protocol.PROCESS: "p" * protocol.WORKER_NAME_CHARS, protocol.RAY_NODE: "7"}
    assert len(small) < 1000
