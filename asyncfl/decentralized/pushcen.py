"""PushCen-ADFL's compute event: push-sum merge, centroid-anchored masked training, a WCP message.

The steps are :func:`asyncfl.decentralized.peer.compute_event` (Algorithm 1 of the PushCen paper);
this module names the method for the run-config and hands it the event.
"""

from __future__ import annotations

import math

import numpy as np

from asyncfl.decentralized.codec import CENTROIDS, INDICES, decode_message
from asyncfl.decentralized.method import GossipEvent, GossipMethod, Outgoing, root_mean_square
from asyncfl.decentralized.peer import PeerConfig, compute_event
from asyncfl.decentralized.wcp import index_bits


class PushCen(GossipMethod):
    """PushCen-ADFL: merge by push-sum, train anchored to the centroids, push a WCP-coded message."""

    run_config_name = "pushcen"

    def event(self, event: GossipEvent) -> Outgoing:
        settings = event.settings
        config = PeerConfig(k=settings.k, lam=settings.lam, out_degree=int(event.request["out-degree"]),
                            penalty=settings.penalty)
        push, _, loss = compute_event(event.peer, event.model, event.layout, config, event.received,
                                          event.x_train, event.y_train,
                                          absorbed_mass=float(event.request["absorbed-mass"]), **event.training)
        return Outgoing(loss, push=push)

    def message_schema(self, layout, shared, settings) -> dict[str, tuple]:
        """Biases as float32 in their shapes; each clustered layer as its k - 1 non-zero centroids (float32) and its
        indices bit-packed at ``ceil(log2 k)`` bits (uint8 bytes) (:mod:`asyncfl.decentralized.codec`)."""
        schema = {}
        for name, kind in layout.kinds.items():
            if kind == "raw":
                schema[name] = (np.dtype(np.float32), tuple(layout.shapes[name]))
            elif kind == "clustered":
                count = math.prod(layout.shapes[name])
                schema[name + CENTROIDS] = (np.dtype(np.float32), (settings.k - 1,))
                schema[name + INDICES] = (np.dtype(np.uint8), (math.ceil(count * index_bits(settings.k) / 8),))
        return schema

    def distance(self, message, own, layout, shared) -> float:
        """Over the decoded model (each index's centroid), not the centroid table: few large centroids can fill
        a whole layer."""
        dense, _ = decode_message(message, layout)
        return root_mean_square([value.astype(np.float64) - own[name] for name, value in dense.items()])

    def refusal(self, message, layout, shared, settings) -> str | None:
        """Centroids not in ascending order or holding 0 (SortRemap's table, the zero entry implied), or an index
        past the table."""
        for name, kind in layout.kinds.items():
            if kind == "clustered":
                centroids = message[name + CENTROIDS]
                if (np.diff(centroids) < 0).any() or (centroids == 0).any():
                    return "centroids"
        try:
            decode_message(message, layout)
        except ValueError:
            return "indices"
        return None
