"""The public API: Flower-style constructors and ``start()`` returning Flower's ``Result``, on a fake Grid."""

import json
import os
import signal
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result

import asyncfl
from asyncfl import DDFedRevive, FedADT, FedAvg, FedBuff, FedEcho, FedRevive, GICompensation
from asyncfl.simulation.delays import ComponentDelay, DelayModel
from tests.fake_grid import FakeGrid

FIXED = DelayModel(
    download=ComponentDelay("constant", ((1.0, 0.0),)),
    train=ComponentDelay("constant", ((1.0, 1.0),)),
    upload=ComponentDelay("constant", ((1.0, 0.0),)),
)


class TinyBN(torch.nn.Module):
    """A linear layer and a BatchNorm: float weights plus an int64 ``num_batches_tracked`` buffer."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.bn = torch.nn.BatchNorm1d(2)


def initial_record() -> ArrayRecord:
    model = TinyBN()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return ArrayRecord(model.state_dict())


def client(node, message):
    """Train: every float entry + 1 and one more batch tracked; evaluate: metrics that name the version."""
    state = message.content["arrays"].to_torch_state_dict()
    if message.metadata.message_type == "evaluate":
        version = int(message.content["config"]["model-version"])
        metrics = MetricRecord({"eval-acc": 0.1 * version, "num-examples": 4})
        return Message(RecordDict({"metrics": metrics}), reply_to=message)
    trained = OrderedDict((k, v + 1) for k, v in state.items())
    metrics = MetricRecord({"train_loss": float(node), "num-examples": 10})
    return Message(RecordDict({"arrays": ArrayRecord(trained), "metrics": metrics}), reply_to=message)


def server_evaluate(version: int, arrays: ArrayRecord) -> MetricRecord:
    weight = arrays.to_torch_state_dict()["fc.weight"]
    return MetricRecord({"accuracy": float(weight.mean()), "loss": 1.0})


def test_public_names_are_importable_from_asyncfl():
    for name in ("FedAvg", "FedAsync", "FedBuff", "AFLDW", "CA2FL", "FADAS", "FedFa", "FedADT", "FedEcho",
                 "FedRevive", "DDFedRevive", "GICompensation", "StaleWeighted", "DCASGD", "WPred", "AsynTiers"):
        assert isinstance(getattr(asyncfl, name), type), name
    with pytest.raises(AttributeError):
        asyncfl.NoSuchStrategy


def test_fedbuff_start_returns_flowers_result_keyed_by_round():
    # Prepare: 4 nodes, FedBuff B=2 (the paper's server step 1, so a version adds the mean "+1") with 2 jobs in
    # flight, every job taking 1 time unit; 3 rounds requested.
    grid = FakeGrid(4, client)
    strategy = FedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.5, min_evaluate_nodes=1)
    # Execute
    # (update_norm_bound=0: "+1" on a model of ones moves it by its whole norm, which the bound's warm-up clips;
    # the bound has its own tests, here the arithmetic is checked)
    result = strategy.start(grid=grid, initial_arrays=initial_record(), num_rounds=3, clock="virtual",
                            delay_model=FIXED, concurrency=2, train_config=ConfigRecord({"lr": 0.1}),
                            evaluate_fn=server_evaluate, seed=1, update_norm_bound=0.0)
    # Assert: a Flower Result; 3 rounds = 3 x 4 updates (FedAvg's cohort on 4 nodes with fraction_train=1),
    # i.e. 6 FedBuff versions, each averaging two "+1" deltas
    assert isinstance(result, Result)
    assert result.summary["arrivals"] == 12 and result.summary["server-versions"] == 6
    assert result.summary["rounds"] == 3 and result.summary["updates-per-round"] == 4
    final = result.arrays.to_torch_state_dict()
    assert torch.allclose(final["fc.weight"], torch.full((2, 2), 6.0))
    assert final["bn.num_batches_tracked"].dtype == torch.int64
    assert int(final["bn.num_batches_tracked"]) == 6
    # every dict is keyed by round, as Flower's; round 2 ended at version 4
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]
    assert result.evaluate_metrics_serverapp[2]["accuracy"] == pytest.approx(4.0)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert "train_loss" in result.train_metrics_clientapp[1]
    # federated evaluation: 2 of 4 nodes at the end of each round (not before the first, as Flower), their
    # metrics averaged by num-examples
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2, 3]
    assert result.evaluate_metrics_clientapp[3]["eval-acc"] == pytest.approx(0.6)
    evaluate_requests = [m for m in grid.pushed if m.metadata.message_type == "evaluate"]
    assert len(evaluate_requests) == 6
    assert [m.content["config"]["server-round"] for m in evaluate_requests[-2:]] == [3, 3]
    assert evaluate_requests[-1].content["config"]["model-version"] == 6
    # the train request carries the user's train_config plus the version keys; server-round is the round
    # in progress when the job was sent
    train_configs = [m.content["config"] for m in grid.pushed if m.metadata.message_type == "train"]
    assert train_configs[0]["lr"] == 0.1 and train_configs[0]["model-version"] == 0
    assert train_configs[0]["server-round"] == 1 and train_configs[-1]["server-round"] == 3


def test_num_rounds_buys_the_same_client_updates_for_every_strategy():
    # Prepare: 10 nodes, fraction_train=0.3: Flower's FedAvg trains 3 nodes a round
    updates = {}
    for strategy in (FedAvg(fraction_train=0.3, fraction_evaluate=0.0),
                     FedBuff(buffer_size=2, fraction_train=0.3, fraction_evaluate=0.0),
                     asyncfl.FedAsync(fraction_train=0.3, fraction_evaluate=0.0)):
        # Execute: 4 rounds, 5 jobs in flight for the asynchronous ones
        grid = FakeGrid(10, client)
        result = strategy.start(grid, initial_record(), num_rounds=4, clock="virtual", delay_model=FIXED,
                                concurrency=None if strategy.synchronous else 5, evaluate_fn=server_evaluate)
        updates[type(strategy).__name__] = (result.summary["arrivals"], result.summary["server-versions"],
                                            sorted(result.evaluate_metrics_serverapp))
    # Assert: 4 x 3 accepted updates each, however many versions they became; same round keys
    assert updates == {"FedAvg": (12, 4, [0, 1, 2, 3, 4]), "FedBuff": (12, 6, [0, 1, 2, 3, 4]),
                       "FedAsync": (12, 12, [0, 1, 2, 3, 4])}


def test_same_seed_same_result_and_virtual_order():
    def run(seed):
        tiers = ComponentDelay("uniform", ((0.5, 1.0), (0.5, 3.0)), spread=0.5)
        delays = DelayModel(FIXED.download, tiers, FIXED.upload)
        grid = FakeGrid(5, client, release=lambda waiting: list(reversed(waiting))[:1])
        result = FedBuff(buffer_size=1, fraction_evaluate=0.0).start(
            grid, initial_record(), num_rounds=6, clock="virtual", delay_model=delays, concurrency=3, seed=seed,
            evaluate_fn=server_evaluate)
        return {v: m["accuracy"] for v, m in result.evaluate_metrics_serverapp.items()}, result.summary

    first, summary = run(3)
    again, _ = run(3)
    assert first == again
    assert summary["staleness-max"] >= 1  # 3 jobs in flight, one version per arrival


def test_fedavg_preset_uses_fraction_train_as_its_cohort():
    grid = FakeGrid(10, client)
    result = FedAvg(fraction_train=0.3, fraction_evaluate=0.0).start(
        grid, initial_record(), num_rounds=2, clock="virtual", delay_model=FIXED)
    train_requests = [m for m in grid.pushed if m.metadata.message_type == "train"]
    assert len(train_requests) == 6  # 2 rounds of int(0.3 * 10) = 3 nodes
    assert result.summary["staleness-max"] == 0
    assert torch.allclose(result.arrays.to_torch_state_dict()["fc.bias"], torch.full((2,), 2.0))


def test_bad_replies_are_rejected_and_counted_run_goes_on():
    def flaky(node, message):
        if message.metadata.message_type == "train" and node == 101:
            return Message(Error(code=0, reason="boom"), reply_to=message)
        if message.metadata.message_type == "train" and node == 102:  # wrong layout
            return Message(RecordDict({"arrays": ArrayRecord([np.zeros(3, np.float32)]),
                                       "metrics": MetricRecord({"num-examples": 1})}), reply_to=message)
        return client(node, message)

    result = FedBuff(buffer_size=1, fraction_evaluate=0.0).start(
        FakeGrid(4, flaky), initial_record(), num_rounds=4, clock="virtual", delay_model=FIXED, concurrency=4)
    assert result.summary["arrivals"] == 16 and result.summary["server-versions"] == 16  # 4 rounds of 4 accepted
    assert result.summary["rejected-by-reason"]["error-reply"] >= 1
    assert result.summary["rejected-by-reason"]["wrong-layout"] >= 1


def test_custom_keys_and_metric_aggregation():
    def keyed(node, message):
        state = message.content["weights"].to_torch_state_dict()
        trained = OrderedDict((k, v + 1) for k, v in state.items())
        metrics = MetricRecord({"n": 2, "train_loss": 1.0})
        return Message(RecordDict({"weights": ArrayRecord(trained), "metrics": metrics}), reply_to=message)

    seen = []

    def count_replies(records, key):
        seen.append((len(records), key))
        return MetricRecord({"replies": len(records)})

    result = FedBuff(buffer_size=2, fraction_evaluate=0.0, arrayrecord_key="weights", configrecord_key="cfg",
                     weighted_by_key="n", train_metrics_aggr_fn=count_replies).start(
        FakeGrid(3, keyed), initial_record(), num_rounds=2, clock="virtual", delay_model=FIXED, concurrency=2)
    # a round is the 3 updates FedAvg would train on 3 nodes: the user's aggregation sees each round's replies
    assert result.train_metrics_clientapp == {1: MetricRecord({"replies": 3}), 2: MetricRecord({"replies": 3})}
    assert seen == [(3, "n"), (3, "n")]


@pytest.mark.parametrize("kwargs, message", [
    (dict(fraction_train=1.5), "fraction_train"),
    (dict(min_evaluate_nodes=-1), "min_evaluate_nodes"),
    (dict(weighted_by_key=""), "weighted_by_key"),
    (dict(evaluate_metrics_aggr_fn=3), "evaluate_metrics_aggr_fn"),
    (dict(buffer_size=-1), "buffer-size"),
])
def test_constructor_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedBuff(**kwargs)


def test_unknown_keyword_names_the_valid_ones():
    with pytest.raises(TypeError, match="fraction_evaluate"):
        FedBuff(buffer=3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(clock="virtual"), "delay model"),
    (dict(clock="sundial"), "clock"),
    (dict(clock="virtual", delay_model="no-such-preset"), "preset"),
    (dict(num_rounds=0), "never stop"),
    (dict(evaluate_every=0), "evaluate_every"),
    (dict(round_deadline=1.0), "round-deadline"),
    (dict(clock="virtual", delay_model="uniform-speed", pipeline_late_clients=True), "pipeline-late-clients"),
    (dict(overlap_server_compute=True, server_time_scale=1.0), "overlap"),
    (dict(emulate_delay_scale=1.0), "emulate_delay_scale"),
])
def test_start_validation_happens_before_any_message(kwargs, message):
    grid = FakeGrid(2, client)
    with pytest.raises(ValueError, match=message):
        FedBuff().start(grid, initial_record(), **kwargs)
    assert grid.pushed == []


def test_run_folder_is_written_when_asked(tmp_path):
    FedBuff(buffer_size=1, fraction_evaluate=0.0).start(
        FakeGrid(2, client), initial_record(), num_rounds=2, clock="virtual", delay_model=FIXED, evaluate_fn=server_evaluate,
        output_dir=str(tmp_path), run_name="lib")
    folder = tmp_path / "lib"
    lines = (folder / "metrics.csv").read_text().splitlines()
    assert lines[0].startswith("time,server_version,arrivals")
    assert len(lines) == 1 + 3  # versions 0, 1, 2
    assert (folder / "summary.json").exists()


class UserNet(torch.nn.Module):
    """A user's own model for 2-feature inputs, with BatchNorm (float running stats, int64 batch counter)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


