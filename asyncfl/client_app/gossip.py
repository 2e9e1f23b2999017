"""A peer's side of the gossip relay: one compute event per ``train.gossip`` message.

The peer's model and centroid dictionary live in ``context.state`` between
messages (in simulation and on real SuperNodes); its push-sum mass is the
relay's, told in each request. What arrived is checked message by message
against this peer's model before it is merged
(:func:`~asyncfl.decentralized.method.read_message`), and an event whose
model still leaves the bounds runs again without the messages of the sender
farthest from this model, then on the peer's own data, then from the model it
last trained (a method that keeps one) and from the initial model; a method that
trains before it merges (SWIFT) goes straight to the restarts (:func:`fallbacks`).
The event itself is the configured method's (:class:`~asyncfl.decentralized.method.GossipMethod`,
each named in its own module of :mod:`asyncfl.decentralized`: ``pushcen``, ``async-dfedavg``,
``divshare``, ``swift``, ``independent``); this module reads the request, keeps the peer's
state and writes the reply.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from asyncfl import protocol
from asyncfl.client_app.extras import node_ids
from asyncfl.client_app.training import evaluate
from asyncfl.decentralized.codec import Layout
from asyncfl.decentralized.method import (GossipEvent, from_record, gossip_method, magnitude_limit, read_message,
                                         to_record)
from asyncfl.decentralized.peer import PeerState, Received

STATE_MODEL, STATE_DICTIONARY, STATE_META = "gossip-model", "gossip-dictionary", "gossip-meta"

log = logging.getLogger("asyncfl.gossip")


def local_split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """A seeded split of the peer's own partition into local train and local test (the PushCen protocol)."""
    order = np.random.default_rng([seed, 13]).permutation(len(y))
    test = max(1, int(round(fraction * len(y)))) if len(y) > 1 else 0
    return x[order[test:]], y[order[test:]], x[order[:test]], y[order[:test]]


