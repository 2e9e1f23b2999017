"""One PushCen-ADFL peer's compute event (PushCen-ADFL paper, Algorithms 1, 2 and 4).

On activation a peer (1) merges the neighbour messages delivered to it with
push-sum weights, into its model and its centroid dictionary; (2) trains
locally with the centroid proximal term and the pruning mask; (3) re-encodes
its model with WCP (warm-started from the dictionary, which it then replaces);
(4) keeps ``m / (d + 1)`` of its mass and returns the message with the same
share for each of its ``d`` out-neighbours. BatchNorm entries stay local.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from asyncfl.client_app.training import make_optimizer
from asyncfl.decentralized.codec import Layout, decode_message, encode_state
from asyncfl.decentralized.pushsum import push_sum_merge, split_mass
from asyncfl.decentralized.regularizer import enforce_mask_, proximal_penalty
from asyncfl.decentralized.settings import GossipConfig
from asyncfl.decentralized.wcp import nearest_sorted, wcp_encode
from asyncfl.errors import ConfigError


@functools.lru_cache(maxsize=16)
def _check_knobs(k: int, lam: float, penalty: str) -> None:
    """The knobs' own checks, in one place (GossipConfig's); once per value, not at every compute event."""
    GossipConfig(k=k, lam=lam, penalty=penalty)


@dataclass(frozen=True)
class PeerConfig:
    """What one compute event takes of the run's knobs (each declared once, with its default and range, in
    :class:`~asyncfl.decentralized.settings.GossipConfig`) and of the relay's request (this push's out-degree)."""

    k: int = GossipConfig.k
    lam: float = GossipConfig.lam
    out_degree: int = GossipConfig.out_degree
    wcp_iterations: int = 10
    penalty: str = GossipConfig.penalty

    def __post_init__(self) -> None:
        _check_knobs(self.k, self.lam, self.penalty)
        if self.out_degree < 0 or self.wcp_iterations < 1:
            raise ConfigError(f"need an out-degree >= 0 and wcp iterations >= 1, got {self.out_degree} and "
                              f"{self.wcp_iterations}")


@dataclass
class PeerState:
    """What a peer keeps between activations: its full model, push-sum mass and centroid dictionary."""

    state: dict[str, np.ndarray]
    mass: float = 1.0
    dictionary: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    """One buffered neighbour message with its push-sum mass and its sender (the relay's peer index; -1 unknown)."""

    message: dict[str, np.ndarray]
    mass: float
    sender: int = -1


def merge_received(peer: PeerState, received: list[Received], layout: Layout, absorbed_mass: float = 0.0) -> None:
    """Push-sum merge (Eq. 3-5) of ``received`` into ``peer`` in place.

    ``absorbed_mass`` is mass of messages the buffer had to drop (their content
    is lost, their mass stays with this peer so the system total is conserved).
    """
    peer.mass += absorbed_mass
    if not received:
        return
    decoded = [decode_message(r.message, layout) for r in received]
    masses = [r.mass for r in received]
    own_mass = peer.mass
    for name, kind in layout.kinds.items():
        if kind == "local":
            continue
        others = [(dense[name], m) for (dense, _), m in zip(decoded, masses)]
        peer.state[name], _ = push_sum_merge(peer.state[name], own_mass, others)
        if kind == "clustered" and name in peer.dictionary:
            tables = [(tables[name], m) for (_, tables), m in zip(decoded, masses) if tables[name].size == peer.dictionary[name].size]
            peer.dictionary[name], _ = push_sum_merge(peer.dictionary[name], own_mass, tables)
    peer.mass = own_mass + sum(masses)


def train_with_anchor(model: nn.Module, x: np.ndarray, y: np.ndarray, anchors: dict[str, torch.Tensor],
                      keep: dict[str, torch.Tensor], lam: float, steps: int, batch_size: int, lr: float,
                      momentum: float, seed: int, penalty: str = "layer-mean", optimizer: str = "sgd",
                      weight_decay: float = 0.0) -> float:
    """``optimizer`` (the run's: SGD with momentum, or Adam as the PushCen reference code) on
    ``CE + lam * sum over layers of ||w - w_hat||^2`` (each layer's mean or sum, ``penalty``) with pruned
    coordinates held at 0 (Eq. 2); mean loss. A fresh optimizer per compute event, as a client's per job."""
    params = dict(model.named_parameters())
    optimiser = make_optimizer(model, optimizer, lr, momentum, weight_decay)
    generator = torch.Generator().manual_seed(seed)
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    batch_size = min(batch_size, len(x))
    losses = []
    model.train()
    for _ in range(steps):
        index = torch.randint(len(x), (batch_size,), generator=generator)
        loss = nn.functional.cross_entropy(model(inputs[index]), labels[index])
        if lam > 0:
            loss = loss + sum(proximal_penalty(params[n], anchors[n], lam, penalty) for n in anchors)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        for name, mask in keep.items():
            enforce_mask_(params[name].data, mask)
        losses.append(float(loss.detach()))
    return float(np.mean(losses)) if losses else 0.0


def compute_event(peer: PeerState, model: nn.Module, layout: Layout, config: PeerConfig, received: list[Received],
                  x: np.ndarray, y: np.ndarray, *, steps: int, batch_size: int, lr: float, momentum: float, seed: int,
                  absorbed_mass: float = 0.0, optimizer: str = "sgd",
                  weight_decay: float = 0.0) -> tuple[dict[str, np.ndarray], float, float]:
    """Merge, train, re-encode, split mass. Returns ``(message, mass share per message, training loss)``."""
    merge_received(peer, received, layout, absorbed_mass)
    model.load_state_dict({n: torch.from_numpy(np.asarray(v)).reshape(layout.shapes[n]) for n, v in peer.state.items()})
    anchors, keep = {}, {}
    for name in layout.clustered():
        table = peer.dictionary.get(name)
        if table is None or table.size != config.k:  # no dictionary yet: this peer's own clustering
            table = wcp_encode(peer.state[name], config.k, iterations=config.wcp_iterations).centroids
        # assignments against the dictionary itself, so anchor and pruning mask use the same table
        indices = nearest_sorted(peer.state[name].reshape(-1), table)
        anchors[name] = torch.from_numpy(table[indices].reshape(layout.shapes[name]).astype(np.float32))
        keep[name] = torch.from_numpy((table[indices] != 0.0).reshape(layout.shapes[name]))
    loss = train_with_anchor(model, x, y, anchors, keep, config.lam, steps, batch_size, lr, momentum, seed,
                             config.penalty, optimizer, weight_decay)
    peer.state = {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()}
    message, encoded = encode_state(peer.state, layout, config.k, peer.dictionary, config.wcp_iterations)
    peer.dictionary = {name: layer.centroids for name, layer in encoded.items()}
    share = split_mass(peer.mass, config.out_degree)
    peer.mass = share
    return message, share, loss
