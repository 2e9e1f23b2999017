"""A peer's model as a PushCen message, and back (PushCen-ADFL paper, Sec. 4.3 and Appendix B).

Which state entries travel and how:

* weight tensors with two or more dimensions (conv and linear weights) in WCP form:
  ``<name>::centroids`` (the k-1 non-zero centroids, float32, ascending) and
  ``<name>::indices`` (the assignment map bit-packed at ``ceil(log2 k)`` bits, uint8 bytes);
* other tensors (biases) as they are, float32;
* BatchNorm parameters and statistics never leave the peer (FedBN).

The message is a flat ``name -> np.ndarray`` mapping, ready for a Flower
``ArrayRecord``; :func:`message_bytes` counts its payload.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from torch import nn

from asyncfl.decentralized.bitpack import pack_indices, unpack_indices
from asyncfl.decentralized.wcp import EncodedLayer, index_bits, wcp_encode

CENTROIDS, INDICES = "::centroids", "::indices"


def local_only_names(model: nn.Module) -> set[str]:
    """State entries of BatchNorm modules: they stay on the peer."""
    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            prefix = f"{module_name}." if module_name else ""
            names |= {prefix + n for n, _ in module.named_parameters(recurse=False)}
            names |= {prefix + n for n, _ in module.named_buffers(recurse=False)}
    return names


@dataclass(frozen=True)
class Layout:
    """How each state entry of the architecture travels: ``clustered``, ``raw`` or ``local``."""

    kinds: "OrderedDict[str, str]"
    shapes: dict[str, tuple[int, ...]]

    @classmethod
    def of(cls, model: nn.Module) -> "Layout":
        local = local_only_names(model)
        kinds, shapes = OrderedDict(), {}
        for name, tensor in model.state_dict().items():
            shapes[name] = tuple(tensor.shape)
            if name in local:
                kinds[name] = "local"
            elif tensor.dim() >= 2 and tensor.is_floating_point():
                kinds[name] = "clustered"
            else:
                kinds[name] = "raw"
        return cls(kinds, shapes)

    def clustered(self) -> list[str]:
        return [n for n, kind in self.kinds.items() if kind == "clustered"]

    def shared(self) -> list[str]:
        """The entries neighbours exchange (every one but the local ones)."""
        return [n for n, kind in self.kinds.items() if kind != "local"]


def with_zero(nonzero: np.ndarray) -> np.ndarray:
    """The full sorted table: the k-1 non-zero centroids with 0 inserted in order."""
    nonzero = np.asarray(nonzero, dtype=np.float32)
    return np.insert(nonzero, int(np.searchsorted(nonzero, 0.0)), np.float32(0.0))


def encode_state(state: dict[str, np.ndarray], layout: Layout, k: int,
                 dictionary: dict[str, np.ndarray] | None = None,
                 iterations: int = 10) -> tuple[dict[str, np.ndarray], dict[str, EncodedLayer]]:
    """The message arrays of ``state`` and the WCP encoding of each clustered layer.

    ``dictionary`` (layer -> full centroid table) warm-starts the clustering.
    """
    message: dict[str, np.ndarray] = {}
    encoded: dict[str, EncodedLayer] = {}
    for name, kind in layout.kinds.items():
        if kind == "local":
            continue
        if kind == "raw":
            message[name] = np.asarray(state[name], dtype=np.float32)
            continue
        layer = wcp_encode(state[name], k, init=None if dictionary is None else dictionary.get(name), iterations=iterations)
        encoded[name] = layer
        message[name + CENTROIDS] = np.delete(layer.centroids, layer.zero_index)
        message[name + INDICES] = np.frombuffer(pack_indices(layer.indices, index_bits(k)), dtype=np.uint8).copy()
    return message, encoded


def decode_message(message: dict[str, np.ndarray], layout: Layout) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(dense entries, centroid tables)`` of a message; entries the sender keeps local are absent."""
    dense: dict[str, np.ndarray] = {}
    tables: dict[str, np.ndarray] = {}
    for name, kind in layout.kinds.items():
        if kind == "raw":
            dense[name] = np.asarray(message[name], dtype=np.float32).reshape(layout.shapes[name])
        elif kind == "clustered":
            table = with_zero(message[name + CENTROIDS])
            count = int(np.prod(layout.shapes[name]))
            indices = unpack_indices(message[name + INDICES].tobytes(), count, index_bits(table.size))
            if int(indices.max(initial=0)) >= table.size:
                raise ValueError(f"message for {name!r} indexes centroid {int(indices.max())} of a {table.size}-entry table")
            tables[name] = table
            dense[name] = table[indices].reshape(layout.shapes[name])
    return dense, tables


def message_bytes(message: dict[str, np.ndarray]) -> int:
    """Payload bytes of a message's arrays."""
    return int(sum(np.asarray(a).nbytes for a in message.values()))