def test_fedecho_distils_into_a_user_model():
    # Prepare: clients return the received model shifted by +0.01 (floats) and one more tracked batch.
    def shift(node, message):
        state = message.content["arrays"].to_torch_state_dict()
        trained = OrderedDict((k, v + (1 if not v.is_floating_point() else 0.01)) for k, v in state.items())
        return Message(RecordDict({"arrays": ArrayRecord(trained),
                                   "metrics": MetricRecord({"num-examples": 5})}), reply_to=message)

    torch.manual_seed(0)
    initial = ArrayRecord(UserNet().state_dict())
    inputs = torch.randn(16, 2)
    strategy = FedEcho(model_fn=UserNet, distill_inputs=inputs, buffer_size=2, distill_steps=2, distill_lr=1e-3,
                       fraction_evaluate=0.0,
                       fraction_train=0.5)  # a round = max(min_train_nodes=2, int(0.5 * 3)) = 2 updates
    # Execute
    result = strategy.start(FakeGrid(3, shift), initial, num_rounds=2, clock="virtual", delay_model=FIXED, concurrency=2)
    # Assert: the user's layout comes back, distillation ran on every version, logits from every client kept
    final = result.arrays.to_torch_state_dict()
    assert list(final) == list(UserNet().state_dict())
    assert final["bn.num_batches_tracked"].dtype == torch.int64
    assert result.summary["aggregations"] == 2 and result.summary["logit-clients"] >= 2
    buffered = initial.to_torch_state_dict()["fc.weight"] + 0.01 * 2  # two FedBuff steps of +0.01, before KD
    assert not torch.allclose(final["fc.weight"], buffered)  # the KD steps moved the weights


