"""Pack integer indices at ``bits`` bits each (the WCP assignment map on the wire, PushCen Appendix B)."""

from __future__ import annotations

import numpy as np


def pack_indices(indices: np.ndarray, bits: int) -> bytes:
    """Big-endian bit-pack of non-negative ``indices`` (each < 2**bits), padded to a whole byte."""
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in [1, 16], got {bits}")
    values = np.asarray(indices, dtype=np.uint32).reshape(-1)
    if values.size and int(values.max()) >= 1 << bits:
        raise ValueError(f"index {int(values.max())} does not fit in {bits} bits")
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint32)
    bit_matrix = ((values[:, None] >> shifts) & 1).astype(np.uint8)
    return np.packbits(bit_matrix.reshape(-1)).tobytes()


def unpack_indices(payload: bytes, count: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_indices`: the first ``count`` indices."""
    if len(payload) * 8 < count * bits:
        raise ValueError(f"payload of {len(payload)} bytes cannot hold {count} indices of {bits} bits")
    bit_array = np.unpackbits(np.frombuffer(payload, dtype=np.uint8))[: count * bits].reshape(count, bits)
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint32)
    return (bit_array.astype(np.uint32) @ weights).astype(np.uint32)
