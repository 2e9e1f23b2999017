"""The gossip relay: PushCen-ADFL and its decentralized baselines on Flower, with no global model.

Flower has no peer-to-peer links, so the ServerApp relays and schedules; it
never averages models (it checks that a push's arrays are numeric and finite).
Each peer computes back to back on the virtual clock (durations from the delay
model). When a peer's compute event starts, the
relay sends it one message carrying every neighbour message delivered to it
since its last event (the bounded, sender-deduplicated buffer of the PushCen
paper, Sec. 4.5, lives here as transport); the peer merges, trains, encodes
and replies with its outgoing message; at the event's finish
the relay delivers that message to ``out-degree`` random online peers (drawn
afresh at every push, or, with ``gossip.topology = 'fixed'``, the peer's online
members of a seeded static set of ``out-degree`` out-neighbours). Peer
state (model, centroid dictionary) stays in each ClientApp's ``context.state``;
the push-sum mass is the relay's own ledger (each request tells the peer its
mass, and the mass a push carries is computed here, never read from a reply),
so no peer can claim more weight than push-sum gave it; a peer keeps
``mass / (d + 1)`` after every event, whatever it sent, so holding a push back
or failing on purpose gains it nothing (the shares not sent are gone, counted
in ``mass-unsent``). A fraction of the peers joins late, at a seeded time in the
first half of the horizon. Accuracy is each online peer's accuracy on its own
local test split after its latest event, averaged at ``eval-points`` times.

Peers are run by other people: a reply is read as data. A reply whose
metrics are not numbers in range, or whose push holds an array that is not
numeric or not finite, is refused and counted (``rejected-by-reason``), its
content dropped, as is a lost or failed event's; a peer whose events fail
``MAX_FAILED_EVENTS`` times in a row, or that loses ``MAX_LOST_EVENTS`` in all, is
benched (no longer activated or sent to), since each lost event holds the relay
for a whole timeout. A request the SuperLink will not take (too large for what
other peers sent) goes again without its largest message, its mass kept, until it
is taken. What a
receiver refuses of the messages it was sent (its own check against its
model, :func:`asyncfl.decentralized.method.read_message`) it reports, and the relay
sums (``messages-refused-by-peers``).

Events are processed in virtual-time order; a peer's activation is dispatched
as soon as its start is the earliest pending event, so all peers whose events
overlap in virtual time train in parallel.
"""

from __future__ import annotations

import heapq
import logging
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from asyncfl import protocol
from asyncfl.decentralized.buffer import DedupBuffer
from asyncfl.decentralized.settings import GOSSIP_METHODS, GossipConfig
from asyncfl.errors import ConfigError, TooFewPeers
from asyncfl.options import resolve_delays
from asyncfl.server_app.pacing import PollPacer
from asyncfl.server_app.roster import Roster
from asyncfl.server_app.run_folder import append_csv, start_csv, write_json
from asyncfl.server_app.transport import guarded, wait_for_nodes, wait_for_reply
from asyncfl.simulation.presets import delay_sampler

log = logging.getLogger("asyncfl.relay")

PEER_ACTION = "train.gossip"
#: Events in a row that fail (lost, an error reply, or a reply the relay refuses) before a peer is benched; and
#: lost events in all (each holds the serial relay for a whole timeout, so failing now and then is no way around it).
MAX_FAILED_EVENTS = MAX_LOST_EVENTS = 3


@dataclass
class RelayStats:
    events: int = 0
    pushes: int = 0
    deliveries: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    message_bytes: list[int] = field(default_factory=list)
    relay_seconds: float = 0.0  # relay work only: waiting for peers' replies is excluded
    peak_buffered_bytes: int = 0
    refused_by_peers: int = 0  # messages receivers refused, as they report it
    restarts: int = 0  # events in which a peer restarted (its last trained or the initial model), as it reports it
    requests_refused: int = 0  # requests the SuperLink would not take: sent again without their largest message
    mass_unsent: float = 0.0  # push-sum mass of shares a peer did not send (a failed event, no push): gone


@dataclass
class PeerEvent:
    """One peer's event in flight: its request's message id (None: the SuperLink refused it), its out-degree and
    fixed receivers, the messages the request carried, and the mass the peer holds once it has taken them in
    (what the relay keeps for it if the event fails)."""

    message_id: str | None
    out_degree: int
    receivers: list[int] | None
    received: int
    mass: float


def _record_bytes(record: ArrayRecord) -> int:
    return sum(len(array.data) for array in record.values())