def test_fedecho_takes_a_dataset_and_ignores_its_labels():
    data = torch.utils.data.TensorDataset(torch.randn(6, 2), torch.zeros(6, dtype=torch.long))
    strategy = FedEcho(model_fn=UserNet, distill_inputs=data)
    assert tuple(strategy.unlabeled.shape) == (6, 2)


def test_fedadt_takes_labeled_server_data_as_a_pair():
    strategy = FedADT(model_fn=UserNet, server_data=(np.zeros((4, 2)), np.array([0, 1, 2, 0])))
    assert strategy.server_set.x.dtype == np.float32 and strategy.server_set.y.tolist() == [0, 1, 2, 0]


@pytest.mark.parametrize("build, message", [
    (lambda: FedEcho(model_fn=None, distill_inputs=np.zeros((2, 2))), "model_fn"),
    (lambda: FedEcho(model_fn=lambda: "not a module", distill_inputs=np.zeros((2, 2))), "torch.nn.Module"),
    (lambda: FedEcho(model_fn=UserNet, distill_inputs=None), "distill_inputs"),
    (lambda: FedEcho(model_fn=UserNet, distill_inputs=np.zeros((0, 2))), "empty"),
    (lambda: FedADT(model_fn=UserNet, server_data="data.csv"), "server_data"),
    (lambda: FedADT(model_fn=UserNet, server_data=(np.zeros((3, 2)), np.zeros(2))), "as many labels"),
    (lambda: FedRevive(model_fn=UserNet, num_classes=3, input_shape=(2,)), "input_shape"),
    (lambda: DDFedRevive(model_fn=UserNet, num_classes=3, input_shape=(1, 1, 2), server_data=None,
                         label_proportions=lambda c, n: [1, 1, 1]), "server_data"),
    (lambda: DDFedRevive(model_fn=UserNet, num_classes=3, input_shape=(1, 1, 2),
                         server_data=(np.zeros((2, 1, 1, 2)), np.zeros(2)), label_proportions=None),
     "label_proportions"),
    (lambda: GICompensation(model_fn=UserNet, input_shape=(2,), num_classes=3, local_program=None),
     "local_program"),
])
def test_server_side_methods_name_the_missing_piece(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_clock_scheduled_evaluation_as_the_builtin_app_uses_it(tmp_path):
    # evaluate_every=0 with evaluate_every_time=2: rows at t = 0, 2, 4 (jobs take 1 unit; 3 in flight); the point at
    # t = 4 scores the model before that time's 3 arrivals (version 9), so the stop, also at 4, scores version 12
    FedBuff(buffer_size=1, fraction_evaluate=0.0).start(
        FakeGrid(3, client), initial_record(), num_rounds=0, max_arrivals=12, clock="virtual", delay_model=FIXED,
        concurrency=3, evaluate_fn=server_evaluate, evaluate_every=0, evaluate_every_time=2.0,
        output_dir=str(tmp_path), run_name="clock")
    rows = (tmp_path / "clock" / "metrics.csv").read_text().splitlines()[1:]
    assert [tuple(float(v) for v in r.split(",")[:2]) for r in rows] == [(0.0, 0), (2.0, 3), (4.0, 9), (4.0, 12)]


def test_dd_fedrevive_distils_on_the_server_data_it_is_given():
    x, y = np.zeros((6, 1, 4, 4), np.float32), np.array([0, 1, 2, 0, 1, 2])
    strategy = DDFedRevive(model_fn=lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)),
                           num_classes=3, input_shape=(1, 4, 4), server_data=(x, y),
                           label_proportions=lambda c, n: [1, 1, 1])
    assert strategy.data_driven and len(strategy.pool) == 6


