"""SWIFT (Bornstein et al., ICLR 2023, "SWIFT: Rapid decentralized federated learning via
wait-free model communication"), the PushCen-ADFL paper's fourth baseline (its Sec. 5.1.5).

A SWIFT client never waits for its neighbours: it keeps the newest model it has
received from each neighbour in a local cache and, when it is active, averages
its own model with every cached model, stale or not, with equal weights. The
step is SWIFT's Eq. (4), ``X <- X W_i - gamma G(x_i)``: the gradient is taken
at the client's own (pre-averaging) model and applied to the averaged model.
With several local SGD steps per event the gradient term is the local-training
delta ``LocalSGD(x_i) - x_i``.

A received model replaces that sender's cached one; the cache keeps at most
``capacity`` senders, dropping the one heard from least recently (SWIFT caches
exactly its fixed neighbours; with resampled out-neighbours the set of senders
is unbounded, hence the bound).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ConfigRecord

from asyncfl.decentralized.method import GossipEvent, GossipMethod, Outgoing, load_state, to_record
from asyncfl.decentralized.peer import train_with_anchor
from asyncfl.errors import ConfigError

if TYPE_CHECKING:
    from flwr.app import Context

#: Where a peer keeps its neighbour cache between events (``context.state``): the models, and their senders in order.
STATE_CACHE, STATE_CACHE_ORDER = "swift-cache", "swift-cache-order"
#: The model the peer's last event trained, before the merge (what a restart starts from: the stored merged model
#: holds neighbours' values no training has met yet).
STATE_TRAINED = "swift-trained"


class NeighbourCache:
    """The newest model per sender, at most ``capacity`` senders, least recently heard dropped first.

    Parameters
    ----------
    capacity : int
        Most senders kept (>= 1).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError(f"the SWIFT cache needs capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._models: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._models)

    def senders(self) -> list[int]:
        """Cached senders, least recently heard first."""
        return list(self._models)

    def models(self) -> list[dict[str, np.ndarray]]:
        """Cached models in the order of :meth:`senders`."""
        return list(self._models.values())

    def put(self, sender: int, model: dict[str, np.ndarray]) -> None:
        """Cache ``model`` as ``sender``'s newest, evicting the least recently heard sender when full."""
        self._models.pop(sender, None)
        self._models[sender] = model
        while len(self._models) > self.capacity:
            self._models.popitem(last=False)


def swift_merge(own: dict[str, np.ndarray], trained: dict[str, np.ndarray], cached: list[dict[str, np.ndarray]],
                shared: list[str]) -> dict[str, np.ndarray]:
    """SWIFT's update: the equal-weight mean of ``own`` and ``cached`` plus the local delta ``trained - own``.

    Parameters
    ----------
    own : dict
        The client's model before its local training (where the gradient was taken).
    trained : dict
        The same model after local training.
    cached : list of dict
        The cached neighbour models (entries ``shared`` only).
    shared : list of str
        Entries that are averaged; the others (BatchNorm statistics, FedBN) take ``trained``'s values.

    Returns
    -------
    dict
        The new model.
    """
    out = {name: value.copy() for name, value in trained.items()}
    for name in shared:
        stack = np.stack([own[name].astype(np.float64)] + [m[name].reshape(own[name].shape) for m in cached])
        delta = trained[name].astype(np.float64) - own[name].astype(np.float64)
        out[name] = (stack.mean(axis=0) + delta).astype(own[name].dtype)
    return out


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
    """Keep ``cache`` in ``context.state`` for the next event."""
    if not len(cache):
        return
    context.state[STATE_CACHE] = to_record({f"{sender}/{name}": value
                                            for sender, model in zip(cache.senders(), cache.models())
                                            for name, value in model.items()})
    context.state[STATE_CACHE_ORDER] = ConfigRecord({"senders": [int(s) for s in cache.senders()]})


class Swift(GossipMethod):
    """SWIFT: cache what arrived, train from the own model, then the mean of own and cache plus the delta; the
    whole model goes to every out-neighbour."""

    run_config_name = "swift"
    trains_before_merging = True

    def forget(self, context: Context) -> None:
        """Drop the neighbour cache and the last trained model."""
        for name in (STATE_CACHE, STATE_CACHE_ORDER, STATE_TRAINED):
            context.state.pop(name, None)

    def last_trained(self, context: Context) -> dict[str, np.ndarray] | None:
        """The model the last event trained, before it was averaged with the cache."""
        if STATE_TRAINED not in context.state.array_records:
            return None
        return {name: array.numpy() for name, array in context.state.array_records[STATE_TRAINED].items()}

    def event(self, event: GossipEvent) -> Outgoing:
        peer, shared = event.peer, event.shared
        cache = load_cache(event.context, event.settings.cache_size)
        for item in event.received:  # oldest first, so the newest sender ends most recent
            cache.put(item.sender, {name: item.message[name] for name in shared})
        own = {name: value.copy() for name, value in peer.state.items()}
        load_state(event.model, event.layout, own)
        loss = train_with_anchor(event.model, event.x_train, event.y_train, {}, {}, 0.0, **event.training)
        trained = {n: t.detach().cpu().numpy().copy() for n, t in event.model.state_dict().items()}
        peer.state = swift_merge(own, trained, cache.models(), shared)
        load_state(event.model, event.layout, peer.state)  # the peer's accuracy is its merged model's
        save_cache(event.context, cache)
        event.context.state[STATE_TRAINED] = to_record(trained)
        return Outgoing(loss, push={n: peer.state[n].astype(np.float32) for n in shared})
