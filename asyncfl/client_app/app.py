"""The asyncfl ClientApp: ``train``, ``evaluate`` and an identity ``query``.

Message convention (Flower's): a train request carries ``"arrays"`` and
``"config"``; the reply carries ``"arrays"`` (trained weights) and
``"metrics"`` with ``"num-examples"`` and ``"train-loss"``. The app also works
under Flower's own ``flwr.serverapp.strategy.FedAvg``: config keys it does not
send fall back to the run-config.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from asyncfl import protocol
from asyncfl.client_app.drills import apply_fault, fault_of, reported_examples
from asyncfl.client_app.device_speed import device_speed
from asyncfl.client_app.extras import identity_reply, worker_record
from asyncfl.client_app.extras import node_ids as _node_ids
from asyncfl.client_app.gossip import gossip_event, peer_split
from asyncfl.client_app.task import node_data, node_model
from asyncfl.client_app.training import evaluate as evaluate_model
from asyncfl.client_app.training import pick_device, train_local
from asyncfl.config import parse_run_config
from asyncfl.data.drift import drifted

# device_speed: a train job lasts the emulate-seconds its request carries (emulate-delay-scale), or what the
# node config's device-slowdown / device-profile says; it adds that wait to the reply's train-seconds
app = ClientApp(mods=[device_speed])


def _threads(context: Context) -> None:
    threads = int(context.run_config.get("client-threads", 1))
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _load(model: torch.nn.Module, record: ArrayRecord) -> None:
    state = record.to_torch_state_dict()
    if list(state) != list(model.state_dict()):  # plain list of arrays: match by position
        state = dict(zip(model.state_dict(), state.values()))
    model.load_state_dict(state)


def _prepare(msg: Message, context: Context):
    """Parse the run-config, fetch this node's data and load the received model."""
    _threads(context)
    cfg = parse_run_config(context.run_config, strategy_settings=False)
    partition_id, num_partitions = _node_ids(context)
    data = node_data(cfg.data, partition_id, num_partitions, cfg.options.seed)
    model = node_model(cfg.data, data, cfg.options.seed)
    _load(model, msg.content["arrays"])
    return cfg, data, model


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on this node's partition."""
    started = time.monotonic()
    cfg, data, model = _prepare(msg, context)
    request = msg.content.config_records.get("config", ConfigRecord())
    knobs = {**cfg.train.to_message_config(), **{k: v for k, v in request.items()}}
    x_train = data.x_train
    if cfg.drift.active:  # variant data: the share of this node's samples replaced by the job's start
        fraction = cfg.drift.fraction(float(knobs.get(protocol.DISPATCH_TIME, 0.0)))
        x_train = drifted(x_train, data.y_train, fraction, cfg.drift.source,
                          (cfg.options.seed, 0, _node_ids(context)[0]))
    loss = train_local(
        model,
        x_train,
        data.y_train,
        steps=int(knobs["local-steps"]),
        epochs=int(knobs["local-epochs"]),
        batch_size=int(knobs["batch-size"]),
        optimizer=str(knobs["optimizer"]),
        lr=float(knobs["lr"]),
        momentum=float(knobs["momentum"]),
        weight_decay=float(knobs["weight-decay"]),
        seed=int(knobs.get(protocol.JOB_SEED, knobs.get(protocol.SERVER_ROUND, 0))),
        device=pick_device(),
    )
    model.cpu()
    # emulated heterogeneity (wall clock) is the device_speed mod's: it pads the job after this handler and adds
    # the padding to train-seconds (the emulated training; the rest of a round trip is the wait to start)
    train_seconds = time.monotonic() - started
    fault = fault_of(context.node_config, context.run_config, _node_ids(context)[0])
    arrays = apply_fault(fault, ArrayRecord(model.state_dict()), msg.content["arrays"],
                         int(knobs.get(protocol.JOB_SEED, 0)))
    content = RecordDict(
        {
            "arrays": arrays,
            "metrics": MetricRecord({protocol.NUM_EXAMPLES: reported_examples(fault, len(data.y_train)),
                                     protocol.TRAIN_LOSS: loss, protocol.TRAIN_SECONDS: train_seconds}),
            **worker_record(),
        }
    )
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy and loss of the received model on this node's test slice."""
    _, data, model = _prepare(msg, context)
    loss, accuracy = evaluate_model(model, data.x_test, data.y_test, device=pick_device())
    metrics = MetricRecord({"num-examples": len(data.y_test), "eval-loss": loss, "eval-acc": accuracy})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


@app.train("gossip")
def gossip(msg: Message, context: Context) -> Message:
    """One decentralized compute event (PushCen-ADFL or a gossip baseline) for the gossip relay."""
    _threads(context)
    cfg = parse_run_config(context.run_config, strategy_settings=False)
    partition_id, num_partitions = _node_ids(context)
    data = gossip_data(cfg, partition_id, num_partitions)
    return gossip_event(msg, context, cfg, data, node_model(cfg.data, data, cfg.options.seed))


def gossip_data(cfg, partition_id: int, num_partitions: int):
    """A peer's data: its partition as ``max-samples-per-client`` keeps it, or, with ``gossip.local-test-size``,
    the whole partition (the peer holds its test examples out before the cap draws its training ones)."""
    data_config = replace(cfg.data, max_samples_per_client=0) if cfg.gossip.local_test_size else cfg.data
    return node_data(data_config, partition_id, num_partitions, cfg.options.seed)


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """Report this node's ``partition-id`` (so the server can order clients deterministically),
    its training-set size (for delay models tied to data size) and, only when asked, its label
    counts (for the ``intertwined`` delay model, which delays the biggest holders of one class)."""
    partition_id, num_partitions = _node_ids(context)
    cfg = parse_run_config(context.run_config, strategy_settings=False)
    # a peer that holds its test examples out of its whole partition reports those it trains on (with the fraction's
    # split a peer reports the examples it keeps, its test fifth included, as the runs stored before had it)
    if cfg.gossip is not None and cfg.gossip.local_test_size:
        data = gossip_data(cfg, partition_id, num_partitions)
        labels = peer_split(cfg, data, partition_id)[1]
    else:
        data = node_data(cfg.data, partition_id, num_partitions, cfg.options.seed)
        labels = data.y_train
    return identity_reply(msg, context, len(labels), lambda: np.bincount(labels, minlength=data.num_classes))
