"""A peer's side of the gossip relay: one compute event per ``train.gossip`` message.

The peer's model, push-sum mass and centroid dictionary live in
``context.state`` between messages (in simulation and on real SuperNodes).
Methods: ``pushcen`` (PushCen-ADFL: push-sum merge, centroid-anchored masked
training, WCP messages), ``async-dfedavg`` (average of the own model and the
buffered neighbour models, full models on the wire), ``divshare`` (a different
model fragment to each out-neighbour, per-coordinate averaging), ``swift``
(equal-weight mean over a cache of every neighbour's newest model plus the
local-training delta, full models on the wire) and ``independent`` (local
training only, nothing sent).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from asyncfl import protocol
from asyncfl.client_app.training import evaluate
from asyncfl.decentralized.codec import Layout
from asyncfl.decentralized.divshare import Fragment, merge_fragments, split_model
from asyncfl.decentralized.peer import PeerConfig, PeerState, Received, compute_event, train_with_anchor
from asyncfl.decentralized.swift import NeighbourCache, swift_merge

STATE_MODEL, STATE_DICTIONARY, STATE_META = "gossip-model", "gossip-dictionary", "gossip-meta"
STATE_CACHE, STATE_CACHE_ORDER = "swift-cache", "swift-cache-order"


def local_split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """A seeded split of the peer's own partition into local train and local test (the PushCen protocol)."""
    order = np.random.default_rng([seed, 13]).permutation(len(y))
    test = max(1, int(round(fraction * len(y)))) if len(y) > 1 else 0
    return x[order[test:]], y[order[test:]], x[order[:test]], y[order[:test]]


def _to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord(OrderedDict((name, Array(np.ascontiguousarray(value))) for name, value in arrays.items()))


def _from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


def load_peer(context: Context, model: torch.nn.Module) -> PeerState:
    """The peer's state from ``context.state``, or a fresh one from ``model`` (mass 1, no dictionary)."""
    if STATE_MODEL not in context.state.array_records:
        return PeerState({n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()})
    meta = context.state.config_records[STATE_META]
    dictionary = _from_record(context.state.array_records[STATE_DICTIONARY]) if STATE_DICTIONARY in context.state.array_records else {}
    return PeerState(_from_record(context.state.array_records[STATE_MODEL]), float(meta["mass"]), dictionary)


def save_peer(context: Context, peer: PeerState) -> None:
    context.state[STATE_MODEL] = _to_record(peer.state)
    context.state[STATE_META] = ConfigRecord({"mass": float(peer.mass)})
    if peer.dictionary:
        context.state[STATE_DICTIONARY] = _to_record(peer.dictionary)


def _load(model: torch.nn.Module, layout: Layout, state: dict[str, np.ndarray]) -> None:
    model.load_state_dict({n: torch.from_numpy(np.asarray(v)).reshape(layout.shapes[n]) for n, v in state.items()})


def load_cache(context: Context, capacity: int) -> NeighbourCache:
    """The SWIFT neighbour cache from ``context.state`` (empty on the first event)."""
    cache = NeighbourCache(capacity)
    if STATE_CACHE in context.state.array_records:
        stored = context.state.array_records[STATE_CACHE]
        for sender in context.state.config_records[STATE_CACHE_ORDER]["senders"]:
            prefix = f"{int(sender)}/"
            cache.put(int(sender), {key[len(prefix):]: array.numpy() for key, array in stored.items()
                                    if key.startswith(prefix)})
    return cache


def save_cache(context: Context, cache: NeighbourCache) -> None:
    if not len(cache):
        return
    context.state[STATE_CACHE] = _to_record({f"{sender}/{name}": value for sender, model in zip(cache.senders(), cache.models())
                                             for name, value in model.items()})
    context.state[STATE_CACHE_ORDER] = ConfigRecord({"senders": [int(s) for s in cache.senders()]})


def _swift_event(context: Context, peer: PeerState, model: torch.nn.Module, layout: Layout, shared: list[str],
                 received: list[Received], senders: list[int], capacity: int, x_train, y_train, common: dict):
    """One SWIFT event: cache what arrived, train from the own model, then the mean of own and cache plus the delta."""
    cache = load_cache(context, capacity)
    for sender, item in zip(senders, received):  # oldest first, so the newest sender ends most recent
        cache.put(int(sender), {name: item.message[name] for name in shared})
    own = {name: value.copy() for name, value in peer.state.items()}
    _load(model, layout, own)
    loss = train_with_anchor(model, x_train, y_train, {}, {}, 0.0, **common)
    trained = {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()}
    peer.state = swift_merge(own, trained, cache.models(), shared)
    _load(model, layout, peer.state)  # the peer's accuracy is its merged model's
    save_cache(context, cache)
    return {n: peer.state[n].astype(np.float32) for n in shared}, loss


