"""Two small Flower apps for attack drills through the real engine: a toy learner and softmax regression on digits.

Both are ordinary ClientApps run by :class:`~asyncfl.simulation.inprocess.InProcessGrid`, whose drill poisons
the train replies of partition 0 (:mod:`asyncfl.client_app.drills`: ``noise``, ``replace``, ``forged-count``,
...); :class:`~asyncfl.simulation.delays.FasterClients` makes that node's jobs ``speed`` times shorter on the
virtual clock (and its first job immediate under ``replace``, so its reply is the run's first arrival).

* ``toy``: a node steps 20 % of the way from the model it got to TARGET; quality is ``1 - distance / start``.
* ``digits``: multinomial logistic regression on sklearn's 1,797 real 8x8 digits, IID over the nodes, 5 steps of
  full-batch gradient descent (lr 0.5) per job; quality is the accuracy on a held-out 20 %.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import asyncfl.server_app.engine as engine_module
from asyncfl.simulation.delays import FasterClients
from asyncfl.simulation.presets import delay_sampler
from asyncfl.simulation.inprocess import InProcessGrid

NODES = 8
TARGET = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
TOY_START = np.full(16, 0.1, np.float32)

toy_app = ClientApp()


@toy_app.train()
def toy_train(msg: Message, context: Context) -> Message:
    w = msg.content["arrays"]["w"].numpy()
    trained = w + np.float32(0.2) * (TARGET - w)
    metrics = MetricRecord({"num-examples": 100, "train_loss": float(np.linalg.norm(TARGET - w))})
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(trained)}), "metrics": metrics}), reply_to=msg)


@lru_cache(maxsize=1)
def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn's digits scaled to [0, 1], shuffled once; 80 % train (split over the nodes), 20 % test."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    order = np.random.default_rng(0).permutation(len(bunch.target))
    x, y = (bunch.data[order] / 16.0).astype(np.float32), bunch.target[order]
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def softmax_gradient(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return x.T @ p / len(y), p.mean(axis=0)


digits_app = ClientApp()


@digits_app.train()
def digits_train(msg: Message, context: Context) -> Message:
    x, y, _, _ = digits_split()
    part, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x, y = x[part::parts], y[part::parts]
    w, b = msg.content["arrays"]["w"].numpy().copy(), msg.content["arrays"]["b"].numpy().copy()
    for _ in range(5):
        gw, gb = softmax_gradient(w, b, x, y)
        w -= np.float32(0.5) * gw.astype(np.float32)
        b -= np.float32(0.5) * gb.astype(np.float32)
    metrics = MetricRecord({"num-examples": len(y), "train_loss": 0.0})
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(w), "b": Array(b)}), "metrics": metrics}),
                   reply_to=msg)


def digits_accuracy(arrays: ArrayRecord) -> float:
    _, _, x, y = digits_split()
    return float(((x @ arrays["w"].numpy() + arrays["b"].numpy()).argmax(axis=1) == y).mean())


def toy_trusted_step(version: int, arrays: ArrayRecord) -> ArrayRecord:
    """The toy learner's program on the server (``trusted_train_fn``): its trusted data is the target itself."""
    w = arrays["w"].numpy()
    return ArrayRecord({"w": Array((w + np.float32(0.2) * (TARGET - w)).astype(np.float32))})


TRUSTED_ROWS = 120


def digits_trusted_steps(version: int, arrays: ArrayRecord) -> ArrayRecord:
    """The digits program on the server (``trusted_train_fn``): 5 gradient steps on the first TRUSTED_ROWS training
    rows (the server's own clean copy; the clients' partitions hold them too, the test rows are never used)."""
    x, y, _, _ = digits_split()
    x, y = x[:TRUSTED_ROWS], y[:TRUSTED_ROWS]
    w, b = arrays["w"].numpy().copy(), arrays["b"].numpy().copy()
    for _ in range(5):
        gw, gb = softmax_gradient(w, b, x, y)
        w -= np.float32(0.5) * gw.astype(np.float32)
        b -= np.float32(0.5) * gb.astype(np.float32)
    return ArrayRecord({"w": Array(w), "b": Array(b)})


TRUSTED = {"toy": toy_trusted_step, "digits": digits_trusted_steps}

APPS = {
    "toy": (toy_app, lambda: ArrayRecord({"w": Array(TOY_START.copy())}),
            lambda arrays: 1.0 - float(np.linalg.norm(arrays["w"].numpy() - TARGET)
                                       / np.linalg.norm(TOY_START - TARGET))),
    "digits": (digits_app, lambda: ArrayRecord({"w": Array(np.random.default_rng(1).normal(0, 0.01, (64, 10))
                                                           .astype(np.float32)),
                                                "b": Array(np.zeros(10, np.float32))}),
               digits_accuracy),
}


def drill(monkeypatch, app: str, strategy, attack: str = "", speed: float = 1.0, seed: int = 3,
          arrivals: int = 240, **options) -> tuple[float, dict]:
    """Run ``strategy`` on ``app`` with partition 0 making ``attack`` (``""``: none) at ``speed``; the final
    model's quality (module docstring) and the run's summary."""
    client_app, initial, quality = APPS[app]
    first = frozenset({0}) if attack == "replace" else frozenset()
    monkeypatch.setattr(engine_module, "delay_sampler",
                        lambda model, s: FasterClients(delay_sampler(model, s), {0: speed}, first))
    grid = InProcessGrid(client_app, NODES, {}, drill=(attack, 1 if attack else 0))
    options = {"clock": "virtual", "delay_model": "fedrevive-default", "seed": seed, "max_arrivals": arrivals,
               "concurrency": 4, **options}
    result = strategy.start(grid, initial(), num_rounds=0, train_config=ConfigRecord({}), **options)
    return quality(result.arrays), result.summary
