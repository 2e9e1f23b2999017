"""A gossip method's peer side: one compute event, from what arrived to what goes out.

Each method is a class with one job, :meth:`GossipMethod.event`, that names itself once in its body
(``run_config_name = "swift"``), in a module of :mod:`asyncfl.decentralized`; the run-config, the
CLI and the peers' ClientApp find it there (:data:`asyncfl.decentralized.settings.GOSSIP_CLASSES`),
as the server-side methods are found (:mod:`asyncfl.strategies.registry`). The relay sends every
method the same request; adding a method touches its own module only.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from asyncfl.decentralized.codec import Layout
from asyncfl.decentralized.peer import PeerState, Received, train_with_anchor
from asyncfl.errors import ConfigError

if TYPE_CHECKING:
    from flwr.app import ConfigRecord, Context

    from asyncfl.decentralized.settings import GossipConfig


@dataclass
class GossipEvent:
    """What one compute event of a peer works with.

    Parameters
    ----------
    context : Context
        The peer's Flower context (its ``state`` keeps what a method stores between events).
    peer : PeerState
        The peer's model, push-sum mass and centroid dictionary; the event leaves the new state in it.
    model : torch.nn.Module
        The network to train (its weights are loaded from ``peer`` as the method needs).
    layout : Layout
        The model's entries and which are shared on the wire.
    shared : list of str
        The entries neighbours exchange (the peer's local ones excluded).
    received : list of Received
        What arrived since the last event, oldest first.
    request : ConfigRecord
        The relay's request (``out-degree``, ``senders``, ``fragments``, ``absorbed-mass``, the job seed, ...).
    x_train, y_train : numpy.ndarray
        The peer's local training split.
    training : dict
        :func:`~asyncfl.decentralized.peer.train_with_anchor`'s keywords (steps, batch size, optimizer, seed).
    settings : GossipConfig
        The run's ``gossip.*`` / method knobs.
    """

    context: Context
    peer: PeerState
    model: torch.nn.Module
    layout: Layout
    shared: list[str]
    received: list[Received]
    request: ConfigRecord
    x_train: np.ndarray
    y_train: np.ndarray
    training: dict
    settings: GossipConfig


@dataclass
class Outgoing:
    """What an event sends: one message to every out-neighbour (``push``), or one per out-neighbour in the
    relay's order (``fragments``), or nothing (the push-sum mass each carries is the relay's to compute)."""

    loss: float
    push: dict[str, np.ndarray] | None = None
    fragments: list[dict[str, np.ndarray]] = field(default_factory=list)


class GossipMethod:
    """A decentralized method's compute event (module docstring)."""

    #: Its run-config ``strategy``, set in the method's own class body (where the registry finds it).
    run_config_name: ClassVar[str | None] = None
    #: Whether an event trains the stored model before it merges what arrived (SWIFT): then what arrived does not
    #: change that event's training, and a peer whose model leaves the bounds restarts at once instead of retrying
    #: with fewer messages (only a model already near the limit could be tipped over by the merge itself).
    trains_before_merging: ClassVar[bool] = False

    def event(self, event: GossipEvent) -> Outgoing:
        """Merge what arrived, train, and say what goes out; ``event.peer`` holds the new state."""
        raise NotImplementedError

    def message_schema(self, layout: Layout, shared: list[str], settings: GossipConfig) -> dict[str, tuple]:
        """The arrays a neighbour's message holds, exactly: ``name -> (dtype, shape)`` (shape an int ``n``: 1-D with
        at most ``n`` values, for :meth:`refusal` to check further). By default the shared entries as float32 in
        their own shapes: a whole model."""
        return {name: (np.dtype(np.float32), tuple(layout.shapes[name])) for name in shared}

    def forget(self, context: Context) -> None:
        """Drop what the method keeps in ``context.state`` between events (the peer restarts, from the model it
        last trained or the initial one); nothing by default."""

    def last_trained(self, context: Context) -> dict[str, np.ndarray] | None:
        """The model this peer's last event trained, kept in ``context.state``, for a restart to start from before
        the initial model (where the stored model is not one the peer trained; it may hold what earlier merges let
        in, within the bounds); None by default."""
        return None

    def distance(self, message: dict[str, np.ndarray], own: dict[str, np.ndarray], layout: Layout,
                 shared: list[str]) -> float:
        """Root mean square difference between the model values ``message`` carries and the receiver's ``own``
        model at the same coordinates (a merge moves the model a weighted share of it): the larger, the first
        suspected. By default the message is a whole model."""
        return root_mean_square([message[name].astype(np.float64) - own[name] for name in shared])

    def refusal(self, message: dict[str, np.ndarray], layout: Layout, shared: list[str],
                settings: GossipConfig) -> str | None:
        """Why a message that fits :meth:`message_schema` still cannot be merged (values the method cannot take),
        or None."""
        return None


