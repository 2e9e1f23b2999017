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
        """Concatenate arrays of this layout into one float32 vector."""
        return np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in arrays])

    def to_record(self, flat: np.ndarray) -> ArrayRecord:
        """An ArrayRecord with this layout's names, shapes and dtypes."""
        items = OrderedDict()
        for i, name in enumerate(self.names):
            piece = flat[self.offsets[i] : self.offsets[i + 1]].reshape(self.shapes[i])
            if self.dtypes[i] != np.float32:
                piece = np.rint(piece).astype(self.dtypes[i]) if np.issubdtype(self.dtypes[i], np.integer) else piece.astype(self.dtypes[i])
            items[name] = Array(np.ascontiguousarray(piece))
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
                array = record[key].numpy()
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
