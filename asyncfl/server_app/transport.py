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


def wait_for_nodes(grid, minimum: int, timeout: float, on_wait: Callable[[int], None] | None = None) -> list[int]:
    """Connected node ids (sorted) once at least ``minimum`` are there, or what is there after ``timeout``.

    ``on_wait(connected)`` is called once if the wait begins (fewer than ``minimum`` and ``timeout > 0``).
    The caller decides what too few means (no node at all, fewer than two gossip peers).
    """
    deadline = time.monotonic() + timeout
    nodes = sorted(grid.get_node_ids())
    if len(nodes) < minimum and timeout > 0 and on_wait is not None:
        on_wait(len(nodes))
    while len(nodes) < minimum and time.monotonic() < deadline:
        time.sleep(NODE_POLL_S)
        nodes = sorted(grid.get_node_ids())
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
