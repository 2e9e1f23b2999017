"""Model <-> flat float32 vector, with validation of client replies.

Strategies work on one contiguous vector: one numpy operation per arrival
instead of one per layer. The codec remembers the layout (names, shapes,
dtypes) of the initial model and rejects replies that do not match it
(``docs/security.md``: every reply is a participant's data, checked before use).

Reading a train reply
---------------------
A train reply checked before a strategy sees it: an :class:`Arrival`, or what is wrong with it, by reason.

A reply is rejected (counted by reason, never aggregated, the run goes on) when it never
came, is an error, lacks the model record, carries a model of another layout, names, shape,
dtype or range or with NaN/Inf (:class:`ModelCodec` says which), or
reports an example count that is not a whole number >= 0. Whatever a node sends is data: no
value, type or shape here raises past :func:`read_reply`. Step 3 of
the reply path (``docs/engine.md``): nothing here counts, logs or changes state.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from asyncfl import protocol
from asyncfl.errors import RejectedReply
from asyncfl.strategies.arrival import Arrival

if TYPE_CHECKING:  # annotations only: the engine's state imports this module
    from asyncfl.server_app.engine_state import Job
    from asyncfl.strategies.flower_options import MessageKeys


#: The largest integer entry a reply may carry: float32 (the flat vector) holds integers exactly up to 2**24.
INTEGER_LIMIT = 2**24
#: The longest .npy header an array may carry (numpy's own reader refuses longer ones by default).
HEADER_LIMIT = 10_000


def array_view(array: Array) -> np.ndarray:
    """Read-only numpy view of a Flower ``Array`` without ``np.load``'s header parsing.

    Flower serialises numpy arrays in ``.npy`` format and also stores dtype and
    shape on the ``Array``; we skip the header and view the payload in place.
    Other serialisations fall back to ``Array.numpy()``.
    """
    data = array.data
    if array.stype != "numpy.ndarray" or data[:6] != b"\x93NUMPY":
        return array.numpy()
    major = data[6]
    if major == 1:
        offset = 10 + int.from_bytes(data[8:10], "little")
    else:
        offset = 12 + int.from_bytes(data[8:12], "little")
    if offset > HEADER_LIMIT + 12:
        raise ValueError(f"a .npy header of {offset} bytes; at most {HEADER_LIMIT}")
    dtype = np.dtype(array.dtype)
    count = int(np.prod(array.shape))
    if len(data) != offset + count * dtype.itemsize:  # bytes beyond the array would be carried (journaled) unread
        raise ValueError(f"{len(data)} bytes, not the {offset + count * dtype.itemsize} its header, dtype and shape "
                         "make")
    if b"'fortran_order': True" in data[10 if major == 1 else 12 : offset]:
        return array.numpy()
    return np.frombuffer(data, dtype=dtype, offset=offset, count=count).reshape(array.shape)


class ModelCodec:
    """Layout of one model: converts ArrayRecords to flat vectors and back."""

    def __init__(self, names: list[str], shapes: list[tuple[int, ...]], dtypes: list[np.dtype]) -> None:
        self.names = names
        self.shapes = shapes
        self.dtypes = dtypes
        self.sizes = [int(np.prod(s)) for s in shapes]
        self.index = {name: i for i, name in enumerate(names)}
        self.offsets = np.cumsum([0] + self.sizes)
        self.size = int(self.offsets[-1])
        #: Where BatchNorm ``running_var`` entries lie in the flat layout (:meth:`clamp_variances`); empty without.
        self.variance_segments = [(self.offsets[i], self.offsets[i + 1]) for i, name in enumerate(names)
                                  if name.endswith("running_var")]

    @classmethod
    def from_state(cls, state: "OrderedDict[str, np.ndarray]") -> "ModelCodec":
        """Layout of a name -> array mapping (e.g. a torch ``state_dict`` as numpy)."""
        return cls(list(state), [tuple(a.shape) for a in state.values()], [a.dtype for a in state.values()])

    def flatten(self, arrays: list[np.ndarray]) -> np.ndarray:
        """Copy arrays of this layout into one new float32 vector (a single copy)."""
        out = np.empty(self.size, dtype=np.float32)
        for i, array in enumerate(arrays):
            out[self.offsets[i] : self.offsets[i + 1]] = np.asarray(array).reshape(-1)
        return out

    def trained_entries(self) -> np.ndarray | None:
        """Boolean vector over the flat layout: True where an entry is trained (floating point and not a
        BatchNorm running statistic or counter); ``None`` when every entry is."""
        statistics = ("running_mean", "running_var", "num_batches_tracked")
        mask = np.concatenate([np.full(size, np.issubdtype(dtype, np.floating) and not name.endswith(statistics))
                               for name, size, dtype in zip(self.names, self.sizes, self.dtypes)])
        return None if mask.all() else mask

    def statistic_entries(self) -> np.ndarray | None:
        """Boolean vector over the flat layout: True where an entry is a floating-point BatchNorm running statistic
        (``running_mean``, ``running_var``); ``None`` when the model has none."""
        mask = np.concatenate([np.full(size, np.issubdtype(dtype, np.floating)
                                       and name.endswith(("running_mean", "running_var")))
                               for name, size, dtype in zip(self.names, self.sizes, self.dtypes)])
        return mask if mask.any() else None

    def integer_entries(self) -> np.ndarray | None:
        """Boolean vector over the flat layout: True where an entry is an integer (e.g. ``num_batches_tracked``);
        ``None`` when the model has none."""
        mask = np.concatenate([np.full(size, np.issubdtype(dtype, np.integer))
                               for size, dtype in zip(self.sizes, self.dtypes)])
        return mask if mask.any() else None

    def bound_groups(self) -> list[np.ndarray | None]:
        """The entries the update-norm bound measures together, each group against its own history: the trained
        entries (``None``: every entry is one), then, where the model has them, the BatchNorm running statistics,
        the integer entries, and any other entry (e.g. a counter stored as float) so that no entry goes unbounded."""
        trained = self.trained_entries()
        if trained is None:
            return [None]
        groups = [trained] + [g for g in (self.statistic_entries(), self.integer_entries()) if g is not None]
        rest = ~np.logical_or.reduce(groups)
        return groups + ([rest] if rest.any() else [])

    def clamp_variances(self, flat: np.ndarray) -> tuple[np.ndarray, int]:
        """``flat`` with BatchNorm ``running_var`` entries clamped to >= 0, and how many were negative.

        Stale-delta updates ``x + eta * (client - stale_base)`` treat BatchNorm running
        variances like weights; when the base's variance exceeds the client's and the
        current one is small, the sum turns negative and evaluation yields NaN
        (seen with FedRevive on the BatchNorm CNN). A variance cannot be negative.
        ``flat`` itself is never modified (a strategy may keep it); a copy is made
        only when something is clamped.
        """
        segments = self.variance_segments
        negative = sum(int((flat[a:b] < 0).sum()) for a, b in segments)
        if not negative:
            return flat, 0
        out = flat.copy()
        for a, b in segments:
            np.maximum(out[a:b], 0.0, out=out[a:b])
        return out, negative

    def to_record(self, flat: np.ndarray) -> ArrayRecord:
        """An ArrayRecord with this layout's names, shapes and dtypes."""
        items = OrderedDict()
        for i, name in enumerate(self.names):
            piece = flat[self.offsets[i] : self.offsets[i + 1]].reshape(self.shapes[i])
            if np.issubdtype(self.dtypes[i], np.integer):  # within the dtype's range: no wrap-around on the cast
                info = np.iinfo(self.dtypes[i])
                piece = np.clip(np.rint(piece), max(info.min, -INTEGER_LIMIT), min(info.max, INTEGER_LIMIT))
            # np.array keeps 0-d entries 0-d (np.ascontiguousarray would make them 1-d).
            items[name] = Array(np.array(piece, dtype=self.dtypes[i], order="C"))
        return ArrayRecord(items)

    def decode(self, record: ArrayRecord) -> np.ndarray:
        """Validate a client's ArrayRecord and return it flattened.

        A reply is data from a participant that may be faulty or hostile: it must carry exactly
        this layout's names (in any order, as Flower's own strategies require), each array of its
        shape, of a floating dtype where the model's entry is floating and an integer dtype where it
        is an integer (a counter sent as float32 +-3.4e38 would make the model non-finite), integer
        values within float32's exact range (+-2**24; the flat vector is float32), and no NaN/Inf.

        Raises
        ------
        RejectedReply
            ``wrong-layout`` (number of arrays), ``wrong-names``, ``undecodable``, ``wrong-shape``,
            ``wrong-dtype``, ``out-of-range`` or ``non-finite``.
        """
        keys = list(record.keys())
        if len(keys) != len(self.names):
            raise RejectedReply("wrong-layout", f"{len(keys)} arrays, expected {len(self.names)}")
        if set(keys) != set(self.names):
            unknown = sorted(set(keys) - set(self.names))[:3]
            raise RejectedReply("wrong-names", f"arrays named {unknown} are not in the model; expected the names "
                                               f"the model was sent with (e.g. {self.names[:3]})")
        flat = np.empty(self.size, dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # float64 beyond float32's range becomes inf: refused below
            for i in range(len(self.names)):
                flat[self.offsets[i] : self.offsets[i + 1]] = self._checked_array(i, record).reshape(-1)
        if not np.isfinite(flat).all():
            raise RejectedReply("non-finite", "update contains NaN or Inf (or a value beyond float32's range)")
        return flat

    def _checked_array(self, i: int, record: ArrayRecord) -> np.ndarray:
        """Array ``i`` of the layout from ``record``, checked for decodability, shape, dtype kind and range."""
        name = self.names[i]
        try:
            array = array_view(record[name])
        except Exception as exc:  # corrupt bytes, an unknown serialisation, a dtype numpy does not know
            raise RejectedReply("undecodable", f"array {name!r}: {type(exc).__name__}: {str(exc)[:200]}") \
                from exc
        if tuple(array.shape) != self.shapes[i]:
            raise RejectedReply("wrong-shape",
                                f"array {name!r} has shape {array.shape}, expected {self.shapes[i]}")
        expected_integer = np.issubdtype(self.dtypes[i], np.integer)
        kind_ok = (np.issubdtype(array.dtype, np.integer) if expected_integer
                   else np.issubdtype(array.dtype, np.floating))
        if not kind_ok or array.dtype == np.bool_:
            wanted = "an integer" if expected_integer else "a floating"
            raise RejectedReply("wrong-dtype", f"array {name!r} has dtype {array.dtype}; the model's entry is "
                                               f"{self.dtypes[i]} ({wanted} dtype is expected)")
        if expected_integer and array.size and (int(array.min()) < -INTEGER_LIMIT or int(array.max()) > INTEGER_LIMIT):
            raise RejectedReply("out-of-range", f"integer array {name!r} holds a value beyond +-{INTEGER_LIMIT} "
                                                "(float32 holds integers exactly only up to 2**24)")
        return array


#: Flower's codes for a message or reply it dropped as older than its TTL: the job ran out of time.
EXPIRED_CODES = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE)
#: How an error reply in place of one Flower's Grid could not decode begins (``transport.undecodable_reply``).
UNDECODABLE_REPLY = "the reply could not be decoded"


