"""Who is out there: ask every node for its partition id, sample count and (only if asked) label counts.

The engine and the gossip relay both order clients by ``partition-id`` so a
seeded run does not depend on the node ids a SuperLink happened to assign.
Every node is waited for until it answers (a stock ClientApp answers with an
error, at once) or the deadline passes: on a loaded machine a simulated
node's first message can wait tens of seconds for its worker to start, and a
node left unidentified is ordered by node id, which a seed does not fix.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType

from asyncfl.server_app.pacing import PollPacer

log = logging.getLogger("asyncfl.discovery")

IDENTIFY_KEY = "asyncfl-identify"
LABEL_COUNTS_KEY = "asyncfl-label-counts"


@dataclass
class Identities:
    """What the nodes reported, by node id."""

    partition_of: dict[int, int] = field(default_factory=dict)
    size_of: dict[int, int] = field(default_factory=dict)
    labels_of: dict[int, list[int]] = field(default_factory=dict)
    unanswered: list[int] = field(default_factory=list)  # nodes with no reply at all by the deadline

    def ordered(self, nodes: list[int]) -> list[int]:
        """``nodes`` by partition id; nodes that did not report one follow, by node id."""
        known = sorted((pid, node) for node, pid in self.partition_of.items() if node in nodes)
        return [node for _, node in known] + sorted(node for node in nodes if node not in self.partition_of)


def query_identities(grid, nodes: list[int], deadline_s: float, want_label_counts: bool = False) -> Identities:
    """Send one ``query`` to each node and collect the answers that arrive within ``deadline_s``.

    Returns as soon as every node answered; nodes still silent at the deadline are listed
    in ``unanswered``.
    """
    request = {IDENTIFY_KEY: True, LABEL_COUNTS_KEY: want_label_counts}
    messages = [Message(RecordDict({"config": ConfigRecord(request)}), dst_node_id=node,
                        message_type=MessageType.QUERY, ttl=deadline_s) for node in nodes]
    ids = list(grid.push_messages(messages))
    node_of = dict(zip(ids, nodes))
    pending = set(ids)
    found = Identities()
    started = time.monotonic()
    deadline, next_note = started + deadline_s, started + 10.0
    pacer = PollPacer(first=0.01, longest=0.5)
    while pending and time.monotonic() < deadline:
        if time.monotonic() >= next_note:
            log.info("waiting for %d of %d node(s) to answer the identity query (up to %.0fs)", len(pending),
                     len(nodes), deadline_s)
            next_note += 10.0
        pull_started = time.perf_counter()
        replies = list(grid.pull_messages(list(pending)))
        pull_seconds = time.perf_counter() - pull_started
        for reply in replies:
            pending.discard(reply.metadata.reply_to_message_id)
            if reply.has_error() or "config" not in reply.content.config_records:
                continue
            record, node = reply.content.config_records["config"], reply.metadata.src_node_id
            value, size, counts = record.get("partition-id"), record.get("num-examples"), record.get("label-counts")
            if isinstance(value, int):
                found.partition_of[node] = value
            if isinstance(size, int):
                found.size_of[node] = size
            if isinstance(counts, list):
                found.labels_of[node] = [int(c) for c in counts]
        if pending:
            pacer.wait(pull_seconds, len(replies))
    found.unanswered = sorted(node_of[m] for m in pending if m in node_of)
    return found
