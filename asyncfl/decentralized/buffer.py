"""The peer's inbox: sender-deduplicated and bounded (PushCen-ADFL paper, Sec. 4.5, Algorithm 5).

A new message from a sender replaces that sender's buffered one; when the
buffer is over capacity the oldest entry is dropped. The paper drops the
replaced or overflowing message outright; that destroys push-sum mass, so here
the mass is kept: a replaced message's mass rides on its replacement, and an
overflowing message's mass is handed back for the receiver to absorb into its
own (the model content of both is dropped, as in the paper). Total mass over
peers, in-flight and buffered messages is then exactly conserved.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from asyncfl.errors import ConfigError


@dataclass
class Buffered:
    """One buffered message: its payload (model, centroid tables, ...) and push-sum mass."""

    payload: Any
    mass: float


class DedupBuffer:
    """At most one (the newest) message per sender, at most ``capacity`` messages.

    Parameters
    ----------
    capacity : int
        Bound on buffered messages (>= 1).
    dedup : bool
        False keeps every message (the "No Buffer" ablation of the paper's Table 4 and the
        authors' code default), still bounded by ``capacity``.
    """

    def __init__(self, capacity: int, dedup: bool = True) -> None:
        if capacity < 1:
            raise ConfigError(f"buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.dedup = dedup
        self._entries: OrderedDict[Any, Buffered] = OrderedDict()
        self._counter = 0
        self.replaced = 0
        self.overflowed = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def mass(self) -> float:
        return sum(entry.mass for entry in self._entries.values())

    def put(self, sender: int, payload: Any, mass: float) -> float:
        """Buffer a message; return the mass of any entry dropped for capacity (for the receiver to absorb)."""
        key: Any = sender
        if self.dedup and sender in self._entries:
            mass += self._entries.pop(sender).mass
            self.replaced += 1
        elif not self.dedup:
            key, self._counter = (sender, self._counter), self._counter + 1
        self._entries[key] = Buffered(payload, mass)
        dropped = 0.0
        while len(self._entries) > self.capacity:
            _, oldest = self._entries.popitem(last=False)
            dropped += oldest.mass
            self.overflowed += 1
        return dropped

    def entries(self) -> list[Buffered]:
        """The buffered entries, oldest first (read-only view)."""
        return list(self._entries.values())

    def drain(self) -> list[tuple[int, Buffered]]:
        """Everything buffered (oldest first) as ``(sender, entry)``; the buffer is empty afterwards."""
        out = [(key if self.dedup else key[0], entry) for key, entry in self._entries.items()]
        self._entries.clear()
        return out