def is_undecodable(reply: Message) -> bool:
    """Whether ``reply`` is the error the server made in place of a reply Flower's Grid could not decode (from the
    SuperLink's node id, which no node's own reply carries)."""
    return (reply.metadata.src_node_id == SUPERLINK_NODE_ID
            and (reply.error.reason or "").startswith(UNDECODABLE_REPLY))


def read_train_reply(reply: Message, codec: ModelCodec, keys: MessageKeys) -> np.ndarray:
    """The trained model of ``reply`` as a flat vector in ``codec``'s layout; :class:`RejectedReply` if unusable."""
    if reply.has_error():
        if is_undecodable(reply):
            raise RejectedReply("undecodable", reply.error.reason[:300])
        lines = (reply.error.reason or "").strip().splitlines()
        raise RejectedReply("error-reply", f"the ClientApp replied with an error: {lines[-1][:300] if lines else '?'}",
                            expired=reply.error.code in EXPIRED_CODES)
    records = reply.content.array_records
    if keys.arrays not in records:
        raise RejectedReply("no-arrays", f"the reply lacks the {keys.arrays!r} record")
    return codec.decode(records[keys.arrays])


def read_reply(job: Job, reply: Message | None, codec: ModelCodec, keys: MessageKeys, version: int,
               base: np.ndarray, timeout: float) -> Arrival | RejectedReply:
    """What ``job``'s ``reply`` gives the strategy: an :class:`Arrival` (``version`` is the server's version now,
    ``base`` the model the job was sent), or the :class:`RejectedReply` saying why it gives nothing.

    ``reply`` is ``None`` for a job that never came back (``job.lost_reason``; ``timeout``: the wait it had).
    """
    if reply is None:
        if job.lost_reason == "node-offline":
            return RejectedReply(job.lost_reason, f"job {job.seq} lost: client {job.client}'s node went offline")
        return RejectedReply(job.lost_reason, f"job {job.seq} to client {job.client} lost (no reply in "
                                              f"{timeout:.0f}s)", expired=True)
    try:
        weights = read_train_reply(reply, codec, keys)
    except RejectedReply as rejected:
        return rejected
    metrics = protocol.reply_metrics(reply.content)
    num_examples = reported_count(metrics, keys.weight)
    if isinstance(num_examples, RejectedReply):
        return num_examples
    return Arrival(client_index=job.client, base_version=job.version, staleness=version - job.version,
                   weights=weights, base=base, num_examples=num_examples, train_loss=reported_loss(metrics),
                   time=job.finish)


