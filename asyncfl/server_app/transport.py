"""Grid plumbing shared by the engine, the launcher and the gossip relay: waiting for nodes and for a reply, and
riding out a SuperLink outage (:class:`Link`).

Every wait polls the Grid at a pace that leaves the producer its CPU
(:class:`~asyncfl.server_app.pacing.PollPacer`: Flower's simulation runtime shares
its link state with the ServerApp under one lock).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections import OrderedDict, deque
from contextlib import contextmanager
from typing import Callable

from flwr.app import Error, Message, Metadata
from flwr.app.message import make_message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE
from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectPushError, ObjectUnavailableError

from asyncfl.errors import ConfigError, RunFailed
from asyncfl.server_app.codec import UNDECODABLE_REPLY
from asyncfl.server_app.pacing import PollPacer

log = logging.getLogger("asyncfl.engine")

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


# ------------------------------------------------------------------------------------------------ outages
#: A SuperLink that cannot be reached for longer than this many timeouts ends the run ("superlink unreachable").
OUTAGE_JOB_TIMEOUTS = 3
#: Seconds between two tries of a Grid call while the SuperLink cannot be reached: the first wait, doubling up to
#: the longest (never more than an eighth of the outage limit, so the run ends within 1/8 of it).
RETRY_FIRST_S, RETRY_MAX_S = 0.2, 10.0
#: HTTP statuses a gateway or a starting server answers while the SuperLink is away (Flower's own Grid retries them).
GATEWAY_STATUSES = (502, 503, 504)
#: Flower's error codes for a message or reply the SuperLink does not have (a restart loses what it held in memory;
#: a message past its TTL) and for a node that missed its heartbeats.
UNAVAILABLE_CODES = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE)


#: Messages out whose node a :class:`Link` remembers (the oldest forgotten first: a lost message never comes back).
REMEMBERED_MESSAGES = 100_000


#: Flower's errors for a message whose objects the SuperLink no longer has or would not take (a push session or
#: objects lost in a restart): the message is lost, the run goes on.
OBJECT_ERRORS = (ObjectPushError, ObjectPullError, ObjectUnavailableError)


class SuperLinkUnreachable(RunFailed):
    """The SuperLink could not be reached for longer than the outage limit (:data:`OUTAGE_JOB_TIMEOUTS` x
    ``timeout``)."""


def outage_limit(timeout: float) -> float:
    """Seconds a run waits for an unreachable SuperLink before it ends: :data:`OUTAGE_JOB_TIMEOUTS` x ``timeout``
    (a timeout of ``inf`` waits for ever, as Flower's own Grid does)."""
    return OUTAGE_JOB_TIMEOUTS * timeout


def on_superlink(grid) -> bool:
    """Whether ``grid`` (or the Grid in its :class:`Link`) is Flower's deployment Grid, whose nodes are SuperNodes
    other people may run (Flower's simulation runtime and asyncfl's in-process grids are not)."""
    http_grid = getattr(sys.modules.get("flwr.superlink.grid.http_grid"), "HttpGrid", None)  # loaded where it runs
    return http_grid is not None and isinstance(getattr(grid, "inner", grid), http_grid)


def is_transport_error(exc: BaseException) -> bool:
    """Whether a Grid call failed in transport (an HTTP status, a gRPC error: the request was not served), rather
    than while decoding what it got."""
    httpx, grpc = sys.modules.get("httpx"), sys.modules.get("grpc")
    return (httpx is not None and isinstance(exc, httpx.HTTPError)
            or grpc is not None and isinstance(exc, grpc.RpcError))


def is_unreachable(exc: BaseException) -> bool:
    """Whether a Grid call failed because the SuperLink cannot be reached now (connection refused or reset, a
    timeout, a gateway's 502/503/504; httpx as Flower 1.42's Grid uses, gRPC as earlier ones did), rather than
    because it refused the request."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    httpx, grpc = sys.modules.get("httpx"), sys.modules.get("grpc")  # an error of a library never loaded is none
    if httpx is not None:
        if isinstance(exc, (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)):
            return True
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code in GATEWAY_STATUSES
    if grpc is not None and isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return False


def unavailable_reply(message_id: str, reason: str, code: int = ErrorCode.MESSAGE_UNAVAILABLE) -> Message:
    """The error reply Flower's Grid gives for a reply that cannot be had (code ``MESSAGE_UNAVAILABLE``)."""
    metadata = Metadata(run_id=0, message_id="", src_node_id=SUPERLINK_NODE_ID, dst_node_id=SUPERLINK_NODE_ID,
                        reply_to_message_id=message_id, group_id="", created_at=time.time(), ttl=0,
                        message_type=SYSTEM_MESSAGE_TYPE)
    return make_message(metadata=metadata, error=Error(code=code, reason=reason))


def undecodable_reply(message_id: str, exc: BaseException) -> Message:
    """An error reply in place of a reply Flower's Grid could not decode (its objects are a node's bytes: the
    SuperLink checks their hashes, not their contents); the reply path counts it ``undecodable``."""
    said = " ".join(str(exc).split())[:200]  # one line: the journal keeps an error's last line
    return unavailable_reply(message_id, f"{UNDECODABLE_REPLY}: {type(exc).__name__}: {said}", ErrorCode.UNKNOWN)


class Link:
    """The Grid as a run uses it: a call that finds the SuperLink unreachable waits and tries again.

    During an outage every Grid call (``get_node_ids``, ``push_messages``, ``pull_messages``) waits, backing off
    from :data:`RETRY_FIRST_S` to :data:`RETRY_MAX_S`, and tries again; all waiting calls try again as soon as one
    gets through. The outages are counted (how many, seconds, failed tries) and kept as spans, so that a job out
    during one is known not to have failed by its client's doing (:meth:`down_during`) and its timeout does not
    run while the SuperLink is away (:meth:`down_seconds_since`). An outage longer than ``limit`` seconds raises
    :class:`SuperLinkUnreachable` from every call until :meth:`end`, after which calls answer as a SuperLink with
    nothing: no node, no message taken, every reply asked for unavailable (so a run can write its last row and
    close its federated evaluation without it).

    A pull that raises on a reply Flower's Grid could not decode (its objects are a node's bytes: the SuperLink checks
    their hashes, not their contents) costs replies, never the run: the SuperLink hands a pull's replies over before
    the Grid decodes them, so those pulled with it are gone (asked again, Flower's "unavailable" errors; counted
    as ``failed_pulls`` and logged), and the nodes whose replies it held become suspects for that type of message
    (train, evaluate, query), their messages of that type pulled one at a time (:meth:`_pull_alone`) until a reply
    of their own decodes, for good after a second such pull; one whose own pull raises comes back as an
    :func:`undecodable_reply` (the reply path counts it ``undecodable``). A node that keeps sending such replies
    costs the others' replies at most twice per message type, then only its own.

    Flower 1.42's own Grid (``HttpGrid``) retries a connection error inside the call, without end: its calls
    then block rather than raise. :meth:`watching` hooks into its retries (the Grid's ``RetryInvoker``), so the
    outage is counted and limited there too.

    Parameters
    ----------
    grid : GridLike
        Flower's Grid, or anything with its three calls; every other attribute is the Grid's.
    limit : float
        Seconds of outage after which the run ends (:func:`outage_limit`); ``inf``: never.
    """

    def __init__(self, grid, limit: float) -> None:
        if not limit > 0:  # NaN too
            raise ConfigError(f"the SuperLink outage limit is {limit!r} s: it must be > 0 ({OUTAGE_JOB_TIMEOUTS} x "
                              "timeout; a timeout must be a number of seconds > 0)")
        self.inner, self.limit = grid, float(limit)
        self.outages, self.retries, self.outage_seconds = 0, 0, 0.0
        self.spans: deque[tuple[float, float]] = deque(maxlen=256)  # (start, end), time.monotonic(): past outages
        self._longest_wait = max(min(RETRY_MAX_S, self.limit / 8), 1e-3)
        self._lock = threading.Lock()
        self._up = threading.Event()
        self._up.set()
        self._down_since: float | None = None
        self._gave_up: str | None = None
        self._ended = False
        self.refused = False  # the SuperLink refused the run's credentials (HTTP 401), seen in Flower's retries
        # message id -> (its node, its type), for the messages out (oldest first)
        self._node_of: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._nodes_lock = threading.Lock()
        self.suspects: set[tuple[int, str]] = set()  # (node, type) whose messages are pulled one at a time
        self._lost_in: dict[tuple[int, str], int] = {}  # (node, type) -> failed pulls that held its reply
        self.failed_pulls = 0  # pulls that raised on a reply the Grid could not decode

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet
            raise AttributeError(name)
        return getattr(self.inner, name)  # the rest of Flower's Grid (run, get_nodes, ...) as it is

    # ------------------------------------------------------------------ Grid calls
    def get_node_ids(self):
        return self._call(self.inner.get_node_ids, (), lambda: [])

    def push_messages(self, messages):
        messages = list(messages)
        try:
            ids = list(self._call(self.inner.push_messages, (messages,), lambda: []))
        except OBJECT_ERRORS as exc:  # a SuperLink restarted mid-push lost the push session: nothing was taken
            self._lost_objects(exc)
            return []  # the dispatcher counts the jobs push-refused; their clients get new ones
        with self._nodes_lock:  # the wall clock pulls from threads
            self._node_of.update((message_id, (message.metadata.dst_node_id, message.metadata.message_type))
                                 for message_id, message in zip(ids, messages) if message_id)
            while len(self._node_of) > REMEMBERED_MESSAGES:  # the oldest first: a message lost never comes back
                self._node_of.popitem(last=False)
        return ids

    def pull_messages(self, message_ids):
        ids = list(message_ids)
        if self.suspects:  # a suspect's messages one at a time, the others together
            alone = {message_id for message_id in ids if self._node_of.get(message_id) in self.suspects}
            if alone:
                others = [message_id for message_id in ids if message_id not in alone]
                return (self.pull_messages(others) if others else []) + self._pull_alone(sorted(alone))
        try:
            replies = self._pull(ids)
        except RunFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - a reply Flower's Grid could not decode: a node's bytes
            if is_transport_error(exc):
                raise
            log.warning("a pull of %d message(s) raised %s (a reply Flower's Grid could not decode): %s", len(ids),
                        type(exc).__name__, "that reply is rejected" if len(ids) == 1 else
                        "the replies it held are lost; their nodes' next replies are pulled one at a time")
            with self._nodes_lock:
                self.failed_pulls += 1
            return self._pull_alone(ids, handed_over=exc)
        with self._nodes_lock:
            for reply in replies:
                self._node_of.pop(reply.metadata.reply_to_message_id, None)
        return replies

    def _pull(self, ids: list[str]) -> list[Message]:
        try:
            return self._call(self.inner.pull_messages, (ids,), lambda: [
                unavailable_reply(message_id, f"the SuperLink could not be reached: {self._gave_up}")
                for message_id in ids])
        except OBJECT_ERRORS as exc:  # a reply whose objects a restarted SuperLink no longer has: lost
            self._lost_objects(exc)
            return [unavailable_reply(message_id, f"{type(exc).__name__}: {exc}") for message_id in ids]

    def _pull_alone(self, ids: list[str], handed_over: Exception | None = None) -> list[Message]:
        """Each of ``ids`` pulled on its own. One whose pull raises is its node's undecodable reply (that node's
        messages of that type are pulled alone for the rest of the run). With ``handed_over`` (what a pull of all of
        ``ids`` raised), one that comes back as the SuperLink's "unavailable" was handed over by that pull: its node
        becomes a suspect, pulled alone until a reply of its own decodes, and for good once a second failed pull
        held one of its replies (a node that alternates undecodable and good replies); a lone id is that reply."""
        replies = []
        for message_id in ids:
            source = self._node_of.get(message_id)
            try:
                own = ([undecodable_reply(message_id, handed_over)] if handed_over is not None and len(ids) == 1
                       else self._pull([message_id]))
            except RunFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - that node's reply, undecodable
                if is_transport_error(exc):
                    raise
                own = [undecodable_reply(message_id, exc)]
            with self._nodes_lock:
                for reply in own:
                    self._node_of.pop(reply.metadata.reply_to_message_id, None)
                    if source is None:
                        continue
                    if reply.metadata.src_node_id != SUPERLINK_NODE_ID:  # a reply of the node's own decoded
                        if self._lost_in.get(source, 0) < 2:
                            self.suspects.discard(source)
                        continue
                    if reply.error.reason.startswith(UNDECODABLE_REPLY):
                        self._lost_in[source] = 2
                    elif handed_over is not None:
                        self._lost_in[source] = self._lost_in.get(source, 0) + 1
                    else:
                        continue
                    self.suspects.add(source)
            replies += own
        return replies

    def _lost_objects(self, exc: BaseException) -> None:
        """A message's objects were lost by the SuperLink (a restart between a message and its objects): counted as
        an outage moment, so that the jobs out then are not their clients' failures."""
        self._failed(exc)
        self._reached(time.monotonic())

    def _call(self, call, args: tuple, nothing):
        wait = min(RETRY_FIRST_S, self._longest_wait)
        while True:
            if self._ended:
                return nothing()
            if self._gave_up is not None:
                self._raise_if_given_up()
            started = time.monotonic()
            try:
                result = call(*args)
            except Exception as exc:
                if self._ended:
                    return nothing()
                if not is_unreachable(exc):
                    raise
                self._failed(exc)
                self._up.wait(wait)  # a call that gets through meanwhile wakes every waiting one
                wait = min(2 * wait, self._longest_wait)
                continue
            if self._down_since is not None:  # an outage was going on: this call may end it
                self._reached(started)
            return result

    # ------------------------------------------------------------------ outages
    def _failed(self, exc: BaseException) -> None:
        """A try found the SuperLink unreachable: an outage begins (or goes on); past the limit, the run ends."""
        now = time.monotonic()
        with self._lock:
            self.retries += 1
            if self._down_since is None:
                self._down_since = now
                self.outages += 1
                self._up.clear()
                log.warning("the SuperLink cannot be reached (%s: %s): waiting for it, up to %.0fs (%d x timeout); "
                            "jobs out meanwhile are not counted as their clients' failures", type(exc).__name__,
                            str(exc)[:200], self.limit, OUTAGE_JOB_TIMEOUTS)
            down = now - self._down_since
            if down > self.limit and self._gave_up is None:
                self._gave_up = (f"no Grid call got through for {down:.0f}s, longer than the outage limit of "
                                 f"{self.limit:g}s ({OUTAGE_JOB_TIMEOUTS} x timeout); last error: "
                                 f"{type(exc).__name__}: {str(exc)[:200]}")
        self._raise_if_given_up()

    def _reached(self, started: float) -> None:
        """A call that began at ``started`` got through: an outage that began before it is over."""
        now = time.monotonic()
        with self._lock:
            if self._down_since is None or started < self._down_since:
                return  # a call from before the outage says nothing of now
            self.spans.append((self._down_since, now))
            self.outage_seconds += now - self._down_since
            log.info("the SuperLink is reachable again after %.1fs (%d failed tries so far); jobs it lost are sent "
                     "again", now - self._down_since, self.retries)
            self._down_since = None
            self._up.set()

    def _raise_if_given_up(self) -> None:
        if self._gave_up is not None and not self._ended:
            raise SuperLinkUnreachable(self._gave_up)

    def down_during(self, since: float) -> bool:
        """Whether the SuperLink was unreachable at some moment from ``since`` (``time.monotonic()``) to now."""
        with self._lock:
            return self._down_since is not None or any(end >= since for _, end in self.spans)

    def down_seconds_since(self, since: float) -> float:
        """Seconds the SuperLink was unreachable from ``since`` (``time.monotonic()``) to now."""
        with self._lock:
            total = sum(end - max(start, since) for start, end in self.spans if end > since)
            if self._down_since is not None:
                total += time.monotonic() - max(self._down_since, since)
        return total

    def recovery_wait(self) -> float:
        """Seconds left of the outage limit since the last outage ended (0 long after one, or with none): how
        long nodes may take to come back to a restarted SuperLink."""
        with self._lock:
            if self._down_since is not None or not self.spans or math.isinf(self.limit):
                return 0.0
            return max(0.0, self.spans[-1][1] + self.limit - time.monotonic())

    def outage_note(self) -> str:
        """For the stop reason of a run ended by a signal during an outage or soon after one (within the outage
        limit): Flower 1.42's SuperLink fails a ServerApp task that sent no heartbeat for 60 s (2 x 30 s), then
        refuses its token, and Flower stops the process itself (SIGINT); "" otherwise."""
        refused = ("; the SuperLink refused the run's task token (HTTP 401), on which Flower stops the ServerApp: it "
                   "fails a task that sent it no heartbeat for 60s" if self.refused else "")
        with self._lock:
            now = time.monotonic()
            if self._down_since is not None:
                return f"; during a SuperLink outage ({now - self._down_since:.0f}s so far){refused}"
            if not self.spans or now - self.spans[-1][1] > (self.limit if math.isfinite(self.limit) else 600.0):
                return refused
            start, end = self.spans[-1]
        return f"; {now - end:.0f}s after a SuperLink outage of {end - start:.0f}s{refused}"

    def end(self) -> None:
        """The run is over: calls answer at once as a SuperLink with nothing (and no longer raise)."""
        self._ended = True
        self._up.set()

    def summary(self) -> dict:
        """``summary.json``'s outage figures (an outage still going on counts up to now)."""
        with self._lock:
            seconds = self.outage_seconds + (time.monotonic() - self._down_since if self._down_since is not None
                                             else 0.0)
            return {"superlink-outages": self.outages, "superlink-outage-seconds": round(seconds, 3),
                    "superlink-failed-tries": self.retries, "undecodable-pulls": self.failed_pulls}

    @contextmanager
    def watching(self):
        """While the block runs, learn of the retries Flower's own Grid makes inside a call (its ``RetryInvoker``:
        ``on_backoff`` after a failed try, ``on_success``), so an outage it waits out is counted, and limited,
        here too; the Grid's own hooks still run first. ``should_giveup`` is watched for a 401 (the SuperLink no
        longer accepts the run's task, on which Flower 1.42 stops the process: :meth:`outage_note` says so). A
        Grid without one is used as it is."""
        invoker = getattr(self.inner, "_retry_invoker", None)
        if invoker is None or not all(hasattr(invoker, hook) for hook in ("on_backoff", "on_success", "should_giveup")):
            yield self
            return
        backoff, success, giveup = invoker.on_backoff, invoker.on_success, invoker.should_giveup

        def should_giveup(exc: Exception) -> bool:  # Flower stops its own process on a 401, inside this call
            response = getattr(exc, "response", None)
            if getattr(response, "status_code", None) == 401:
                self.refused = True
            return giveup(exc) if giveup is not None else False

        def on_backoff(state) -> None:
            if backoff is not None:
                backoff(state)
            if self._ended:
                raise SuperLinkUnreachable("the run is over")  # ends the Grid's retries; the call answers nothing
            if state.exception is not None and is_unreachable(state.exception):
                self._failed(state.exception)

        def on_success(state) -> None:
            if success is not None:
                success(state)
            if state.tries > 1:  # this call failed, then got through: the SuperLink is back (a first try that
                self._reached(time.monotonic())  # began before an outage says nothing; the Link's own call tells)

        invoker.on_backoff, invoker.on_success, invoker.should_giveup = on_backoff, on_success, should_giveup
        try:
            yield self
        finally:
            invoker.on_backoff, invoker.on_success, invoker.should_giveup = backoff, success, giveup


def guarded(grid, timeout: float) -> Link:
    """``grid`` as a :class:`Link` (itself if it is one), its outage limit :func:`outage_limit` of ``timeout``."""
    return grid if isinstance(grid, Link) else Link(grid, outage_limit(timeout))