def test_identity_query_only_where_the_client_order_matters():
    # Wall clock (the default, deployments and stock apps): no query message; virtual clock: each node is asked
    # (the seed fixes the client order only by partition id)
    for clock, expected in (("wall", 0), ("virtual", 3)):
        grid = FakeGrid(3, client)
        FedBuff(buffer_size=1, fraction_evaluate=0.0).start(grid, initial_record(), num_rounds=1, clock=clock,
                                                            delay_model=FIXED if clock == "virtual" else None)
        assert sum(m.metadata.message_type == "query" for m in grid.pushed) == expected, clock


def test_help_on_a_strategy_describes_its_constructor():
    import pydoc

    import asyncfl

    for name in ("FedBuff", "FedAsync", "FedADT", "FedRevive"):
        text = pydoc.render_doc(getattr(asyncfl, name), renderer=pydoc.plaintext)
        assert "Initialize self" not in text, name
        assert f"Build {name}: its knobs are the keywords above" in text


def test_the_worked_example_strategy_in_the_docs_runs_and_its_test_passes():
    # the two code blocks of docs/library.md "Write your own asynchronous strategy", executed as written
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "library.md").read_text()
    section = text.split("## Write your own asynchronous strategy", 1)[1].split("\n## ", 1)[0]
    example, test = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(example + test, "docs/library.md", "exec"), namespace)
    namespace["test_capped_async_mixes_by_staleness_and_drops_the_stalest"]()
    # and the engine runs it: a seeded simulation over the fake Grid
    result = namespace["CappedAsync"](mixing=0.6).start(FakeGrid(4, client), initial_record(), num_rounds=2,
                                                       clock="virtual", delay_model=FIXED, concurrency=2, seed=1)
    assert result.summary["arrivals"] == 8 and "dropped" in result.summary


