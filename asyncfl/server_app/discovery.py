"""Who is out there: ask every node for its partition id, sample count and (only if asked) label counts.

The engine and the gossip relay both order clients by ``partition-id`` so a
seeded run does not depend on the node ids a SuperLink happened to assign.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType

IDENTIFY_KEY = "asyncfl-identify"
LABEL_COUNTS_KEY = "asyncfl-label-counts"


@dataclass
class Identities:
    """What the nodes reported, by node id."""

    partition_of: dict[int, int] = field(default_factory=dict)
    size_of: dict[int, int] = field(default_factory=dict)
    labels_of: dict[int, list[int]] = field(default_factory=dict)

    def ordered(self, nodes: list[int]) -> list[int]:
        """``nodes`` by partition id; nodes that did not report one follow, by node id."""
        known = sorted((pid, node) for node, pid in self.partition_of.items() if node in nodes)
        return [node for _, node in known] + sorted(node for node in nodes if node not in self.partition_of)


def query_identities(grid, nodes: list[int], deadline_s: float, want_label_counts: bool = False) -> Identities:
    """Send one ``query`` to each node and collect the answers that arrive within ``deadline_s``."""
    request = {IDENTIFY_KEY: True, LABEL_COUNTS_KEY: want_label_counts}
    messages = [Message(RecordDict({"config": ConfigRecord(request)}), dst_node_id=node,
                        message_type=MessageType.QUERY, ttl=deadline_s) for node in nodes]
    pending = set(grid.push_messages(messages))
    found = Identities()
    deadline = time.monotonic() + deadline_s
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
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
            time.sleep(0.01)
    return found
