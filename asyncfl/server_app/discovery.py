"""Who is out there: ask every node for its partition id, sample count and (only if asked) label counts.

The engine and the gossip relay both order clients by ``partition-id`` so a
seeded run does not depend on the node ids a SuperLink happened to assign.
Every node is waited for until it answers (a stock ClientApp answers with an
error, at once: then, in a simulation, only one node is asked) or the deadline passes: on a loaded machine a simulated
node's first message can wait tens of seconds for its worker to start, and a
node left unidentified is ordered by node id, which a seed does not fix.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType
from flwr.common.constant import SUPERLINK_NODE_ID

from asyncfl import protocol
from asyncfl.server_app.pacing import PollPacer

if TYPE_CHECKING:
    from asyncfl.server_app.puller import ThreadedPuller

log = logging.getLogger("asyncfl.discovery")

#: How long the first node is asked alone before the others are asked anyway (its worker may be starting).
PROBE_S = 10.0


@dataclass
class Identities:
    """What the nodes reported, by node id."""

    partition_of: dict[int, int] = field(default_factory=dict)
    size_of: dict[int, int] = field(default_factory=dict)
    labels_of: dict[int, list[int]] = field(default_factory=dict)
    unanswered: list[int] = field(default_factory=list)  # nodes with no reply at all by the deadline
    refused: int = 0  # nodes that answered with an error (a ClientApp without a query handler)
    no_handler: bool = False  # the ClientApp has no query handler: the probe, or every node asked, refused

    def ordered(self, nodes: list[int]) -> list[int]:
        """``nodes`` by partition id; nodes that did not report one follow, by node id."""
        known = sorted((pid, node) for node, pid in self.partition_of.items() if node in nodes)
        return [node for _, node in known] + sorted(node for node in nodes if node not in self.partition_of)


def query_identities(grid, nodes: list[int], deadline_s: float, want_label_counts: bool = False,
                     probe_first: bool = True, puller: "ThreadedPuller | None" = None) -> Identities:
    """Ask the nodes for their identity and collect the answers that arrive within ``deadline_s``.

    With ``probe_first`` the first node is asked alone: a stock ClientApp has no ``query``
    handler and answers with an error, which Flower's simulation runtime logs as a traceback,
    so when the first node refuses the others are not asked (``no_handler`` is set; one
    traceback, not one per node). Once it answered, or after :data:`PROBE_S` (at most half
    the deadline) of silence, the rest are asked at once. Without it (a deployment, where each
    SuperNode logs its own refusal) every node is asked at once: a deployed node starts a
    process per message, and asking one first would add that start to the run's; one node's
    error reply then stands for that node alone (``no_handler`` only when every node refused).
    Returns as soon as every node answered; nodes still silent at the deadline are listed in
    ``unanswered``. With a ``puller`` the answers are pulled by its threads, message by message: a node that
    uploads its answer's message but never its objects then holds one of them (Flower's Grid retries inside that
    pull until the object-push session expires), not this call past its deadline.
    """
    found = Identities()
    if not nodes:
        return found
    started = time.monotonic()
    deadline = started + deadline_s
    first = 1 if probe_first else len(nodes)
    node_of = ask(grid, nodes[:first], deadline, want_label_counts)
    pending = set(node_of)
    again = AskAgain(grid, want_label_counts)
    pull = puller.poll if puller is not None else grid.pull_messages
    _collect(pull, pending, started + min(PROBE_S, deadline_s / 2) if probe_first else deadline, found, len(nodes),
             again, node_of, deadline, stop_on_refusal=probe_first)
    if probe_first and found.refused:
        found.no_handler = True
    else:
        asked = ask(grid, nodes[first:], deadline, want_label_counts)
        node_of.update(asked)
        pending |= set(asked)
        _collect(pull, pending, deadline, found, len(nodes), again, node_of, deadline)
        found.unanswered = sorted(node_of[m] for m in pending)
        found.no_handler = found.refused == len(nodes)
    if puller is not None:
        for message_id in node_of:
            puller.forget(message_id)  # a pull still stuck on one of them drops what it gets
    return found


def _whole(value) -> bool:
    """A node's identity answer is data: an id, a size or a label count is used only when a whole number >= 0."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