def test_rounds_count_from_one_and_a_run_shorter_than_a_round_reports_round_one():
    # Prepare: 4 nodes, so a round is 4 updates; the run stops after 3 accepted updates (inside round 1), scored on
    # the clock every time unit as the built-in app does
    grid = FakeGrid(4, client)
    strategy = FedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.5, min_evaluate_nodes=1)
    # Execute
    result = strategy.start(grid, initial_record(), num_rounds=0, max_arrivals=3, clock="virtual", delay_model=FIXED,
                            concurrency=2, evaluate_fn=server_evaluate, evaluate_every=0, evaluate_every_time=1.0,
                            seed=1, update_norm_bound=0.0)
    # Assert: round 0 is the initial model's evaluation only; every point after an update is round 1, the partial
    # round whose train metrics, server-side and federated evaluations are keyed 1
    assert result.summary["rounds"] == 1 and result.summary["rounds-complete"] == 0
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1]
    assert sorted(result.train_metrics_clientapp) == [1]
    assert sorted(result.evaluate_metrics_clientapp) == [1]
    evaluated = [m for m in grid.pushed if m.metadata.message_type == "evaluate"]
    assert {m.content["config"]["server-round"] for m in evaluated} == {1}


def _interrupting_client(after: int, interrupt):
    """``client``, but the ``after``-th train request interrupts the run (``interrupt()``) as Ctrl-C would."""
    calls = []

    def handle(node, message):
        if message.metadata.message_type == "train":
            calls.append(node)
            if len(calls) == after:
                interrupt()
        return client(node, message)

    return handle


def _raise(exc):
    raise exc


@pytest.mark.parametrize("interrupt, reason", [
    (lambda: _raise(KeyboardInterrupt()), "interrupted (Ctrl-C)"),
    (lambda: _raise(SystemExit(0)), "interrupted (the process was told to exit"),  # Flower's ServerApp on a signal
    (lambda: os.kill(os.getpid(), signal.SIGTERM), "interrupted (SIGTERM)"),
])
def test_an_interrupted_run_writes_a_summary_that_says_so(tmp_path, interrupt, reason):
    # Prepare: the 6th train request is interrupted (Ctrl-C, Flower's exit on a signal, SIGTERM to a plain process)
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        pytest.skip("this process handles SIGTERM itself")
    grid = FakeGrid(4, _interrupting_client(6, interrupt))
    # Execute
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        FedBuff(buffer_size=2, fraction_evaluate=0.0).start(
            grid, initial_record(), num_rounds=5, clock="virtual", delay_model=FIXED, concurrency=2,
            evaluate_fn=server_evaluate, output_dir=str(tmp_path), run_name="run")
    # Assert: summary.json is written, says how the run ended and that it did not finish; SIGTERM's handler is gone
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop-reason"].startswith(reason) and summary["finished"] is False
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_finished_run_says_so(tmp_path):
    FedBuff(buffer_size=2, fraction_evaluate=0.0).start(
        FakeGrid(4, client), initial_record(), num_rounds=1, clock="virtual", delay_model=FIXED, concurrency=2,
        evaluate_fn=server_evaluate, output_dir=str(tmp_path), run_name="run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop-reason"] == "num-rounds 1 reached" and summary["finished"] is True


