"""Every reply is data, never control flow: mutated train replies through the real engine never end a run.

Two nodes of eight answer a share of its jobs with a reply mutated in one field (its metrics' types and
values, its arrays' dtype, names, shape, order, count, bytes and values, its records); the run goes on to
its stop, every mutated reply is an arrival or a rejection counted under the reason expected of it, and the
model stays finite. Over FedBuff, FedAsync and FedAvg this drives well over 1,000 mutated replies.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from asyncfl import FedAsync, FedAvg, FedBuff
from tests.fake_grid import FakeGrid

NODES = 8
SHAPE = (2, 3)


def _initial() -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(SHAPE), "steps": np.zeros(1, np.int64)}


def _raw(dtype: str, shape, data: bytes, stype: str = "numpy.ndarray") -> Array:
    return Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data)


def _arrays(w, steps, **extra) -> ArrayRecord:
    return ArrayRecord({"w": w if isinstance(w, Array) else Array(w), **extra,
                        "steps": steps if isinstance(steps, Array) else Array(steps)})


def _metrics(**values) -> MetricRecord:
    return MetricRecord({"num-examples": 10, "train-loss": 0.5, **values})


def metrics_of(**values):
    """A reply with the honest arrays and these metric values."""
    return lambda w, s: RecordDict({"arrays": _arrays(w, s), "metrics": _metrics(**values)})


def arrays_of(make):
    """A reply with honest metrics and the arrays ``make(w, steps)`` builds."""
    return lambda w, s: RecordDict({"arrays": make(w, s), "metrics": _metrics()})


def content_of(make):
    """A reply whose whole content ``make(w, steps)`` builds (an Error: an error reply)."""
    return make


NAN, INF, COUNT, LOSS = float("nan"), float("inf"), "num-examples", "train-loss"
ZERO24, LYING_HEADER = b"\x00" * 24, b"\x93NUMPY\x01\x00\xff\x00" + b"x" * 8

#: name -> (how the reply is built from the honest weights and counter, the rejection reason or None = accepted)
MUTATIONS = {
    # metrics: types and values
    "num-examples-nan": (metrics_of(**{COUNT: NAN}), "bad-num-examples"),
    "num-examples-inf": (metrics_of(**{COUNT: INF}), "bad-num-examples"),
    "num-examples-negative": (metrics_of(**{COUNT: -69}), "bad-num-examples"),
    "num-examples-fraction": (metrics_of(**{COUNT: 2.5}), "bad-num-examples"),
    "num-examples-list": (metrics_of(**{COUNT: [1, 2]}), "bad-num-examples"),
    "num-examples-huge": (metrics_of(**{COUNT: 2**70}), "bad-num-examples"),
    "num-examples-billion": (metrics_of(**{COUNT: 10**9}), None),
    "num-examples-float-whole": (metrics_of(**{COUNT: 12.0}), None),
    "num-examples-zero": (metrics_of(**{COUNT: 0}), None),
    "train-loss-list": (metrics_of(**{LOSS: [1.0, 2.0]}), None),
    "train-loss-inf": (metrics_of(**{LOSS: INF}), None),
    "train-loss-huge-int": (metrics_of(**{LOSS: 2**1100}), None),
    "odd-metric-lists": (metrics_of(acc=[NAN] * 3, x=-1e308), None),
    "num-examples-missing": (content_of(lambda w, s: RecordDict({"arrays": _arrays(w, s),
                                                                 "metrics": MetricRecord({LOSS: 0.5})})), None),
    "metrics-absent": (content_of(lambda w, s: RecordDict({"arrays": _arrays(w, s)})), None),
    "metrics-as-config": (content_of(lambda w, s: RecordDict({"arrays": _arrays(w, s),
                                                              "metrics": ConfigRecord({COUNT: "ten"})})), None),
    # records
    "error-reply": (content_of(lambda w, s: Error(code=0, reason="Traceback\nRuntimeError: its own")), "error-reply"),
    "no-arrays": (content_of(lambda w, s: RecordDict({"metrics": _metrics()})), "no-arrays"),
    "arrays-elsewhere": (content_of(lambda w, s: RecordDict({"model": _arrays(w, s), "metrics": _metrics()})),
                         "no-arrays"),
    "empty": (content_of(lambda w, s: RecordDict({})), "no-arrays"),
    # arrays: count, names, order
    "extra-array": (arrays_of(lambda w, s: _arrays(w, s, extra=Array(np.zeros(2, np.float32)))), "wrong-layout"),
    "missing-array": (arrays_of(lambda w, s: ArrayRecord({"w": Array(w)})), "wrong-layout"),
    "renamed": (arrays_of(lambda w, s: ArrayRecord({"a": Array(w), "b": Array(s)})), "wrong-names"),
    "reordered": (arrays_of(lambda w, s: ArrayRecord({"steps": Array(s), "w": Array(w)})), None),
    # shapes
    "transposed": (arrays_of(lambda w, s: _arrays(np.ascontiguousarray(w.T), s)), "wrong-shape"),
    "scalar": (arrays_of(lambda w, s: _arrays(np.array(1.0, np.float32), s)), "wrong-shape"),
    "flattened": (arrays_of(lambda w, s: _arrays(w.reshape(-1), s)), "wrong-shape"),
    # dtypes
    "float64": (arrays_of(lambda w, s: _arrays(w.astype(np.float64), s)), None),
    "float16": (arrays_of(lambda w, s: _arrays(w.astype(np.float16), s)), None),
    "int-weights": (arrays_of(lambda w, s: _arrays(w.astype(np.int32), s)), "wrong-dtype"),
    "bool-weights": (arrays_of(lambda w, s: _arrays(w > 0, s)), "wrong-dtype"),
    "complex-weights": (arrays_of(lambda w, s: _arrays(w.astype(np.complex64), s)), "wrong-dtype"),
    "float-counter-huge": (arrays_of(lambda w, s: _arrays(w, np.full(1, 3.4e38, np.float32))), "wrong-dtype"),
    "int32-counter": (arrays_of(lambda w, s: _arrays(w, s.astype(np.int32))), None),
    "counter-beyond-float32": (arrays_of(lambda w, s: _arrays(w, np.full(1, 2**40, np.int64))), "out-of-range"),
    "counter-uint64-max": (arrays_of(lambda w, s: _arrays(w, np.full(1, 2**64 - 1, np.uint64))), "out-of-range"),
    "counter-big-but-exact": (arrays_of(lambda w, s: _arrays(w, np.full(1, 2**24, np.int64))), None),
    # values
    "nan": (arrays_of(lambda w, s: _arrays(np.full(SHAPE, np.nan, np.float32), s)), "non-finite"),
    "inf": (arrays_of(lambda w, s: _arrays(np.full(SHAPE, -np.inf, np.float32), s)), "non-finite"),
    "beyond-float32": (arrays_of(lambda w, s: _arrays(np.full(SHAPE, 1e300), s)), "non-finite"),
    "float32-max": (arrays_of(lambda w, s: _arrays(np.full(SHAPE, 3.4e38, np.float32), s)), None),
    "scaled": (arrays_of(lambda w, s: _arrays(w * np.float32(-1e6), s)), None),
    # bytes
    "garbage-bytes": (arrays_of(lambda w, s: _arrays(_raw("float32", SHAPE, b"garbage"), s)), "undecodable"),
    "npy-header-lies": (arrays_of(lambda w, s: _arrays(_raw("float32", SHAPE, LYING_HEADER), s)),
                        "undecodable"),
    "unknown-dtype": (arrays_of(lambda w, s: _arrays(_raw("no-such-dtype", SHAPE, ZERO24), s)), "undecodable"),
    "unknown-stype": (arrays_of(lambda w, s: _arrays(_raw("float32", SHAPE, ZERO24, stype="pickle"), s)),
                      "undecodable"),
    "padded-bytes": (arrays_of(lambda w, s: _arrays(_padded(Array(w), 1000), s)), "undecodable"),
    "long-npy-header": (arrays_of(lambda w, s: _arrays(_long_header(w), s)), "undecodable"),
    # metrics beyond a report's size: cut to it (the count and the loss kept), the update taken
    "metric-list-20k": (metrics_of(acc=[0.5] * 20_000), None),
    "metric-names-2000": (metrics_of(**{f"m{i}": 0.5 for i in range(2000)}), None),
    "metric-name-long": (metrics_of(**{"x" * 300: 0.5}), None),
}


def _padded(array: Array, extra: int) -> Array:
    """``array`` with ``extra`` bytes after its entries (np.load would ignore them; the journal would keep them)."""
    return _raw(array.dtype, array.shape, array.data + b"\x00" * extra)


def _long_header(w: np.ndarray) -> Array:
    """``w`` as a .npy (version 2) whose header is padded to 20,000 bytes: every entry as it is, the header huge."""
    honest = Array(w).data
    length = int.from_bytes(honest[8:10], "little")
    header = honest[10 : 10 + length].rstrip(b"\n") + b" " * (20_000 - length) + b"\n"
    return _raw("float32", SHAPE, b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header
                + honest[10 + length :])


def _fuzzing_client(seen: Counter, share: float = 0.5):
    """Honest nodes pull the model toward a target; nodes 101-102 mutate ``share`` of their replies, by job seed."""
    names = sorted(MUTATIONS)
    target = np.linspace(0.5, -0.5, 6, dtype=np.float32).reshape(SHAPE)

    def handle(node: int, message: Message) -> Message:
        record = message.content.array_records["arrays"]
        w = record["w"].numpy()
        honest_w, steps = w + np.float32(0.2) * (target - w), record["steps"].numpy() + 1
        seed = int(message.content.config_records["config"]["job-seed"])
        rng = np.random.default_rng(seed % 2**32)
        if node in (101, 102) and rng.random() < share:
            name = names[int(rng.integers(len(names)))]
            seen[(message.metadata.message_id, name)] += 1
            return Message(MUTATIONS[name][0](honest_w, steps), reply_to=message)
        return Message(RecordDict({"arrays": _arrays(honest_w, steps), "metrics": _metrics()}), reply_to=message)

    return handle


@pytest.mark.parametrize("make", [lambda: FedBuff(fraction_evaluate=0.0), lambda: FedAsync(fraction_evaluate=0.0),
                                  lambda: FedAvg(fraction_evaluate=0.0)], ids=["fedbuff", "fedasync", "fedavg"])
def test_mutated_replies_never_end_a_run_and_each_is_counted_by_its_reason(make):
    seen: Counter = Counter()
    grid = FakeGrid(NODES, _fuzzing_client(seen, share=0.95))
    initial = _initial()
    result = make().start(grid, ArrayRecord({k: Array(v) for k, v in initial.items()}), num_rounds=0,
                          train_config=ConfigRecord({}), clock="virtual", delay_model="fedrevive-default", seed=5,
                          max_arrivals=1500, concurrency=8)
    summary = result.summary
    rejected = Counter(summary["rejected-by-reason"])
    expected = Counter(MUTATIONS[name][1] for (_, name) in seen if MUTATIONS[name][1] is not None)
    pushed_train = sum(m.metadata.message_type == "train" for m in grid.pushed)
    abandoned = pushed_train - summary["arrivals"] - sum(rejected.values())

    assert len(seen) >= 350 and summary["arrivals"] == 1500  # the run reached its stop (3 x 350: over 1,000 in all)
    assert 0 <= abandoned <= 8  # the jobs still in flight at the stop; every other reply counted
    assert set(rejected) <= set(expected)
    for reason, count in expected.items():  # each mutated reply's rejection under its reason (bar the abandoned)
        assert count - abandoned <= rejected[reason] <= count, reason
    assert all(np.isfinite(result.arrays[k].numpy()).all() for k in initial)
    assert result.arrays["steps"].numpy().dtype == np.int64 and abs(int(result.arrays["steps"].numpy()[0])) < 2**24


def _evaluating(metrics_of):
    """A node that trains honestly and answers an evaluation with the metrics ``metrics_of(node)``."""
    def client(node: int, message: Message) -> Message:
        if message.metadata.message_type == "evaluate":
            return Message(RecordDict({"metrics": MetricRecord(metrics_of(node))}), reply_to=message)
        record = message.content.array_records["arrays"]
        return Message(RecordDict({"arrays": _arrays(record["w"].numpy(), record["steps"].numpy() + 1),
                                   "metrics": _metrics()}), reply_to=message)
    return client


def _federated_evaluation_run(client):
    initial = _initial()
    return FedBuff(fraction_evaluate=1.0).start(
        FakeGrid(NODES, client), ArrayRecord({k: Array(v) for k, v in initial.items()}), num_rounds=2,
        train_config=ConfigRecord({}), clock="virtual", delay_model="fedrevive-default", seed=5)


def test_one_nodes_evaluation_reply_cannot_set_the_federated_metric():
    """A node claiming 2**62 evaluation examples (or NaN) with accuracy 0.999, where honest nodes report 0.5."""
    result = _federated_evaluation_run(_evaluating(lambda node: {
        "num-examples": {101: 2**62, 102: float("nan")}.get(node, 10),
        "accuracy": 0.999 if node in (101, 102) else 0.5}))
    accuracies = [m["accuracy"] for m in result.evaluate_metrics_clientapp.values()]
    assert accuracies and all(a < 0.6 for a in accuracies)  # 101 weighs 3 x the median count (30 of 90 + 30)
    assert result.summary["evaluate-rejected-by-reason"]["bad-num-examples"] >= len(accuracies)  # 102: each time


@pytest.mark.parametrize("bad", [NAN, INF, [1.0, 2.0], 2**1100], ids=["nan", "inf", "list", "huge-int"])
def test_one_nodes_malformed_metric_value_leaves_the_other_nodes_round_metrics(bad):
    """Node 101's train-loss is ``bad`` and its accuracy a list of another length; the others report 0.5, [0.5, 0.5]."""
    def client(node: int, message: Message) -> Message:
        record = message.content.array_records["arrays"]
        values = {LOSS: bad, "accuracy": [1.0]} if node == 101 else {"accuracy": [0.5, 0.5]}
        return Message(RecordDict({"arrays": _arrays(record["w"].numpy(), record["steps"].numpy() + 1),
                                   "metrics": _metrics(**values)}), reply_to=message)

    initial = _initial()
    result = FedAvg(fraction_evaluate=0.0).start(
        FakeGrid(NODES, client), ArrayRecord({k: Array(v) for k, v in initial.items()}), num_rounds=3,
        train_config=ConfigRecord({}), clock="virtual", delay_model="fedrevive-default", seed=5)
    rounds = result.train_metrics_clientapp
    assert sorted(rounds) == [1, 2, 3]  # no round's metrics lost
    assert all(m[LOSS] == pytest.approx(0.5) and m["accuracy"] == pytest.approx([0.5, 0.5]) for m in rounds.values())


