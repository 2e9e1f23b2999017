"""Model <-> flat float32 vector, with validation of client replies.

Strategies work on one contiguous vector: one numpy operation per arrival
instead of one per layer. The codec remembers the layout (names, shapes,
dtypes) of the initial model and rejects replies that do not match it.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from flwr.app import Array, ArrayRecord


class MalformedUpdate(ValueError):
    """A client's arrays cannot be aggregated; ``reason`` is a short tag for counting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


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
    header = data[10 if major == 1 else 12 : offset]
    if b"'fortran_order': True" in header:
        return array.numpy()
    dtype = np.dtype(array.dtype)
    return np.frombuffer(data, dtype=dtype, offset=offset, count=int(np.prod(array.shape))).reshape(array.shape)


class ModelCodec:
    """Layout of one model: converts ArrayRecords to flat vectors and back."""

    def __init__(self, names: list[str], shapes: list[tuple[int, ...]], dtypes: list[np.dtype]) -> None:
        self.names = names
        self.shapes = shapes
        self.dtypes = dtypes
        self.sizes = [int(np.prod(s)) for s in shapes]
        self.offsets = np.cumsum([0] + self.sizes)
        self.size = int(self.offsets[-1])

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

    def clamp_variances(self, flat: np.ndarray) -> tuple[np.ndarray, int]:
        """``flat`` with BatchNorm ``running_var`` entries clamped to >= 0, and how many were negative.

        Stale-delta updates ``x + eta * (client - stale_base)`` treat BatchNorm running
        variances like weights; when the base's variance exceeds the client's and the
        current one is small, the sum turns negative and evaluation yields NaN
        (seen with FedRevive on the BatchNorm CNN). A variance cannot be negative.
        ``flat`` itself is never modified (a strategy may keep it); a copy is made
        only when something is clamped.
        """
        segments = [(self.offsets[i], self.offsets[i + 1]) for i, name in enumerate(self.names)
                    if name.endswith("running_var")]
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
            if np.issubdtype(self.dtypes[i], np.integer):
                piece = np.rint(piece)
            # np.array keeps 0-d entries 0-d (np.ascontiguousarray would make them 1-d).
            items[name] = Array(np.array(piece, dtype=self.dtypes[i], order="C"))
        return ArrayRecord(items)

    def decode(self, record: ArrayRecord) -> np.ndarray:
        """Validate a client's ArrayRecord and return it flattened.

        Arrays are matched by name when the names agree with ours, else by
        position (ClientApps that send plain lists of arrays).

        Raises
        ------
        MalformedUpdate
            Wrong number of arrays, wrong shape, non-numeric dtype, or NaN/Inf.
        """
        keys = list(record.keys())
        if len(keys) != len(self.names):
            raise MalformedUpdate("wrong-layout", f"{len(keys)} arrays, expected {len(self.names)}")
        order = self.names if set(keys) == set(self.names) else keys
        arrays = []
        for i, key in enumerate(order):
            try:
                array = array_view(record[key])
            except Exception as exc:  # corrupt bytes or unknown serialisation
                raise MalformedUpdate("undecodable", f"array {key!r}: {exc}") from exc
            if tuple(array.shape) != self.shapes[i]:
                raise MalformedUpdate("wrong-shape", f"array {key!r} has shape {array.shape}, expected {self.shapes[i]}")
            if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
                raise MalformedUpdate("wrong-dtype", f"array {key!r} has dtype {array.dtype}")
            arrays.append(array)
        flat = self.flatten(arrays)
        if not np.isfinite(flat).all():
            raise MalformedUpdate("non-finite", "update contains NaN or Inf")
        return flat
