"""DivShare (Biswas et al., 2025, "Boosting asynchronous decentralized learning with model fragmentation").

A sender cuts its model into as many fragments as it has out-neighbours (a
seeded random partition of the coordinates, redrawn every push) and sends a
different fragment to each, so one push costs about one model in total instead
of one model per neighbour. A receiver averages, coordinate by coordinate, its
own value with every received value of that coordinate. A fragment carries its
values plus ``(seed, fragment id, fragments)``, from which the receiver
regenerates the coordinate indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from asyncfl import protocol
from asyncfl.decentralized.method import GossipEvent, GossipMethod, Outgoing, root_mean_square, train_own
from asyncfl.errors import ConfigError


def fragment_indices(size: int, fragments: int, seed: int) -> list[np.ndarray]:
    """The seeded partition of ``range(size)`` into ``fragments`` near-equal index sets."""
    if fragments < 1:
        raise ConfigError(f"need at least one fragment, got {fragments}")
    return np.array_split(np.random.default_rng([seed, 17]).permutation(size), fragments)


@dataclass(frozen=True)
class Fragment:
    """One fragment on the wire."""

    values: np.ndarray
    seed: int
    index: int
    fragments: int


def split_model(flat: np.ndarray, fragments: int, seed: int) -> list[Fragment]:
    """``flat`` cut into ``fragments`` fragments."""
    return [Fragment(flat[ix].astype(np.float32), seed, i, fragments)
            for i, ix in enumerate(fragment_indices(flat.size, fragments, seed))]


def merge_fragments(own: np.ndarray, received: list[Fragment]) -> np.ndarray:
    """Per coordinate, the mean of the own value and every received value of it."""
    sums = own.astype(np.float64).copy()
    counts = np.ones(own.size)
    for fragment in received:
        index = fragment_indices(own.size, fragment.fragments, fragment.seed)[fragment.index]
        if index.size != fragment.values.size:
            raise ValueError(f"fragment {fragment.index} has {fragment.values.size} values, its index set {index.size}")
        sums[index] += fragment.values
        counts[index] += 1
    return (sums / counts).astype(own.dtype)


class DivShare(GossipMethod):
    """DivShare: average in the fragments that arrived, train, and send out-neighbour ``j`` fragment ``j mod F``
    of the trained model (``F``: the relay's ``fragments``, out-degree / the copies of each)."""

    run_config_name = "divshare"

    def event(self, event: GossipEvent) -> Outgoing:
        peer, shared, layout = event.peer, event.shared, event.layout
        if event.received:
            flat = np.concatenate([peer.state[n].reshape(-1).astype(np.float32) for n in shared])
            merged = merge_fragments(flat, [Fragment(r.message["values"], *(int(v) for v in r.message["fragment"]))
                                            for r in event.received])
            offset = 0
            for name in shared:
                size = int(np.prod(layout.shapes[name]))
                peer.state[name] = merged[offset : offset + size].reshape(layout.shapes[name]).astype(peer.state[name].dtype)
                offset += size
        loss = train_own(event)
        out_degree = int(event.request["out-degree"])
        if out_degree <= 0:
            return Outgoing(loss)
        flat = np.concatenate([peer.state[n].reshape(-1).astype(np.float32) for n in shared])
        seed = int(event.request[protocol.JOB_SEED]) % (2**31)
        parts = [{"values": f.values, "fragment": np.array([f.seed, f.index, f.fragments], dtype=np.int64)}
                 for f in split_model(flat, int(event.request["fragments"]), seed)]
        # out-neighbour j gets fragment j mod the count: each fragment reaches out-degree / count of them
        return Outgoing(loss, fragments=[parts[j % len(parts)] for j in range(out_degree)])

    def message_schema(self, layout, shared, settings) -> dict[str, tuple]:
        """A fragment: its values (float32, 1-D, at most the whole model's) and ``(seed, fragment id, fragments)``
        (int64)."""
        size = sum(math.prod(layout.shapes[name]) for name in shared)
        return {"values": (np.dtype(np.float32), size), "fragment": (np.dtype(np.int64), (3,))}

    def distance(self, message, own, layout, shared) -> float:
        """Over the fragment's coordinates (its index set, drawn as the merge draws it; the size was checked)."""
        flat = np.concatenate([own[name].reshape(-1) for name in shared])
        seed, index, fragments = (int(v) for v in message["fragment"])
        coordinates = fragment_indices(flat.size, fragments, seed)[index]
        return root_mean_square([message["values"].astype(np.float64) - flat[coordinates]])

    def refusal(self, message, layout, shared, settings) -> str | None:
        """A fragment whose ``(seed, id, count)`` no sender makes (a seed outside ``[0, 2**31)``, more fragments than
        ``gossip.out-degree``, an id past the count) or whose values are not its index set's size: checked before
        any index set is drawn, so a count of 10**9 costs nothing."""
        seed, index, fragments = (int(v) for v in message["fragment"])
        if not 0 <= seed < 2**31 or not 1 <= fragments <= max(1, settings.out_degree) or not 0 <= index < fragments:
            return "fragment"
        size = sum(math.prod(layout.shapes[name]) for name in shared)
        if message["values"].size != size // fragments + (1 if index < size % fragments else 0):
            return "fragment"
        return None
