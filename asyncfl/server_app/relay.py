"""The gossip relay: PushCen-ADFL and its decentralized baselines on Flower, with no global model.

Flower has no peer-to-peer links, so the ServerApp relays and schedules; it
never reads or averages models. Each peer computes back to back on the virtual
clock (durations from the delay model). When a peer's compute event starts, the
relay sends it one message carrying every neighbour message delivered to it
since its last event (the bounded, sender-deduplicated buffer of the PushCen
paper, Sec. 4.5, lives here as transport); the peer merges, trains, encodes
and replies with its outgoing message and mass share; at the event's finish
the relay delivers that message to ``out-degree`` random online peers (drawn
afresh at every push, or, with ``gossip.topology = 'fixed'``, the peer's online
members of a seeded static set of ``out-degree`` out-neighbours). Peer
state (model, push-sum mass, centroid dictionary) stays in each ClientApp's
``context.state``. A fraction of the peers joins late, at a seeded time in the
first half of the horizon. Accuracy is each online peer's accuracy on its own
local test split after its latest event, averaged at ``eval-points`` times.

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
from asyncfl.server_app.transport import wait_for_nodes, wait_for_reply
from asyncfl.simulation.presets import delay_sampler

log = logging.getLogger("asyncfl.relay")

PEER_ACTION = "train.gossip"


@dataclass
class RelayStats:
    events: int = 0
    pushes: int = 0
    deliveries: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    message_bytes: list[int] = field(default_factory=list)
    relay_seconds: float = 0.0  # relay work only: waiting for peers' replies is excluded
    peak_buffered_bytes: int = 0


def _record_bytes(record: ArrayRecord) -> int:
    return sum(len(array.data) for array in record.values())


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
    """

    def __init__(self, grid, method: str, gossip: GossipConfig, options, timeout: float, train_config: dict,
                 folder: Path) -> None:
        self.grid = grid
        if method not in GOSSIP_METHODS or not options.max_time > 0:
            raise ConfigError(f"the gossip relay runs a gossip method ({', '.join(GOSSIP_METHODS)}) to a horizon "
                              f"max-time > 0; got {method!r} and max-time={options.max_time}")
        self.method, self.gossip, self.horizon = method, gossip, options.max_time
        self.seed, self.timeout = options.seed, timeout
        self.wait_for_nodes = options.node_wait(timeout)
        self.train_config = dict(train_config)
        self.folder = folder
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

    def _schedule(self, at: float, kind: str, peer: int, payload=None) -> None:
        heapq.heappush(self._events, (at, self._seq, kind, peer, payload))
        self._seq += 1

    def _online(self, at: float) -> list[int]:
        return [i for i in range(len(self.peers)) if self.join_time[i] <= at]

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
        in_flight: dict[int, tuple[str, int, list[int] | None]] = {}  # peer -> (message id, out-degree, fixed receivers)
        while self._events and self._events[0][0] <= self.horizon + 1e-9:
            at, _, kind, peer, payload = heapq.heappop(self._events)
            started = time.perf_counter()
            if kind == "activate":
                in_flight[peer] = self._activate(peer, at)
            elif kind == "finish":
                self._finish(peer, at, in_flight.pop(peer))
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

    def _activate(self, peer: int, at: float) -> tuple[str, int, list[int] | None]:
        drained = self.buffers[peer].drain()
        absorbed, self.absorbed[peer] = self.absorbed[peer], 0.0
        receivers = None
        if self.gossip.topology == "fixed":
            receivers = [j for j in self.out_neighbours[peer] if self.join_time[j] <= at]
            out_degree = len(receivers)
        else:
            out_degree = min(self.gossip.out_degree, len(self._online(at)) - 1)
        event = self._event_count.get(peer, 0)
        self._event_count[peer] = event + 1
        config = {**self.train_config, "gossip-method": self.method, "out-degree": out_degree,
                  "absorbed-mass": absorbed, "masses": [e.mass for _, e in drained] or [0.0],
                  "senders": [int(s) for s, _ in drained] or [-1], "received": len(drained),
                  "fragments": max(1, out_degree // self.gossip.divshare_copies),
                  protocol.JOB_SEED: protocol.job_seed(self.seed, protocol.RELAY_STREAM, peer, event)}
        content = RecordDict({"config": ConfigRecord(config)})
        for index, (_, entry) in enumerate(drained):
            content[f"msg-{index}"] = entry.payload
        message = Message(content, dst_node_id=self.peers[peer], message_type=PEER_ACTION, ttl=self.timeout)
        message_id = next(iter(self.grid.push_messages([message])))
        self._schedule(at + self.delays.job_duration(peer), "finish", peer)
        return message_id, out_degree, receivers

    def _finish(self, peer: int, at: float, job: tuple[str, int, list[int] | None]) -> None:
        message_id, out_degree, receivers = job
        reply = self._wait_for(message_id)
        self._schedule(at, "activate", peer)  # peers compute back to back
        self.stats.events += 1
        if reply is None or reply.has_error() or "metrics" not in reply.content.metric_records:
            reason = "lost" if reply is None else "error-reply" if reply.has_error() else "no-metrics"
            self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
            if reply is not None and reply.has_error():
                log.warning("peer %d failed: %s", peer, (reply.error.reason or "?").strip().splitlines()[-1][:300])
            return
        metrics = reply.content.metric_records["metrics"]
        accuracy = float(metrics.get(protocol.LOCAL_ACCURACY, float("nan")))
        if math.isfinite(accuracy):
            self.accuracy[peer] = accuracy
            self.best_accuracy[peer] = max(accuracy, self.best_accuracy.get(peer, 0.0))
        records = reply.content.array_records
        per_receiver = [records[f"push-{j}"] for j in range(out_degree) if f"push-{j}" in records]
        record = records.get("push")
        share = float(metrics.get(protocol.MASS_SHARE, 0.0))
        if (record is None and not per_receiver) or out_degree == 0:
            return
        if not (math.isfinite(share) and share > 0):
            self.stats.rejected["bad-mass"] = self.stats.rejected.get("bad-mass", 0) + 1
            return
        if per_receiver and len(per_receiver) != out_degree:
            self.stats.rejected["fragment-count"] = self.stats.rejected.get("fragment-count", 0) + 1
            return
        self.stats.pushes += 1
        # bytes of one push = what goes to all out-neighbours; message = the mean per receiver
        if per_receiver:
            self.stats.message_bytes.append(sum(_record_bytes(r) for r in per_receiver) / out_degree)
        else:
            self.stats.message_bytes.append(_record_bytes(record))
        if receivers is None:
            candidates = [i for i in self._online(at) if i != peer]
            chosen = self.rng.choice(candidates, size=min(out_degree, len(candidates)), replace=False)
        else:
            chosen = receivers
        for j, receiver in enumerate(chosen):
            payload = per_receiver[j] if per_receiver else record
            self._schedule(at + self.gossip.link_delay, "deliver", int(receiver), (peer, payload, share))

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