#: The largest example count a reply may report (float64 holds whole numbers exactly up to 2**53).
MAX_COUNT = 2**53


def reported_count(metrics, key: str) -> int | RejectedReply:
    """A reply's example count under ``key``: a whole number >= 0 (an integral float is taken), 0 when absent;
    anything else (NaN, inf, negative, fractional, a list, a bool) is the reply's rejection ``bad-num-examples``."""
    value = metrics.get(key, 0) if metrics is not None else 0
    whole = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if not whole or not 0 <= value <= MAX_COUNT:
        return RejectedReply("bad-num-examples", f"{key!r} is {str(value)[:60]} ({type(value).__name__}); "
                                                 f"expected a whole number from 0 to {MAX_COUNT}")
    return int(value)


def reported_loss(metrics) -> float:
    """A reply's training loss (``train-loss`` or Flower's ``train_loss``) when it is a finite number, else NaN:
    a report, not an input to any step, so an odd value is not worth a rejection."""
    if metrics is None:
        return float("nan")
    value = next((metrics[k] for k in protocol.TRAIN_LOSS_ALIASES if k in metrics), None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float("nan")
    try:
        loss = float(value)
    except OverflowError:  # an int beyond float's range
        return float("nan")
    return loss if math.isfinite(loss) else float("nan")
