"""Grid plumbing shared by the engine, the launcher and the gossip relay: waiting for nodes and for a reply.

Every wait polls the Grid at a pace that leaves the producer its CPU
(:class:`~asyncfl.server_app.pacing.PollPacer`: Flower's simulation runtime shares
its link state with the ServerApp under one lock).
"""

from __future__ import annotations

import time
from typing import Callable

from flwr.app import Message

from asyncfl.server_app.pacing import PollPacer

#: Seconds between looks at the connected nodes while waiting for more.
NODE_POLL_S = 0.2
#: Seconds the set of connected nodes must stay the same, once one came, for a settling wait to end before
#: ``minimum``: Flower's simulation registers all its nodes at once, and a deployment's SuperNodes started together
#: connect within a second or two of each other.
NODE_SETTLE_S = 2.0


def wait_for_nodes(grid, minimum: int, timeout: float, on_wait: Callable[[int], None] | None = None,
                   settle: float = 0.0) -> list[int]:
    """Connected node ids (sorted) once at least ``minimum`` are there, or what is there after ``timeout``.

    ``on_wait(connected)`` is called once if the wait begins (fewer than ``minimum`` and ``timeout > 0``).
    With ``settle`` > 0 the wait also ends once some node is connected and none joined or left for ``settle``
    seconds (fewer nodes than ``minimum`` then only mean fewer jobs in flight).
    The caller decides what too few means (no node at all, fewer than two gossip peers).
    """
    deadline = time.monotonic() + timeout
    nodes = sorted(grid.get_node_ids())
    if len(nodes) < minimum and timeout > 0 and on_wait is not None:
        on_wait(len(nodes))
    since = time.monotonic()  # when the connected set last changed
    while len(nodes) < minimum and time.monotonic() < deadline:
        if settle > 0 and nodes and time.monotonic() - since >= settle:
            break
        time.sleep(NODE_POLL_S)
        now = sorted(grid.get_node_ids())
        if now != nodes:
            nodes, since = now, time.monotonic()
    return nodes


def wait_for_reply(grid, message_id: str, timeout: float, pacer: PollPacer | None = None) -> Message | None:
    """The reply to ``message_id``, or ``None`` after ``timeout`` seconds (lost)."""
    pacer = pacer or PollPacer()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = time.perf_counter()
        replies = [r for r in grid.pull_messages([message_id]) if r.metadata.reply_to_message_id == message_id]
        if replies:
            pacer.progress()
            return replies[0]
        pacer.wait(time.perf_counter() - started, 0)
    return None