class LoggedFedBuff(FedBuff):
    """A Flower user's override that looks at each step's replies and keeps FedBuff's own step."""

    def __init__(self, **keywords):
        super().__init__(**keywords)
        self.calls = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.calls.append((server_round, [r.metadata.src_node_id for r in replies],
                           [r.content["metrics"]["num-examples"] for r in replies]))
        return super().aggregate_train(server_round, replies)


class FortyTwo(FedBuff):
    """An override that makes the model itself: every float entry 42."""

    def aggregate_train(self, server_round, replies):
        state = list(replies)[0].content["arrays"].to_torch_state_dict()
        for tensor in state.values():
            if tensor.is_floating_point():
                tensor.fill_(42.0)
        return ArrayRecord(state), None


def _hooked_run(strategy, grid=None):
    grid = grid or FakeGrid(4, client)
    return strategy.start(grid, initial_record(), num_rounds=3, clock="virtual", delay_model=FIXED, concurrency=2,
                          evaluate_fn=server_evaluate, seed=1, update_norm_bound=0.0)


def test_an_aggregate_train_override_on_fedbuff_is_called_at_each_buffer_step():
    # Prepare: FedBuff B=2 with Flower's aggregate_train overridden, and the same FedBuff without the override
    logged = LoggedFedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.0)
    grid = FakeGrid(4, client)
    # Execute
    hooked = _hooked_run(logged, grid)
    plain = _hooked_run(FedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.0))
    # Assert: one call per buffer step with its 2 replies, from the nodes, in Flower's round numbering (4 updates
    # a round); super() gives FedBuff's own step, so the run is the plain one's
    assert [c[0] for c in logged.calls] == [1, 1, 2, 2, 3, 3]
    assert all(len(nodes) == 2 and set(nodes) <= set(grid.nodes) and examples == [10, 10]
               for _, nodes, examples in logged.calls)
    assert hooked.summary["server-versions"] == plain.summary["server-versions"] == 6
    for name, array in plain.arrays.to_torch_state_dict().items():
        assert torch.allclose(hooked.arrays.to_torch_state_dict()[name], array), name
    assert logged.aggregation_hook is None  # unbound after the run


def test_the_arrays_an_aggregate_train_override_returns_become_the_model():
    result = _hooked_run(FortyTwo(buffer_size=2, fraction_evaluate=0.0))
    assert torch.allclose(result.arrays.to_torch_state_dict()["fc.weight"], torch.full((2, 2), 42.0))


def test_an_aggregate_train_override_on_the_fedavg_preset_makes_each_round():
    class RoundLogged(FedAvg):
        rounds_seen = []

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            self.rounds_seen.append((server_round, len(replies)))
            return super().aggregate_train(server_round, replies)

    hooked = _hooked_run(RoundLogged(fraction_evaluate=0.0))
    plain = _hooked_run(FedAvg(fraction_evaluate=0.0))
    assert RoundLogged.rounds_seen == [(1, 2), (2, 2), (3, 2)]  # each round: its cohort of concurrency=2
    assert torch.allclose(hooked.arrays.to_torch_state_dict()["fc.weight"],
                          plain.arrays.to_torch_state_dict()["fc.weight"])


def test_a_run_config_that_names_the_engine_key_is_refused_before_any_message():
    grid = FakeGrid(4, client)
    with pytest.raises(asyncfl.ConfigError, match="run_config has a key 'engine'"):
        FedBuff().start(grid, initial_record(), num_rounds=1, run_config={"engine": "mine"})
    assert grid.pushed == []