def _steps(knobs: dict, num_examples: int) -> int:
    if int(knobs["local-epochs"]) > 0:
        return int(knobs["local-epochs"]) * max(1, math.ceil(num_examples / int(knobs["batch-size"])))
    return int(knobs["local-steps"])


def gossip_event(msg: Message, context: Context, cfg, data, model: torch.nn.Module) -> Message:
    """Run one compute event of the configured method and reply with the outgoing message."""
    request = msg.content.config_records["config"]
    knobs = {**cfg.train.to_message_config(), **dict(request)}
    x_train, y_train, x_test, y_test = local_split(data.x_train, data.y_train, cfg.gossip.local_test_fraction,
                                                   cfg.engine.seed)
    if len(y_train) == 0:
        raise ValueError("this peer's partition is empty; nothing to train on")
    layout = Layout.of(model)
    peer = load_peer(context, model)
    masses = list(request["masses"])
    received = [Received(_from_record(msg.content.array_records[f"msg-{i}"]), float(masses[i]))
                for i in range(int(request["received"]))]
    method = str(request["gossip-method"])
    steps = _steps(knobs, len(y_train))
    # every method trains with the run's optimizer (before, gossip peers always took SGD with lr and momentum)
    common = dict(steps=steps, batch_size=int(knobs["batch-size"]), lr=float(knobs["lr"]),
                  momentum=float(knobs["momentum"]), seed=int(knobs[protocol.JOB_SEED]),
                  optimizer=str(knobs["optimizer"]), weight_decay=float(knobs["weight-decay"]))
    push: dict[str, np.ndarray] | None = None
    fragments: list[dict[str, np.ndarray]] = []
    share = 0.0
    shared = [n for n, kind in layout.kinds.items() if kind != "local"]
    if method == "pushcen":
        config = PeerConfig(k=cfg.gossip.k, lam=cfg.gossip.lam, out_degree=int(request["out-degree"]),
                            penalty=cfg.gossip.penalty)
        push, share, loss = compute_event(peer, model, layout, config, received, x_train, y_train,
                                          absorbed_mass=float(request["absorbed-mass"]), **common)
    elif method == "swift":
        senders = [int(v) for v in request["senders"]][: len(received)]
        push, loss = _swift_event(context, peer, model, layout, shared, received, senders, cfg.gossip.cache_size,
                                  x_train, y_train, common)
        share = 1.0
    else:
        if method == "async-dfedavg" and received:
            for name in shared:
                stack = [peer.state[name]] + [r.message[name].reshape(layout.shapes[name]) for r in received]
                peer.state[name] = np.mean(np.stack(stack), axis=0).astype(peer.state[name].dtype)
        if method == "divshare" and received:
            flat = np.concatenate([peer.state[n].reshape(-1).astype(np.float32) for n in shared])
            merged = merge_fragments(flat, [Fragment(r.message["values"], *(int(v) for v in r.message["fragment"]))
                                            for r in received])
            offset = 0
            for name in shared:
                size = int(np.prod(layout.shapes[name]))
                peer.state[name] = merged[offset : offset + size].reshape(layout.shapes[name]).astype(peer.state[name].dtype)
                offset += size
        _load(model, layout, peer.state)
        loss = train_with_anchor(model, x_train, y_train, {}, {}, 0.0, **common)
        peer.state = {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()}
        if method == "async-dfedavg":
            push = {n: peer.state[n].astype(np.float32) for n in shared}
            share = 1.0
        if method == "divshare" and int(request["out-degree"]) > 0:
            flat = np.concatenate([peer.state[n].reshape(-1).astype(np.float32) for n in shared])
            seed = int(knobs[protocol.JOB_SEED]) % (2**31)
            parts = [{"values": f.values, "fragment": np.array([f.seed, f.index, f.fragments], dtype=np.int64)}
                     for f in split_model(flat, int(request["fragments"]), seed)]
            # out-neighbour j gets fragment j mod the count: each fragment reaches out-degree / count of them
            fragments = [parts[j % len(parts)] for j in range(int(request["out-degree"]))]
            share = 1.0
    save_peer(context, peer)
    accuracy = evaluate(model, x_test, y_test)[1] if len(y_test) else float("nan")
    content = RecordDict({"metrics": MetricRecord({protocol.TRAIN_LOSS: float(loss), protocol.LOCAL_ACCURACY: float(accuracy),
                                                   protocol.MASS_SHARE: float(share),
                                                   protocol.NUM_EXAMPLES: len(y_train)})})
    if push is not None:
        content["push"] = _to_record(push)
    for index, fragment in enumerate(fragments):  # one per out-neighbour, in the relay's order
        content[f"push-{index}"] = _to_record(fragment)
    return Message(content, reply_to=msg)