#: Room for an array's .npy header in Flower's serialisation (honest arrays' are ~128 bytes).
NPY_HEADER_BYTES = 4096
#: A value a neighbour sends, or a peer's model holds after an event, may be at most this many times the largest
#: magnitude of the (seeded, shared) initial model (or 1): trained weights stay within a few times their start,
#: while finite values near float32's limit overflow the first training step into NaN.
MAGNITUDE_LIMIT = 1e3


def root_mean_square(differences: list[np.ndarray]) -> float:
    """Root mean square over every value of ``differences`` (0 for none)."""
    count = sum(d.size for d in differences)
    return math.sqrt(sum(float(np.square(d).sum()) for d in differences) / count) if count else 0.0


def magnitude_limit(initial: dict[str, np.ndarray], shared: list[str]) -> float:
    """:data:`MAGNITUDE_LIMIT` times the largest magnitude of the initial model's shared float entries (at least 1)."""
    largest = max((float(np.abs(initial[n]).max(initial=0.0)) for n in shared if initial[n].dtype.kind == "f"),
                  default=0.0)
    return MAGNITUDE_LIMIT * max(1.0, largest)


def read_message(record, method: GossipMethod, layout: Layout, shared: list[str], settings: GossipConfig,
                 limit: float = float("inf")) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """A neighbour's message checked before it is merged: ``(arrays, None)``, or ``(None, reason)`` when it is not
    exactly the method's schema (names, dtypes, shapes), holds a value that is not finite or beyond ``limit`` in
    magnitude (:func:`magnitude_limit`), or is refused by the method. Names, dtypes and shapes are checked from the
    arrays' headers before any array is decoded, so extra or oversized entries cost nothing (then again from the
    decoded data)."""
    schema = method.message_schema(layout, shared, settings)
    if not isinstance(record, ArrayRecord) or set(record.keys()) != set(schema):
        return None, "names"
    def fits(dtype_name, got_shape, dtype, shape) -> bool:
        if str(dtype_name) != str(dtype):
            return False
        if isinstance(shape, int):
            return len(got_shape) == 1 and got_shape[0] <= shape
        return tuple(got_shape) == tuple(shape)

    def payload_fits(array, dtype, shape) -> bool:  # the bytes too: Flower decodes the data, not the header
        count = shape if isinstance(shape, int) else math.prod(shape)
        return len(array.data) <= count * np.dtype(dtype).itemsize + NPY_HEADER_BYTES

    if not all(fits(record[name].dtype, record[name].shape, *schema[name])
               and payload_fits(record[name], *schema[name]) for name in schema):
        return None, "dtype-or-shape"  # from the arrays' own headers and sizes, before any of them is decoded
    message = {}
    for name, (dtype, shape) in schema.items():
        try:
            value = record[name].numpy()
        except Exception:  # a lying header or a bad serialisation
            return None, "unreadable"
        if not fits(value.dtype, value.shape, dtype, shape):  # the data said otherwise than the header
            return None, "dtype-or-shape"
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return None, "non-finite"
        if value.dtype.kind == "f" and float(np.abs(value).max(initial=0.0)) > limit:
            return None, "too-large"
        message[name] = value
    reason = method.refusal(message, layout, shared, settings)
    return (None, reason) if reason is not None else (message, None)


def load_state(model: torch.nn.Module, layout: Layout, state: dict[str, np.ndarray]) -> None:
    """Load a peer's state (numpy arrays) into ``model``."""
    model.load_state_dict({n: torch.from_numpy(np.asarray(v)).reshape(layout.shapes[n]) for n, v in state.items()})


def train_own(event: GossipEvent) -> float:
    """Train the peer's own model (``event.peer.state``) and keep the result as its state; returns the loss."""
    load_state(event.model, event.layout, event.peer.state)
    loss = train_with_anchor(event.model, event.x_train, event.y_train, {}, {}, 0.0, **event.training)
    event.peer.state = {n: t.detach().cpu().numpy().copy() for n, t in event.model.state_dict().items()}
    return loss


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Named arrays as an ArrayRecord, in their order."""
    return ArrayRecord(OrderedDict((name, Array(np.ascontiguousarray(value))) for name, value in arrays.items()))


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as named numpy arrays."""
    return {name: array.numpy() for name, array in record.items()}


def gossip_method(name: str) -> GossipMethod:
    """The method registered as ``name`` (:data:`asyncfl.decentralized.settings.GOSSIP_CLASSES`), built."""
    from importlib import import_module

    from asyncfl.decentralized.settings import GOSSIP_CLASSES

    if name not in GOSSIP_CLASSES:
        raise ConfigError(f"unknown gossip method {name!r}; valid: {', '.join(GOSSIP_CLASSES)}")
    module, _, cls = GOSSIP_CLASSES[name].partition(":")
    return getattr(import_module(module), cls)()