def held_out_split(x: np.ndarray, y: np.ndarray, test_size: int, max_train: int, seed: int,
                   partition_id: int) -> tuple[np.ndarray, ...]:
    """The peer's whole partition split into local test examples, ``test_size`` of them but at most half of the
    partition (a small peer keeps as much to train on as it is tested on), and training examples, of which at most
    ``max_train`` are kept (0: all): ``gossip.local-test-size`` with ``max-samples-per-client``. Seeded per peer."""
    rng = np.random.default_rng([seed, 13, partition_id])
    order = rng.permutation(len(y))
    held = min(test_size, len(y) // 2)
    test, rest = order[:held], order[held:]
    if 0 < max_train < len(rest):
        rest = np.sort(rng.choice(rest, size=max_train, replace=False))
    return x[rest], y[rest], x[test], y[test]


def peer_split(cfg, data, partition_id: int) -> tuple[np.ndarray, ...]:
    """``(x_train, y_train, x_test, y_test)`` of a peer: its local test split held out of its whole partition
    (``gossip.local-test-size``; ``data`` is then that partition, :func:`asyncfl.client_app.app.gossip_data`), or
    ``local-test-fraction`` of the examples it keeps."""
    if cfg.gossip.local_test_size:
        return held_out_split(data.x_train, data.y_train, cfg.gossip.local_test_size, cfg.data.max_samples_per_client,
                              cfg.options.seed, partition_id)
    return local_split(data.x_train, data.y_train, cfg.gossip.local_test_fraction, cfg.options.seed)


def load_peer(context: Context, model: torch.nn.Module) -> PeerState:
    """The peer's state from ``context.state``, or a fresh one from ``model`` (mass 1, no dictionary)."""
    if STATE_MODEL not in context.state.array_records:
        return PeerState({n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()})
    meta = context.state.config_records[STATE_META]
    dictionary = from_record(context.state.array_records[STATE_DICTIONARY]) if STATE_DICTIONARY in context.state.array_records else {}
    return PeerState(from_record(context.state.array_records[STATE_MODEL]), float(meta["mass"]), dictionary)


def push_check(cfg, model: torch.nn.Module):
    """The check every receiver makes of a message (:func:`~asyncfl.decentralized.method.read_message` against
    ``model``, the seeded initial model every peer builds), as a function of one push record returning the reason
    to refuse it or None: the relay runs it on each push before forwarding it, so a bad push is refused once,
    counted against its sender, and never held or sent on."""
    layout = Layout.of(model)
    shared = layout.shared()
    limit = magnitude_limit({n: t.detach().cpu().numpy() for n, t in model.state_dict().items()}, shared)
    method = gossip_method(cfg.strategy)
    return lambda record: read_message(record, method, layout, shared, cfg.gossip, limit)[1]


def _sane(peer: PeerState, shared: list[str], limit: float) -> bool:
    """Whether every float entry of the peer's model and centroid dictionary is finite, and the shared ones and the
    dictionary within ``limit`` in magnitude (:func:`asyncfl.decentralized.method.magnitude_limit`)."""
    bounded = [peer.state[n] for n in shared] + list(peer.dictionary.values())
    return all(np.isfinite(v).all() for v in (*peer.state.values(), *peer.dictionary.values()) if v.dtype.kind == "f") \
        and all(float(np.abs(v).max(initial=0.0)) <= limit for v in bounded if v.dtype.kind == "f")


def save_peer(context: Context, peer: PeerState) -> None:
    context.state[STATE_MODEL] = to_record(peer.state)
    context.state[STATE_META] = ConfigRecord({"mass": float(peer.mass)})
    if peer.dictionary:
        context.state[STATE_DICTIONARY] = to_record(peer.dictionary)


def _steps(knobs: dict, num_examples: int) -> int:
    if int(knobs["local-epochs"]) > 0:
        return int(knobs["local-epochs"]) * max(1, math.ceil(num_examples / int(knobs["batch-size"])))
    return int(knobs["local-steps"])


def fallbacks(received: list[Received], farthest, trains_before_merging: bool = False):
    """The events a peer tries in turn until its model stays finite and within the magnitude limit, as
    ``(what it tries, for the log; the model it starts from: "stored", "trained" or "initial"; the messages
    merged)``: every message that passed its check; without the messages of the sender whose message is
    ``farthest(received)`` from this peer's model (called only once the first event failed, and only with two
    senders or more), so that one hostile sender, when it is the farthest, does not cost the event's honest
    messages; none; then, taking the stored model for what cannot be trained (SWIFT keeps its merged model
    untrained), none from the model the peer last trained (skipped where its method keeps none) and from the
    seeded initial model. A method that trains before it merges (``trains_before_merging``) skips the retries with
    fewer messages. At most four passes more."""
    yield (f"merging {len(received)} messages" if received else "training its stored model"), "stored", received
    if not trains_before_merging:
        senders = {r.sender for r in received}
        if len(received) > 1 and (len(senders) > 1 or -1 in senders):
            suspect = farthest(received)
            rest = [r for r in received if r is not suspect and (r.sender < 0 or r.sender != suspect.sender)]
            yield f"without peer {suspect.sender}'s messages, the farthest from this model", "stored", rest
        if received:
            yield "without any message", "stored", []
    yield "restarting from the model it last trained", "trained", []
    yield "restarting from the initial model", "initial", []


def gossip_event(msg: Message, context: Context, cfg, data, model: torch.nn.Module) -> Message:
    """Run one compute event of the configured method and reply with the outgoing message."""
    request = msg.content.config_records["config"]
    knobs = {**cfg.train.to_message_config(), **dict(request)}
    x_train, y_train, x_test, y_test = peer_split(cfg, data, node_ids(context)[0])
    if len(y_train) == 0:
        raise ValueError("this peer's partition is empty; nothing to train on")
    layout = Layout.of(model)
    shared = layout.shared()
    initial = {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()}  # seeded, as every peer's
    limit = magnitude_limit(initial, shared)
    start = load_peer(context, model)
    start.mass = float(request["mass"])  # the relay keeps the push-sum ledger (asyncfl.server_app.relay)
    method = gossip_method(str(request["gossip-method"]))
    received, refused_mass = [], 0.0
    for i, (mass, sender) in enumerate(zip(list(request["masses"])[: int(request["received"])], request["senders"])):
        arrays, reason = read_message(msg.content.array_records.get(f"msg-{i}"), method, layout, shared, cfg.gossip,
                                      limit)
        if arrays is None:  # a neighbour's message this model cannot take: its content dropped, its mass kept
            log.warning("refused the message from peer %d: %s", int(sender), reason)
            refused_mass += float(mass)
        else:
            received.append(Received(arrays, float(mass), int(sender)))
    steps = _steps(knobs, len(y_train))
    # every method trains with the run's optimizer (before, gossip peers always took SGD with lr and momentum)
    common = dict(steps=steps, batch_size=int(knobs["batch-size"]), lr=float(knobs["lr"]),
                  momentum=float(knobs["momentum"]), seed=int(knobs[protocol.JOB_SEED]),
                  optimizer=str(knobs["optimizer"]), weight_decay=float(knobs["weight-decay"]))
    stored = dict(context.state.items())

    def farthest(messages: list[Received]) -> Received:
        return max(messages, key=lambda r: method.distance(r.message, start.state, layout, shared))

    for tried, start_from, merged in fallbacks(received, farthest, method.trains_before_merging):
        context.state.clear()
        for name, record in stored.items():
            context.state[name] = record
        if start_from != "stored":
            base = initial if start_from == "initial" else method.last_trained(context)  # read before forget
            if base is None:
                continue  # the method keeps no trained model
            for name in (STATE_MODEL, STATE_DICTIONARY, STATE_META):
                context.state.pop(name, None)
            method.forget(context)
            peer = PeerState({n: v.copy() for n, v in base.items()}, float(request["mass"]))
        else:
            peer = PeerState({n: v.copy() for n, v in start.state.items()}, start.mass,
                             {n: v.copy() for n, v in start.dictionary.items()})
        dropped = refused_mass + sum(r.mass for r in received if not any(r is m for m in merged))
        event_request = request if not dropped else ConfigRecord(
            {**dict(request), "absorbed-mass": float(request["absorbed-mass"]) + dropped})
        out = method.event(GossipEvent(context, peer, model, layout, shared, merged, event_request, x_train, y_train,
                                       common, cfg.gossip))
        if _sane(peer, shared, limit):
            if merged is not received or start_from != "stored":
                log.warning("this peer's model stayed within the bounds %s", tried)
            break
        log.warning("this peer's model left the bounds %s", tried)
    else:
        raise ValueError(f"this peer's model is not finite, or beyond {limit:g} in magnitude, after training "
                         "from the initial model on its own data (local lr too high?)")
    restarted = int(start_from != "stored")
    refused = int(request["received"]) - len(merged)
    save_peer(context, peer)
    accuracy = evaluate(model, x_test, y_test)[1] if len(y_test) else float("nan")
    content = RecordDict({"metrics": MetricRecord({protocol.TRAIN_LOSS: float(out.loss),
                                                   protocol.LOCAL_ACCURACY: float(accuracy),
                                                   protocol.REFUSED_MESSAGES: refused,
                                                   protocol.RESTARTED: restarted,
                                                   protocol.NUM_EXAMPLES: len(y_train)})})
    if out.push is not None:
        content["push"] = to_record(out.push)
    for index, fragment in enumerate(out.fragments):  # one per out-neighbour, in the relay's order
        content[f"push-{index}"] = to_record(fragment)
    return Message(content, reply_to=msg)