def test_flower_hook_overrides_that_start_would_not_call_are_refused_before_any_message():
    class MixedAsync(asyncfl.FedAsync):
        def aggregate_train(self, server_round, replies):
            return None, None

    class EvaluatingFedBuff(FedBuff):
        def configure_evaluate(self, server_round, arrays, config, grid):
            return super().configure_evaluate(server_round, arrays, config, grid)

    for strategy, says in ((MixedAsync(), "MixedAsync overrides aggregate_train, which start\\(\\) cannot call.*"
                                          "Override on_arrival"),
                           (EvaluatingFedBuff(fraction_evaluate=0.0), "EvaluatingFedBuff overrides configure_evaluate, "
                                                                      "but fraction_evaluate=0")):
        grid = FakeGrid(4, client)
        with pytest.raises(asyncfl.ConfigError, match=says):
            _hooked_run(strategy, grid)
        assert grid.pushed == []


# ------------------------------------------- aggregate_train overrides: the engine's checks, replies as they hold
class NegativeVariance(FedAvg):
    """An override that keeps FedAvg's step but sets every BatchNorm running variance to -1."""

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        state = arrays.to_torch_state_dict()
        state["bn.running_var"].fill_(-1.0)
        return ArrayRecord(state), metrics


def test_an_override_model_goes_through_the_engines_variance_clamp_on_fedavg():
    # Prepare: FedAvg over 3 rounds of 2 jobs, its override returning running_var = -1 (2 entries) every round
    # Execute
    result = _hooked_run(NegativeVariance(fraction_evaluate=0.0))
    # Assert: a variance cannot be negative: every version's 2 entries were clamped to 0 (3 rounds x 2), and
    # FedAvg's own step is kept otherwise (+1 a round on a zero model)
    final = result.arrays.to_torch_state_dict()
    assert torch.equal(final["bn.running_var"], torch.zeros(2))
    assert result.summary["clamped-bn-variances"] == 6
    assert torch.allclose(final["fc.weight"], torch.full((2, 2), 3.0))


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_a_non_finite_model_from_an_override_stops_the_run_naming_the_override():
    class NaNFedAvg(FedAvg):
        def aggregate_train(self, server_round, replies):
            state = initial_record().to_torch_state_dict()
            state["fc.weight"][0, 0] = float("nan")
            return ArrayRecord(state), None

    class Overflowing(FedAvg):  # super()'s step itself overflows: 2 x 3e38 is beyond float32
        def aggregate_train(self, server_round, replies):
            for reply in replies:
                state = reply.content["arrays"].to_torch_state_dict()
                state["fc.weight"].fill_(3e38)
                reply.content["arrays"] = ArrayRecord(state)
            return super().aggregate_train(server_round, replies)

    with pytest.raises(FloatingPointError, match=r"NaNFedAvg\.aggregate_train returned a non-finite model"):
        _hooked_run(NaNFedAvg(fraction_evaluate=0.0))
    with pytest.raises(FloatingPointError, match=r"super\(\)\.aggregate_train in Overflowing\.aggregate_train made a "
                                                 r"non-finite model"):
        _hooked_run(Overflowing(server_lr=2.0, fraction_evaluate=0.0))


class DoublingFedBuff(FedBuff):
    """A Flower-style override: each reply's float arrays become ``trained + 1`` (the update "+1" becomes "+2"),
    the reply's record replaced, then FedBuff's own step over them."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        for reply in replies:
            state = reply.content["arrays"].to_torch_state_dict()
            reply.content["arrays"] = ArrayRecord(OrderedDict(
                (k, v + 1 if v.is_floating_point() else v) for k, v in state.items()))
        return super().aggregate_train(server_round, replies)


class DoublingFedAvg(FedAvg):
    """The same on FedAvg, changing the handed record in place (one array of it)."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        for reply in replies:
            record = reply.content["arrays"]
            record["fc.weight"] = Array(record["fc.weight"].numpy() + 1)
        return super().aggregate_train(server_round, replies)


def test_super_aggregate_train_aggregates_the_arrays_the_replies_hold_now():
    # Prepare: every client update is "+1" on every entry. FedBuff B=2, server_lr=1 (6 versions in 3 rounds);
    # FedAvg (3 rounds)
    # Execute
    fedbuff = _hooked_run(DoublingFedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.0))
    fedavg = _hooked_run(DoublingFedAvg(fraction_evaluate=0.0))
    # Assert: the changed replies count as "+2" updates against their jobs' models: FedBuff's 6 steps add
    # mean(2, 2) each (12), where "+1" makes 6; entries not changed keep "+1" steps (the int counter: 6)
    state = fedbuff.arrays.to_torch_state_dict()
    assert torch.allclose(state["fc.weight"], torch.full((2, 2), 12.0))
    assert torch.allclose(state["bn.running_mean"], torch.full((2,), 12.0))
    assert int(state["bn.num_batches_tracked"]) == 6
    # FedAvg: fc.weight was changed in place (+2 a round: 6), fc.bias was not (+1 a round: 3)
    state = fedavg.arrays.to_torch_state_dict()
    assert torch.allclose(state["fc.weight"], torch.full((2, 2), 6.0))
    assert torch.allclose(state["fc.bias"], torch.full((2,), 3.0))