def ask(grid, nodes: list[int], deadline: float, want_label_counts: bool = False) -> dict[str, int]:
    """Push the identity query to each of ``nodes`` (its TTL until ``deadline``, ``time.monotonic()``);
    ``{message id: node}``."""
    if not nodes:
        return {}
    request = {protocol.IDENTIFY: True, protocol.WANT_LABEL_COUNTS: want_label_counts}
    ttl = max(1.0, deadline - time.monotonic())
    messages = [Message(RecordDict({"config": ConfigRecord(request)}), dst_node_id=node,
                        message_type=MessageType.QUERY, ttl=ttl) for node in nodes]
    return dict(zip(grid.push_messages(messages), nodes))


class AskAgain:
    """Asks a node once more whose answer the SuperLink lost (its error in place of the answer: one the Grid could
    not decode was pulled with it, ``transport.Link``), once per node: the start's query and the joiners' share it."""

    def __init__(self, grid, want_label_counts: bool) -> None:
        self.grid, self.want_label_counts = grid, want_label_counts
        self.asked: set[int] = set()

    def __call__(self, node: int, deadline: float) -> str | None:
        """The new query's message id, or ``None`` (asked once already, past ``deadline``, or refused)."""
        if node in self.asked or time.monotonic() >= deadline:
            return None
        self.asked.add(node)
        return next((message_id for message_id in ask(self.grid, [node], deadline, self.want_label_counts)
                     if message_id), None)


def take_answers(replies, found: Identities, pending: set[str]) -> list[str]:
    """Identity answers among ``replies`` into ``found``, their queries out of ``pending``; returns the queries whose
    answer the SuperLink lost (its error in place: one the Grid could not decode was pulled with it)."""
    lost = []
    for reply in replies:
        if reply.metadata.reply_to_message_id not in pending:
            continue  # a query no longer awaited (given up on, or answered already)
        pending.discard(reply.metadata.reply_to_message_id)
        if reply.has_error():  # the node's own error (no query handler), or the SuperLink's: lost, not refused
            if reply.metadata.src_node_id == SUPERLINK_NODE_ID:
                lost.append(reply.metadata.reply_to_message_id)
            else:
                found.refused += 1
            continue
        if "config" not in reply.content.config_records:
            continue
        record, node = reply.content.config_records["config"], reply.metadata.src_node_id
        value, size, counts = (record.get(protocol.PARTITION_ID), record.get(protocol.NUM_EXAMPLES),
                               record.get(protocol.LABEL_COUNTS))
        if _whole(value) and value not in found.partition_of.values():  # a claimed id is taken once
            found.partition_of[node] = value
        if _whole(size):
            found.size_of[node] = size
        if isinstance(counts, list) and counts and all(_whole(c) for c in counts):
            found.labels_of[node] = [int(c) for c in counts]
    return lost


def _collect(pull, pending: set[str], until: float, found: Identities, total: int, again: AskAgain,
             node_of: dict[str, int], deadline: float, stop_on_refusal: bool = False) -> None:
    """Pull answers to the ``pending`` queries (``node_of``: their nodes) into ``found`` until none is pending,
    ``until``, or (with ``stop_on_refusal``) one refused; a lost answer is asked for ``again`` (until ``deadline``).
    ``pull``: the Grid's ``pull_messages`` or a puller's ``poll``."""
    next_note = time.monotonic() + 10.0
    pacer = PollPacer(first=0.01, longest=0.5)
    while pending and not (stop_on_refusal and found.refused) and time.monotonic() < until:
        if time.monotonic() >= next_note:
            log.info("waiting for %d of %d node(s) to answer the identity query (up to %.0fs more)", len(pending),
                     total, until - time.monotonic())
            next_note += 10.0
        pull_started = time.perf_counter()
        replies = list(pull(list(pending)))
        pull_seconds = time.perf_counter() - pull_started
        for node in (node_of[lost] for lost in take_answers(replies, found, pending) if lost in node_of):
            if (message_id := again(node, deadline)) is not None:
                node_of[message_id] = node
                pending.add(message_id)
        if pending:
            pacer.wait(pull_seconds, len(replies))
