"""The PushCen paper's two baselines with no math of their own: Async-DFedAvg and independent local training.

* ``async-dfedavg``: the peer averages its own model with every neighbour model that arrived, with
  equal weights, trains, and sends the whole model to every out-neighbour (full models on the wire).
* ``independent``: local training only, nothing sent (the floor every method must beat).
"""

from __future__ import annotations

import numpy as np

from asyncfl.decentralized.method import GossipEvent, GossipMethod, Outgoing, train_own


class AsyncDFedAvg(GossipMethod):
    """Async-DFedAvg: the mean of the own and the arrived models, trained, sent whole."""

    run_config_name = "async-dfedavg"

    def event(self, event: GossipEvent) -> Outgoing:
        peer, layout = event.peer, event.layout
        for name in event.shared if event.received else ():
            stack = [peer.state[name]] + [r.message[name].reshape(layout.shapes[name]) for r in event.received]
            peer.state[name] = np.mean(np.stack(stack), axis=0).astype(peer.state[name].dtype)
        loss = train_own(event)
        return Outgoing(loss, push={n: peer.state[n].astype(np.float32) for n in event.shared})


class Independent(GossipMethod):
    """Local training only: nothing arrives that is used, nothing goes out."""

    run_config_name = "independent"

    def event(self, event: GossipEvent) -> Outgoing:
        return Outgoing(train_own(event))