def test_replaced_arrays_that_do_not_fit_the_model_are_refused_naming_the_override():
    class Reshaping(FedBuff):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            replies[1].content["arrays"]["fc.weight"] = Array(np.zeros((3, 2), np.float32))
            return super().aggregate_train(server_round, replies)

    with pytest.raises(ValueError, match=r"super\(\)\.aggregate_train in Reshaping\.aggregate_train: reply 1's "
                                         r"arrays, as changed, do not fit the model \(wrong-shape"):
        _hooked_run(Reshaping(buffer_size=2, server_lr=1.0, fraction_evaluate=0.0))


@pytest.mark.parametrize("returned, says", [
    (None, "it returned None"),
    (np.zeros(4, np.float32), "it returned a numpy.ndarray"),
    ((np.zeros(4, np.float32), None), "its first element is a numpy.ndarray"),
])
def test_an_override_returning_something_else_than_flowers_pair_is_refused_clearly(returned, says):
    class Returning(FedBuff):
        def aggregate_train(self, server_round, replies):
            return returned

    with pytest.raises(TypeError, match=r"Returning\.aggregate_train must return Flower's \(ArrayRecord \| None, "
                                        rf"MetricRecord \| None\).*{says}"):
        _hooked_run(Returning(buffer_size=2, server_lr=1.0, fraction_evaluate=0.0))


def test_an_aggregate_train_override_on_a_dp_wrapper_subclass_is_refused_before_any_message():
    from asyncfl import DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyServerSideFixedClipping

    for wrapper in (DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyClientSideFixedClipping):
        class Hooked(wrapper):
            def aggregate_train(self, server_round, replies):
                return super().aggregate_train(server_round, replies)

        strategy = Hooked(FedBuff(buffer_size=2, server_lr=1.0), noise_multiplier=0.1, clipping_norm=10.0)
        grid = FakeGrid(4, client)
        with pytest.raises(asyncfl.ConfigError, match=r"^Hooked overrides aggregate_train, which may combine the "
                                                      r"updates in any way: no noise scale"):
            _hooked_run(strategy, grid)
        assert grid.pushed == []
    # the wrappers' own hooks: the client-side one sets configure_train, neither aggregate_train
    plain = FedBuff(buffer_size=2, server_lr=1.0)
    assert DifferentialPrivacyClientSideFixedClipping(plain).overrides("configure_train")
    assert not DifferentialPrivacyServerSideFixedClipping(plain).overrides("configure_train")
    assert not DifferentialPrivacyClientSideFixedClipping(plain).overrides("aggregate_train")


def test_the_partial_last_round_has_its_server_side_evaluation_when_it_made_no_new_version():
    # Prepare: 4 nodes (4 updates a round), FedBuff B=2: 9 arrivals make versions at 2, 4, 6 and 8; the 9th opens
    # round 3 and makes no version, so round 3's model is round 2's (version 4)
    rounds_scored = []

    def evaluate(server_round, arrays):
        rounds_scored.append(server_round)
        return server_evaluate(server_round, arrays)

    # Execute
    result = FedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.5, min_evaluate_nodes=1).start(
        FakeGrid(4, client), initial_record(), num_rounds=0, max_arrivals=9, clock="virtual", delay_model=FIXED,
        concurrency=2, evaluate_fn=evaluate, seed=1, update_norm_bound=0.0)
    # Assert: round 3 is reported as train and federated results are, with round 2's score (the same model, not
    # scored twice)
    assert result.summary["rounds"] == 3 and result.summary["server-versions"] == 4
    assert sorted(result.train_metrics_clientapp) == sorted(result.evaluate_metrics_clientapp) == [1, 2, 3]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]
    assert dict(result.evaluate_metrics_serverapp[3]) == dict(result.evaluate_metrics_serverapp[2]) == \
        {"accuracy": 4.0, "loss": 1.0}
    assert rounds_scored == [0, 1, 2]