def test_a_reply_without_its_count_leaves_the_other_nodes_evaluation_metrics():
    result = _federated_evaluation_run(_evaluating(
        lambda node: {"accuracy": 0.9} if node == 101 else {"num-examples": 10, "accuracy": 0.5}))
    assert result.evaluate_metrics_clientapp and all(m["accuracy"] == pytest.approx(0.5)
                                                     for m in result.evaluate_metrics_clientapp.values())


def test_metric_names_fewer_than_half_of_the_replies_send_are_left_out_of_the_mean():
    """Node 101 adds 50 metrics of its own to every reply: kept, they would be in every round's metrics (and
    checkpoint) for the rest of the run, each averaged as if the other nodes had sent 0."""
    def client(node: int, message: Message) -> Message:
        record = message.content.array_records["arrays"]
        own = {f"own-{i}": 1.0 for i in range(50)} if node == 101 else {}
        return Message(RecordDict({"arrays": _arrays(record["w"].numpy(), record["steps"].numpy() + 1),
                                   "metrics": _metrics(accuracy=0.5, **own)}), reply_to=message)

    initial = _initial()
    result = FedAvg(fraction_evaluate=0.0).start(
        FakeGrid(NODES, client), ArrayRecord({k: Array(v) for k, v in initial.items()}), num_rounds=3,
        train_config=ConfigRecord({}), clock="virtual", delay_model="fedrevive-default", seed=5)
    rounds = result.train_metrics_clientapp
    assert sorted(rounds) == [1, 2, 3] and all(set(m) == {LOSS, "accuracy"} for m in rounds.values())
    assert all(m["accuracy"] == pytest.approx(0.5) for m in rounds.values())


def test_a_mean_of_finite_values_beyond_floats_range_is_left_out_not_reported_as_inf():
    from asyncfl.server_app.client_metrics import aggregate_replies

    largest = 1.7976931348623157e308  # weights 1, 2, 2: the weighted mean, summed term by term, rounds to inf
    replies = [RecordDict({"metrics": MetricRecord({COUNT: w, "accuracy": largest, "loss": 0.5})}) for w in (1, 2, 2)]
    assert dict(aggregate_replies(replies, COUNT, None, "evaluate")) == {"loss": pytest.approx(0.5)}
