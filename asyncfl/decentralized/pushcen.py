"""PushCen-ADFL's compute event: push-sum merge, centroid-anchored masked training, a WCP message.

The steps are :func:`asyncfl.decentralized.peer.compute_event` (Algorithm 1 of the PushCen paper);
this module names the method for the run-config and hands it the event.
"""

from __future__ import annotations

from asyncfl.decentralized.method import GossipEvent, GossipMethod, Outgoing
from asyncfl.decentralized.peer import PeerConfig, compute_event


class PushCen(GossipMethod):
    """PushCen-ADFL: merge by push-sum, train anchored to the centroids, push a WCP-coded message."""

    run_config_name = "pushcen"

    def event(self, event: GossipEvent) -> Outgoing:
        settings = event.settings
        config = PeerConfig(k=settings.k, lam=settings.lam, out_degree=int(event.request["out-degree"]),
                            penalty=settings.penalty)
        push, share, loss = compute_event(event.peer, event.model, event.layout, config, event.received,
                                          event.x_train, event.y_train,
                                          absorbed_mass=float(event.request["absorbed-mass"]), **event.training)
        return Outgoing(loss, push=push, share=share)
