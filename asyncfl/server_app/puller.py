"""Non-blocking reply pulls for deployments: one stuck reply must not stall the engine.

Flower's ``Grid.pull_messages`` returns a reply only once all its objects
(the arrays) are downloaded; when a SuperNode dies while uploading a reply,
the pull keeps retrying until the SuperLink's object-push session expires
(``OBJECT_PUSH_SESSION_TTL_SECONDS`` = 180 s in Flower 1.41 and 1.42) and only then
yields an error message. A batch pull that contains that reply blocks every
other reply with it until the session expires (measured on loopback with a
killed SuperNode: docs/deployment.md).

So in wall-clock runs each in-flight message is pulled on its own, by a small
pool of daemon threads. A stuck pull occupies one worker; the others keep
delivering. Daemon threads let the ServerApp exit without waiting for a stuck
pull; a thread with nothing to pull for ``idle_s`` ends (a poll starts threads again),
so a puller left behind by a finished run holds none for long.

How often: a message is pulled again after ``age / 8`` seconds, kept between
``min_interval`` and ``max_interval``: young jobs (sub-second ones in tests and
simulations of fast clients) are seen quickly, and a reply waits at most about
an eighth of its own round trip (capped at 1 s) to be noticed. Every pull is an
HTTP request that costs the SuperLink and the ServerApp CPU the ClientApps on
the same cores then lack (a fixed short interval cost far more CPU than Flower's
own loop on a loopback deployment, docs/deployment.md). The later notice costs the next job nothing as long
as it stays under Flower 1.41 and 1.42's SuperNode idle sleep (3 s between pulls when it
has no message), which it is.

When the caller says which client a message went to, the puller also learns when
that client's replies become ready: a reply found by a pull was not there when the
last pull that missed it started, so that moment (seconds after the message was first
seen) is a lower bound on the client's time to reply. The client's next message is
pulled at that moment, then again after ``fine`` seconds (the engine's poll beat:
waits count from the poll that asks), the wait between pulls set to a quarter of the
time since that moment once that is longer, and never longer than the age rule's. A
client whose jobs take about as long each time is noticed within about ``fine``
seconds, not up to an eighth of its job later. This adds at most about 12 pulls per
message, whatever the client's timing (a reply that comes early is found by the
pull at the learned moment and lowers the bound; one that comes late is met by waits
that grow back to the age rule's), and it moves only pulls of that client's own
messages. Error replies (an expired upload) teach nothing.
"""

from __future__ import annotations

import queue
import threading
import time

from flwr.app import Message


def _is_error(reply) -> bool:
    """Whether a pulled reply is an error message (Flower's, e.g. an expired upload): it says nothing of timing."""
    has_error = getattr(reply, "has_error", None)
    return bool(has_error()) if callable(has_error) else False


