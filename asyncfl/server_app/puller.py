"""Non-blocking reply pulls for deployments: one stuck reply must not stall the engine.

Flower's ``Grid.pull_messages`` returns a reply only once all its objects
(the arrays) are downloaded; when a SuperNode dies while uploading a reply,
the pull keeps retrying until the SuperLink's object-push session expires
(``OBJECT_PUSH_SESSION_TTL_SECONDS`` = 180 s in Flower 1.41) and only then
yields an error message. A batch pull that contains that reply blocks every
other reply with it; measured on loopback: a killed SuperNode stalled the
engine for ~3 minutes.

So in wall-clock runs each in-flight message is pulled on its own, by a small
pool of daemon threads, at most every ``min_interval`` seconds per message. A
stuck pull occupies one worker; the others keep delivering. Daemon threads
let the ServerApp exit without waiting for a stuck pull.
"""

from __future__ import annotations

import queue
import threading
import time

from flwr.app import Message


class ThreadedPuller:
    """Pull replies message by message in background threads.

    Parameters
    ----------
    grid : GridLike
        Anything with ``pull_messages(message_ids)``.
    workers : int
        Concurrent pulls.
    min_interval : float
        Seconds between two pull attempts of the same message.
    """

    def __init__(self, grid, workers: int = 8, min_interval: float = 0.2) -> None:
        self.grid = grid
        self.min_interval = min_interval
        self._requests: queue.Queue[str] = queue.Queue()
        self._replies: queue.Queue[Message] = queue.Queue()
        self._pending: set[str] = set()  # queued or being pulled
        self._last_try: dict[str, float] = {}
        self._lock = threading.Lock()
        self.errors = 0
        for _ in range(workers):
            threading.Thread(target=self._work, daemon=True).start()

    def _work(self) -> None:
        while True:
            message_id = self._requests.get()
            try:
                for reply in self.grid.pull_messages([message_id]):
                    self._replies.put(reply)
            except Exception:  # a failed pull is retried on a later poll
                self.errors += 1
            finally:
                with self._lock:
                    self._pending.discard(message_id)
                    self._last_try[message_id] = time.monotonic()

    def poll(self, waiting: list[str]) -> list[Message]:
        """Ask for ``waiting`` messages not asked for recently; return the replies pulled so far."""
        now = time.monotonic()
        with self._lock:
            for message_id in waiting:
                if message_id in self._pending or now - self._last_try.get(message_id, -1e9) < self.min_interval:
                    continue
                self._pending.add(message_id)
                self._requests.put(message_id)
        replies = []
        while True:
            try:
                replies.append(self._replies.get_nowait())
            except queue.Empty:
                return replies

    def forget(self, message_id: str) -> None:
        """Drop bookkeeping of a message that no longer matters (accepted, lost or abandoned)."""
        with self._lock:
            self._last_try.pop(message_id, None)