def record_refusal(record) -> str | None:
    """Why the relay will not forward a peer's push record, or None: every entry must be an array that decodes,
    of a numeric dtype, with only finite values (what any method's receiver needs; each receiver also checks
    names and shapes against its own model)."""
    if not isinstance(record, ArrayRecord):
        return "not-arrays"
    for array in record.values():
        try:
            values = array.numpy()
        except Exception:  # a lying header, a bad serialisation: Flower's own decoder says which
            return "unreadable-array"
        if values.dtype.kind not in "fiu":
            return "non-numeric-array"
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return "non-finite"
    return None


def metric_number(metrics, key: str) -> float | None:
    """``metrics[key]`` as a float when it is a finite int or float; None when absent or anything else."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range
        return None
    return number if math.isfinite(number) else None


def last_line(reason) -> str:
    """The last non-blank line of an error reply's reason (at most 300 characters), for the log."""
    lines = [line for line in str(reason or "").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "?"


class GossipRelay:
    """Relays peer messages on the virtual clock and records the peers' accuracy.

    Parameters
    ----------
    grid : GridLike
        Flower's Grid.
    method : str
        The gossip method's run-config name (run-config ``strategy``).
    gossip : GossipConfig
        The relay's and the peers' knobs.
    options : RunOptions
        Seed, delay model, node wait, and the horizon (``max-time``).
    timeout : float
        Seconds a peer's event may take (Flower's timeout; run-config ``timeout``).
    train_config : dict
        Local-training keys forwarded to the peers.
    folder : Path
        Where metrics.csv and summary.json go (written as they come).
    check_push : callable, optional
        A push record -> the reason its receivers would refuse it, or None
        (:func:`asyncfl.client_app.gossip.push_check`); a push it refuses is counted against its sender
        (``push-<reason>``) and never forwarded. Without it, pushes are checked only for numeric, finite arrays.
    """

    def __init__(self, grid, method: str, gossip: GossipConfig, options, timeout: float, train_config: dict,
                 folder: Path, check_push=None) -> None:
        self.grid = guarded(grid, timeout)  # a reply Flower's Grid cannot decode costs that reply (transport.Link)
        if method not in GOSSIP_METHODS or not options.max_time > 0:
            raise ConfigError(f"the gossip relay runs a gossip method ({', '.join(GOSSIP_METHODS)}) to a horizon "
                              f"max-time > 0; got {method!r} and max-time={options.max_time}")
        self.method, self.gossip, self.horizon = method, gossip, options.max_time
        self.seed, self.timeout = options.seed, timeout
        self.wait_for_nodes = options.node_wait(timeout)
        self.train_config = dict(train_config)
        self.folder = folder
        self.check_push = check_push
        self.stats = RelayStats()
        self.delays = delay_sampler(resolve_delays(options.clock, options.delay_model)[1], options.seed)
        self.rng = np.random.default_rng([options.seed, 11])
        self.peers: list[int] = []
        self.unidentified = 0
        self.out_neighbours: dict[int, list[int]] = {}  # topology 'fixed' only
        self.join_time: dict[int, float] = {}
        self.delayed: set[int] = set()
        self.buffers: list[DedupBuffer] = []
        self.absorbed: list[float] = []
        self.mass: list[float] = []  # the push-sum ledger: each peer's mass between its events
        self.benched: set[int] = set()
        self._failed_in_a_row: dict[int, int] = {}
        self._lost: dict[int, int] = {}
        self.in_flight: dict[int, PeerEvent] = {}
        self.accuracy: dict[int, float] = {}
        self.best_accuracy: dict[int, float] = {}
        self.rows: list[dict] = []
        self._events: list = []
        self._seq = 0
        self._event_count: dict[int, int] = {}
        self._wall_start = time.monotonic()
        self._pacer = PollPacer()

    # ----------------------------------------------------------------- setup
    def discover(self) -> None:
        nodes = wait_for_nodes(self.grid, 2, self.wait_for_nodes)
        if len(nodes) < 2:
            raise TooFewPeers("gossip needs at least two peers (SuperNodes)")
        roster = Roster(self.grid, self.delays, identify=True)  # peers ordered by partition id; delays bound
        roster.start(nodes, max(self.wait_for_nodes, self.timeout))
        self.unidentified = roster.unidentified
        self.peers = roster.nodes
        n = len(self.peers)
        late = self.rng.choice(n, size=int(math.floor(self.gossip.delayed_fraction * n)), replace=False)
        self.delayed = {int(i) for i in late}
        for i in range(n):
            self.join_time[i] = float(self.rng.uniform(0.0, self.horizon / 2)) if i in self.delayed else 0.0
        if self.gossip.topology == "fixed":  # own stream: the 'random' topology's draws stay as they were
            graph = np.random.default_rng([self.seed, 19])
            size = min(self.gossip.out_degree, n - 1)
            self.out_neighbours = {i: sorted(int(j) for j in graph.choice([k for k in range(n) if k != i], size=size,
                                                                            replace=False)) for i in range(n)}
        self.buffers = [DedupBuffer(self.gossip.buffer_capacity, self.gossip.dedup) for _ in range(n)]
        self.absorbed = [0.0] * n
        self.mass = [1.0] * n

    def _schedule(self, at: float, kind: str, peer: int, payload=None) -> None:
        heapq.heappush(self._events, (at, self._seq, kind, peer, payload))
        self._seq += 1

    def _online(self, at: float) -> list[int]:
        return [i for i in range(len(self.peers)) if self.join_time[i] <= at and i not in self.benched]

    # ------------------------------------------------------------------ loop
    def run(self) -> RelayStats:
        if not self.peers:
            self.discover()
        self._start_files()
        for i in range(len(self.peers)):
            self._schedule(self.join_time[i], "activate", i)
        eval_every = self.horizon / self.gossip.eval_points
        for k in range(1, self.gossip.eval_points + 1):
            self._schedule(k * eval_every, "evaluate", -1)
        while self._events and self._events[0][0] <= self.horizon + 1e-9:
            at, _, kind, peer, payload = heapq.heappop(self._events)
            started = time.perf_counter()
            if kind == "activate":
                if peer not in self.benched:
                    self.in_flight[peer] = self._activate(peer, at)
            elif kind == "finish":
                self._finish(peer, at, self.in_flight.pop(peer))
            elif kind == "deliver":
                sender, record, mass = payload
                self.absorbed[peer] += self.buffers[peer].put(sender, record, mass)
                self.stats.deliveries += 1
                if self.stats.deliveries % 20 == 0:  # sampled: a full scan per delivery would dominate the relay
                    buffered = sum(_record_bytes(e.payload) for b in self.buffers for e in b.entries())
                    self.stats.peak_buffered_bytes = max(self.stats.peak_buffered_bytes, buffered)
            else:
                self._evaluate(at)
            self.stats.relay_seconds += time.perf_counter() - started
        self._write_summary()
        return self.stats

    def _activate(self, peer: int, at: float) -> PeerEvent:
        drained = self.buffers[peer].drain()
        absorbed, self.absorbed[peer] = self.absorbed[peer], 0.0
        receivers = None
        if self.gossip.topology == "fixed":
            receivers = [j for j in self.out_neighbours[peer] if self.join_time[j] <= at and j not in self.benched]
            out_degree = len(receivers)
        else:
            out_degree = min(self.gossip.out_degree, len(self._online(at)) - 1)
        event = self._event_count.get(peer, 0)
        self._event_count[peer] = event + 1
        masses = [e.mass for _, e in drained]
        config = {**self.train_config, "gossip-method": self.method, "out-degree": out_degree,
                  "mass": self.mass[peer], "absorbed-mass": absorbed, "masses": masses or [0.0],
                  "senders": [int(s) for s, _ in drained] or [-1], "received": len(drained),
                  "fragments": max(1, out_degree // self.gossip.divshare_copies),
                  protocol.JOB_SEED: protocol.job_seed(self.seed, protocol.RELAY_STREAM, peer, event)}
        message_id = self._push(peer, config, [entry.payload for _, entry in drained])
        while message_id is None and drained:
            # the SuperLink would not take the request (too large: Flower's Grid returns no id) for what other
            # peers sent: not this peer's failure; it goes again without the largest message (its content lost,
            # its mass kept), until it is taken or holds none
            self.stats.requests_refused += 1
            largest = max(range(len(drained)), key=lambda i: _record_bytes(drained[i][1].payload))
            absorbed += masses[largest]
            del drained[largest], masses[largest]
            config.update({"absorbed-mass": absorbed, "masses": masses or [0.0],
                           "senders": [int(s) for s, _ in drained] or [-1], "received": len(drained)})
            message_id = self._push(peer, config, [entry.payload for _, entry in drained])
        # the same sums as the peer's push-sum merge (asyncfl.decentralized.peer.merge_received), in its order
        mass = (self.mass[peer] + absorbed) + sum(masses)
        self._schedule(at + self.delays.job_duration(peer), "finish", peer)
        return PeerEvent(message_id, out_degree, receivers, len(drained), mass)

    def _push(self, peer: int, config: dict, payloads: list) -> str | None:
        """Send a peer its request with ``payloads`` as ``msg-0``, ``msg-1``, ...; the message id, or None when the
        SuperLink did not take it."""
        content = RecordDict({"config": ConfigRecord(config)})
        for index, payload in enumerate(payloads):
            content[f"msg-{index}"] = payload
        message = Message(content, dst_node_id=self.peers[peer], message_type=PEER_ACTION, ttl=self.timeout)
        return next(iter(self.grid.push_messages([message]) or []), None)

    def _keep_share(self, peer: int, event: PeerEvent, sent: int) -> float:
        """Push-sum's split (:func:`asyncfl.decentralized.pushsum.split_mass`) on the relay's ledger: the peer keeps
        ``mass / (d + 1)`` after every event whatever it sent, and the shares it did not send are gone (counted),
        so holding back a push or failing on purpose gains a peer no weight; returns the share."""
        share = event.mass / (event.out_degree + 1)
        self.mass[peer] = share
        self.stats.mass_unsent += share * (event.out_degree - sent)
        return share

    def _refuse(self, peer: int, event: PeerEvent, reason: str) -> None:
        """Count a failed event (its shares unsent); bench the peer after :data:`MAX_FAILED_EVENTS` failures in a
        row or :data:`MAX_LOST_EVENTS` lost events in all."""
        self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
        self._keep_share(peer, event, 0)
        self._failed_in_a_row[peer] = self._failed_in_a_row.get(peer, 0) + 1
        self._lost[peer] = self._lost.get(peer, 0) + (reason == "lost")
        if (self._failed_in_a_row[peer] >= MAX_FAILED_EVENTS or self._lost[peer] >= MAX_LOST_EVENTS) \
                and peer not in self.benched:
            self.benched.add(peer)
            log.warning("peer %d benched after %d failed events in a row, %d lost in all (last: %s)", peer,
                        self._failed_in_a_row[peer], self._lost[peer], reason)

    def _finish(self, peer: int, at: float, event: PeerEvent) -> None:
        reply = self._wait_for(event.message_id) if event.message_id is not None else None
        self._schedule(at, "activate", peer)  # peers compute back to back
        self.stats.events += 1
        if event.message_id is None:
            return self._refuse(peer, event, "push-refused")
        if reply is None or reply.has_error() or "metrics" not in reply.content.metric_records:
            if reply is not None and reply.has_error():
                log.warning("peer %d failed: %s", peer, last_line(reply.error.reason))
            return self._refuse(peer, event, "lost" if reply is None else "error-reply" if reply.has_error()
                                else "no-metrics")
        metrics = reply.content.metric_records["metrics"]
        accuracy = metric_number(metrics, protocol.LOCAL_ACCURACY)
        untested = isinstance(metrics.get(protocol.LOCAL_ACCURACY), float) and math.isnan(
            metrics[protocol.LOCAL_ACCURACY])  # a peer with no local test examples reports NaN
        refused = metric_number(metrics, protocol.REFUSED_MESSAGES) if protocol.REFUSED_MESSAGES in metrics else 0.0
        restarted = metric_number(metrics, protocol.RESTARTED) if protocol.RESTARTED in metrics else 0.0
        if not (untested or accuracy is not None and 0.0 <= accuracy <= 1.0) \
                or refused is None or not refused.is_integer() or not 0 <= refused <= event.received \
                or restarted not in (0.0, 1.0):
            return self._refuse(peer, event, "bad-metric")
        records = reply.content.array_records
        per_receiver = [records[f"push-{j}"] for j in range(event.out_degree) if f"push-{j}" in records]
        record = records.get("push")
        if per_receiver and len(per_receiver) != event.out_degree:
            return self._refuse(peer, event, "fragment-count")
        pushed = per_receiver or ([record] if record is not None else [])
        if self.check_push is not None:  # the receivers' check (sizes bounded before anything is decoded)
            refusal = next((f"push-{r}" for r in map(self.check_push, pushed) if r is not None), None)
        else:
            refusal = next((r for r in map(record_refusal, pushed) if r is not None), None)
        if refusal is not None:
            return self._refuse(peer, event, refusal)
        self._failed_in_a_row[peer] = 0
        self.stats.refused_by_peers += int(refused)
        self.stats.restarts += int(restarted)
        if accuracy is not None:
            self.accuracy[peer] = accuracy
            self.best_accuracy[peer] = max(accuracy, self.best_accuracy.get(peer, 0.0))
        if (record is None and not per_receiver) or event.out_degree == 0:
            self._keep_share(peer, event, 0)  # nothing sent (Independent; out-degree 0 keeps it all)
            return None
        self.stats.pushes += 1
        # bytes of one push = what goes to all out-neighbours; message = the mean per receiver
        if per_receiver:
            self.stats.message_bytes.append(sum(_record_bytes(r) for r in per_receiver) / event.out_degree)
        else:
            self.stats.message_bytes.append(_record_bytes(record))
        if event.receivers is None:
            candidates = [i for i in self._online(at) if i != peer]
            chosen = self.rng.choice(candidates, size=min(event.out_degree, len(candidates)), replace=False)
        else:
            chosen = [j for j in event.receivers if j not in self.benched]
        share = self._keep_share(peer, event, event.out_degree)
        self.mass[peer] += share * (event.out_degree - len(chosen))  # a share no receiver can take stays home
        for j, receiver in enumerate(chosen):
            payload = per_receiver[j] if per_receiver else record
            self._schedule(at + self.gossip.link_delay, "deliver", int(receiver), (peer, payload, share))
        return None

    def _wait_for(self, message_id: str) -> Message | None:
        started = time.perf_counter()
        try:
            return wait_for_reply(self.grid, message_id, self.timeout, self._pacer)
        finally:
            self.stats.relay_seconds -= time.perf_counter() - started

    # --------------------------------------------------------------- results
    def _evaluate(self, at: float) -> None:
        online = [i for i in self._online(at) if i in self.accuracy]
        regular = [self.accuracy[i] for i in online]
        delayed = [self.accuracy[i] for i in online if i in self.delayed]
        row = {"time": round(at, 6), "online_peers": len(self._online(at)), "events": self.stats.events,
               "pushes": self.stats.pushes, "mean_accuracy": round(float(np.mean(regular)), 6) if regular else "",
               "sd_accuracy": round(float(np.std(regular)), 6) if regular else "",
               "delayed_mean_accuracy": round(float(np.mean(delayed)), 6) if delayed else ""}
        self.rows.append(row)
        append_csv(self.folder / "metrics.csv", list(row.values()))
        log.info("t=%.2f online=%d events=%d mean acc=%s", at, row["online_peers"], row["events"], row["mean_accuracy"])
        self._write_summary()

    def _start_files(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        start_csv(self.folder / "metrics.csv", ["time", "online_peers", "events", "pushes", "mean_accuracy",
                                                "sd_accuracy", "delayed_mean_accuracy"])

    def summary(self) -> dict:
        final = next((r for r in reversed(self.rows) if r["mean_accuracy"] != ""), None)
        delayed_best = [self.best_accuracy[i] for i in self.delayed if i in self.best_accuracy]
        message = float(np.mean(self.stats.message_bytes)) if self.stats.message_bytes else 0.0
        return {
            "strategy": self.method,
            "peers": len(self.peers),
            "topology": self.gossip.topology,
            "unidentified-peers": self.unidentified,
            "delayed-peers": sorted(self.delayed),
            "final-mean-accuracy": final["mean_accuracy"] if final else None,
            "final-sd-accuracy": final["sd_accuracy"] if final else None,
            "delayed-best-accuracy-mean": round(float(np.mean(delayed_best)), 6) if delayed_best else None,
            "delayed-best-accuracy-sd": round(float(np.std(delayed_best)), 6) if delayed_best else None,
            "events": self.stats.events,
            "pushes": self.stats.pushes,
            "deliveries": self.stats.deliveries,
            "rejected-by-reason": dict(sorted(self.stats.rejected.items())),
            "messages-refused-by-peers": self.stats.refused_by_peers,
            "peer-restarts": self.stats.restarts,
            "requests-refused": self.stats.requests_refused,
            "mass-unsent": round(self.stats.mass_unsent, 9),
            "benched-peers": sorted(self.benched),
            "undecodable-pulls": self.grid.failed_pulls,
            "message-bytes-mean": round(message, 1),
            "push-bytes-mean": round(message * self.gossip.out_degree, 1),
            "relay-ms-per-push": round(1000 * self.stats.relay_seconds / self.stats.pushes, 4) if self.stats.pushes else None,
            "relay-ms-per-event": round(1000 * self.stats.relay_seconds / max(self.stats.events, 1), 4),
            "peak-buffered-mb": round(self.stats.peak_buffered_bytes / 2**20, 4),
            "final-time": self.rows[-1]["time"] if self.rows else 0.0,
            "wall-seconds": round(time.monotonic() - self._wall_start, 3),
            "server-peak-rss-mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }

    def _write_summary(self) -> None:
        write_json(self.folder / "summary.json", self.summary())