class ThreadedPuller:
    """Pull replies message by message in background threads.

    Parameters
    ----------
    grid : GridLike
        Anything with ``pull_messages(message_ids)``.
    workers : int
        Concurrent pulls.
    min_interval, max_interval : float
        Bounds in seconds on the wait between two pull attempts of the same message (``max_interval`` None:
        :attr:`MAX_INTERVAL`).
    age_fraction : float
        That wait is this fraction of the time since the message was first polled.
    fine : float
        Seconds between pulls at a client's learned time to reply (see the module's docstring; None:
        :attr:`FINE`); 0 learns nothing.
    clock : callable
        Seconds, monotonic (a fake one in tests).
    idle_s : float
        A thread that got no message to pull for this long ends (None: :attr:`IDLE_S`).
    """

    IDLE_S = 30.0
    MAX_INTERVAL = 1.0  # the default cap; class attributes, so that a benchmark's ablation can set them
    FINE = 0.05  # the default spacing at a client's learned time to reply; 0 learns nothing

    def __init__(self, grid, workers: int = 8, min_interval: float = 0.2, max_interval: float | None = None,
                 age_fraction: float = 0.125, fine: float | None = None, clock=time.monotonic,
                 idle_s: float | None = None) -> None:
        self.grid = grid
        self.min_interval, self.age_fraction = min_interval, age_fraction
        self.max_interval = type(self).MAX_INTERVAL if max_interval is None else max_interval
        self.fine = type(self).FINE if fine is None else fine
        self.clock = clock
        self._requests: queue.Queue[str] = queue.Queue()
        self._replies: queue.Queue[Message] = queue.Queue()
        self._pending: set[str] = set()  # queued or being pulled
        self._delivered: set[str] = set()  # a pull returned its reply: the SuperLink deleted it, never pull it again
        self._last_try: dict[str, float] = {}  # when a poll last asked for the message
        self._first_seen: dict[str, float] = {}
        self._last_miss: dict[str, float] = {}  # when the latest pull that found nothing started
        self._source: dict[str, object] = {}  # message id -> the client it went to, where the caller said
        self.ready_after: dict[object, float] = {}  # client -> seconds from first sight to its reply, a lower bound
        self._lock = threading.Lock()
        self.errors = 0
        self.pulls = 0
        self.miss_gap = (0.0, 0)  # seconds from the last miss to the finding pull, summed; replies found after a miss
        self.workers, self.idle_s = workers, type(self).IDLE_S if idle_s is None else idle_s
        self.threads = 0  # running: waiting for a message, pulling one, or held in a pull (at most ``workers``)
        self._idle = 0  # threads waiting for a message (or started and not yet waiting)
        self._queued = 0  # requests no thread has taken (counted when the taker has)

    def interval(self, age: float) -> float:
        """Seconds between two pulls of a message first polled ``age`` seconds ago."""
        return min(self.max_interval, max(self.min_interval, self.age_fraction * age))

    def wait_after(self, age: float, due: float | None) -> float:
        """Seconds between two pulls of a message ``age`` seconds old whose reply is expected ``due`` seconds
        after first sight (``None``: not known); the wait may end at ``due`` itself, see :meth:`_asks`."""
        wait = self.interval(age)
        if due is not None and age >= due:
            wait = min(wait, max(self.fine, (age - due) / 4))
        return wait

    def _asks(self, message_id: str, now: float) -> bool:
        """Whether a poll at ``now`` pulls ``message_id`` (neither queued nor delivered)."""
        last = self._last_try.get(message_id)
        if last is None:
            return True
        first = self._first_seen[message_id]
        source = self._source.get(message_id)
        due = self.ready_after.get(source) if source is not None else None
        if due is not None and last < first + due <= now:  # the first pull at the expected moment
            return True
        return now - last >= self.wait_after(now - first, due)

    def _work(self) -> None:
        """A thread (counted idle from its start): pull what is queued; end once nothing came for ``idle_s``."""
        counted_out = False
        try:
            while True:
                try:
                    message_id = self._requests.get(timeout=self.idle_s)
                except queue.Empty:
                    message_id = None
                with self._lock:  # a poll queues and counts threads under this lock: no request is left unserved
                    if message_id is None and self._requests.empty():
                        self.threads, self._idle, counted_out = self.threads - 1, self._idle - 1, True
                        return
                    if message_id is not None:
                        self._idle, self._queued = self._idle - 1, self._queued - 1
                if message_id is not None:
                    self._pull(message_id)
                    with self._lock:
                        self._idle += 1
        finally:
            if not counted_out:  # an error in a pull of the thread's own: its place is free for a new one
                with self._lock:
                    self.threads -= 1

    def _pull(self, message_id: str) -> None:
        """Pull one message's reply and hand it on (a failed pull is retried on a later poll)."""
        started = self.clock()
        replies, failed = [], False
        try:
            replies = list(self.grid.pull_messages([message_id]))
        except Exception:  # a failed pull is retried on a later poll; it says nothing of when the reply is ready
            failed = True
        with self._lock:  # counted before the reply is handed on, so a run's last summary sees this pull
            self._pending.discard(message_id)
            self.pulls += 1
            self.errors += failed
            if message_id not in self._first_seen:  # forgotten while this pull ran: its job is over
                return
            if replies:
                self._delivered.add(message_id)
                if not any(_is_error(reply) for reply in replies):
                    self._learn(message_id, started)
            elif not failed:
                self._last_miss[message_id] = started
        for reply in replies:
            self._replies.put(reply)

    def _learn(self, message_id: str, found_at: float) -> None:
        """A reply was found at ``found_at``: count how late it may have been seen, and learn that its client's
        replies take at least until the last pull that missed this one."""
        miss = self._last_miss.get(message_id)
        if miss is not None:
            self.miss_gap = (self.miss_gap[0] + found_at - miss, self.miss_gap[1] + 1)
        source = self._source.get(message_id)
        if source is None or self.fine <= 0:
            return
        if miss is None:  # found at the first pull: no lower bound, nothing to plan by
            self.ready_after.pop(source, None)
        else:
            self.ready_after[source] = miss - self._first_seen[message_id]

    def poll(self, waiting: list[str], sources: dict[str, object] | None = None) -> list[Message]:
        """Ask for ``waiting`` messages not asked for recently; return the replies pulled so far.

        ``sources`` maps a message id to the client it went to, so that pulls follow that client's timing.
        """
        now = self.clock()
        with self._lock:
            for message_id in waiting:
                self._first_seen.setdefault(message_id, now)
                if sources is not None and message_id in sources:
                    self._source[message_id] = sources[message_id]
                if message_id in self._pending or message_id in self._delivered:
                    continue
                if not self._asks(message_id, now):
                    continue
                self._last_try[message_id] = now  # waits count from the poll that asks, the engine's own beat
                self._pending.add(message_id)
                self._requests.put(message_id)
                self._queued += 1
            # a thread for each request no idle one waits for (a request queued earlier too: one whose thread was
            # taken by a pull that hangs)
            while self.threads < self.workers and self._queued > self._idle:
                self.threads, self._idle = self.threads + 1, self._idle + 1
                try:
                    threading.Thread(target=self._work, daemon=True).start()
                except RuntimeError:  # no more threads to be had: the running ones serve the queue
                    self.threads, self._idle = self.threads - 1, self._idle - 1
                    break
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
            self._first_seen.pop(message_id, None)
            self._last_miss.pop(message_id, None)
            self._source.pop(message_id, None)
            self._delivered.discard(message_id)
