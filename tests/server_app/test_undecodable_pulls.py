"""A reply Flower's Grid cannot decode costs that reply (and the replies pulled with it), never the run.

Flower 1.42's SuperLink checks a reply's objects by their hashes, not their contents, and hands a pull's replies
over before the ServerApp's Grid decodes them: a node that uploads a record body that is not protobuf makes the
Grid's ``pull_messages`` raise, and the other replies of that pull are gone (asked again: "unavailable"). The grid
below does the same for node 104's replies of one message type.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from google.protobuf.message import DecodeError

from asyncfl import FedBuff
from asyncfl.server_app.discovery import query_identities
from asyncfl.server_app.roster import Roster
from asyncfl.server_app.transport import Link
from tests.fake_grid import FakeGrid, trained_reply

BAD_NODE = 104


def _honest(node: int, message: Message) -> Message:
    if message.metadata.message_type == "evaluate":
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 10, "accuracy": 0.5})}), reply_to=message)
    w = message.content.array_records["arrays"]["w"].numpy()
    return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(0.1))}))


def _job(node: int) -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3, np.float32))}), "config": ConfigRecord({})})
    return Message(content, dst_node_id=node, message_type="train")


class UndecodableGrid(FakeGrid):
    """Node :data:`BAD_NODE`'s replies to ``kind`` messages raise when pulled, after the pull handed them over."""

    def __init__(self, kind: str, nodes: int = 8) -> None:
        super().__init__(nodes, self._reply)
        self.kind, self.bad, self.handed_over, self.raised = kind, set(), {}, 0

    def _reply(self, node: int, message: Message) -> Message:
        if node == BAD_NODE and message.metadata.message_type == self.kind:
            self.bad.add(message.metadata.message_id)
        return _honest(node, message)

    def _identify(self, node: int, message: Message) -> Message:
        if node == BAD_NODE and self.kind == "query":
            self.bad.add(message.metadata.message_id)
        return super()._identify(node, message)

    @staticmethod
    def _unavailable(request: Message) -> Message:
        """The SuperLink's error for a message whose reply it handed over already."""
        error = Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="Message Unavailable"), reply_to=request)
        error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        return error

    def pull_messages(self, message_ids):
        with self._lock:
            ids = list(message_ids)
            gone = [self._unavailable(self.handed_over.pop(i)) for i in ids if i in self.handed_over]
            out = self._pull(ids)
            if any(m.metadata.reply_to_message_id in self.bad for m in out):
                requests = {m.metadata.message_id: m for m in self.pushed}
                self.handed_over.update({m.metadata.reply_to_message_id: requests[m.metadata.reply_to_message_id]
                                         for m in out})
                self.raised += 1
                raise DecodeError("Error parsing message with type 'flwr.proto.MetricRecord'")
            return gone + out


@pytest.mark.parametrize("kind, clock", [("train", "wall"), ("train", "virtual"), ("evaluate", "wall"),
                                         ("query", "wall")])
def test_an_undecodable_reply_never_ends_the_run(kind, clock):
    grid = UndecodableGrid(kind)
    result = FedBuff(buffer_size=3, fraction_evaluate=1.0).start(
        grid, ArrayRecord({"w": Array(np.ones(3, np.float32))}), num_rounds=0, train_config=ConfigRecord({}),
        clock=clock, seed=5, identify_nodes=True, max_arrivals=30, timeout=5.0,
        **({"dispatch_hold": 0.0} if clock == "wall" else {"delay_model": "fedrevive-default"}))
    summary = result.summary
    assert grid.raised > 0 and summary["stop-reason"].startswith("max-arrivals")
    if (kind, clock) == ("train", "wall"):  # pulled one message at a time: that reply alone, by its reason
        assert summary["rejected-by-reason"]["undecodable"] >= 1
    if kind == "evaluate":
        assert result.evaluate_metrics_clientapp  # the federated evaluation went on
    if kind == "query":  # the nodes whose answers were lost with its reply are asked again: node 104 alone is left
        assert summary["unidentified-nodes"] == 1


def test_a_link_pulls_a_suspect_nodes_messages_alone_so_its_bad_replies_cost_only_themselves():
    grid = UndecodableGrid("train", nodes=4)
    link = Link(grid, 60.0)
    nodes = (101, 102, 103, BAD_NODE)
    first = link.push_messages([_job(node) for node in nodes])
    lost = link.pull_messages(first)  # the pull that raised handed all four over: each is "unavailable"
    assert sorted(r.metadata.reply_to_message_id for r in lost) == sorted(first)
    assert all(r.error.code == ErrorCode.MESSAGE_UNAVAILABLE for r in lost)
    assert link.suspects == {(node, "train") for node in nodes}
    for _ in range(2):
        ids = link.push_messages([_job(node) for node in nodes])
        replies = {r.metadata.reply_to_message_id: r for r in link.pull_messages(ids)}
        assert not any(replies[i].has_error() for i in ids[:3])  # the honest nodes' replies all come through
        assert replies[ids[3]].error.reason.startswith("the reply could not be decoded: DecodeError")
        assert link.suspects == {(BAD_NODE, "train")}  # cleared by a reply that decoded; node 104 stays


def test_one_nodes_error_answer_to_the_identity_query_leaves_the_others_identified():
    """Asked all at once (a deployment), a node that answers the identity query with an error stands for itself."""
    class OneRefuses(FakeGrid):
        def _identify(self, node, message):
            if node == BAD_NODE:
                return Message(Error(code=0, reason="no query handler"), reply_to=message)
            return super()._identify(node, message)

    grid = OneRefuses(8, _honest)
    found = query_identities(grid, grid.nodes, 5.0, probe_first=False)
    assert found.refused == 1 and not found.no_handler
    assert sorted(found.partition_of) == [n for n in grid.nodes if n != BAD_NODE]
    everyone = query_identities(FakeGrid(3, _honest, partition_ids=False), [101, 102, 103], 5.0, probe_first=False)
    assert everyone.refused == 3 and everyone.no_handler  # a stock ClientApp everywhere: no handler


def test_a_node_alternating_undecodable_and_good_replies_costs_the_others_two_pulls_at_most():
    grid = UndecodableGrid("train", nodes=4)
    sent_by_bad = []
    handler = grid.handler

    def alternating(node, message):  # node 104: undecodable, then good, then undecodable, ...
        reply = handler(node, message)
        if node == BAD_NODE:
            sent_by_bad.append(message.metadata.message_id)
            if len(sent_by_bad) % 2 == 0:
                grid.bad.discard(message.metadata.message_id)
        return reply

    grid.handler = alternating
    link = Link(grid, 60.0)
    honest_lost = []
    for _ in range(8):
        ids = link.push_messages([_job(node) for node in (101, 102, 103, BAD_NODE)])
        replies = {r.metadata.reply_to_message_id: r for r in link.pull_messages(ids)}
        honest_lost.append(sum(replies[i].has_error() for i in ids[:3]))
    assert honest_lost[:1] == [3] and sum(honest_lost) <= 6 and honest_lost[4:] == [0, 0, 0, 0]
    assert link.failed_pulls <= 2 and (BAD_NODE, "train") in link.suspects


def test_only_the_nodes_whose_replies_a_failed_pull_held_are_suspects():
    grid = UndecodableGrid("train", nodes=4)
    handler = grid.handler
    grid.handler = lambda node, message: None if node == 103 else handler(node, message)  # 103's reply never comes
    link = Link(grid, 60.0)
    link.pull_messages(link.push_messages([_job(node) for node in (101, 102, 103, BAD_NODE)]))
    assert link.suspects == {(101, "train"), (102, "train"), (BAD_NODE, "train")}


def test_a_transport_error_is_not_taken_for_an_undecodable_reply():
    import httpx

    class Throttled(FakeGrid):
        def pull_messages(self, message_ids):
            request = httpx.Request("POST", "http://superlink")
            raise httpx.HTTPStatusError("429", request=request, response=httpx.Response(429, request=request))

    link = Link(Throttled(2, _honest), 60.0)
    with pytest.raises(httpx.HTTPStatusError):
        link.pull_messages(link.push_messages([_job(101), _job(102)]))
    assert not link.suspects and link.failed_pulls == 0


def test_identity_answers_lost_with_an_undecodable_one_are_asked_again_at_once():
    """Node 104's answer cannot be decoded and loses the answers pulled with it; node 108 never answers: the others
    are asked again while 108 is still awaited, and identified."""
    class Silent108(UndecodableGrid):
        def _identify(self, node, message):
            return None if node == 108 else super()._identify(node, message)

    grid = Silent108("query")
    found = query_identities(Link(grid, 60.0), grid.nodes, 2.0, probe_first=False)
    assert sorted(found.partition_of) == [101, 102, 103, 105, 106, 107] and found.unanswered == [108]
    assert grid.raised >= 1 and not found.no_handler


class _NoDelays:
    def bind_clients(self, sizes, labels=None):
        pass


def _look_until_taken_in(roster: Roster, nodes, limit_s: float = 60.0) -> None:
    """Look at the online nodes until ``nodes`` are clients (their answers are pulled by background threads)."""
    limit = time.monotonic() + limit_s
    while not set(nodes) <= set(roster.nodes) and time.monotonic() < limit:
        roster.refresh()
        time.sleep(0.01)


def test_a_joiner_whose_identity_answer_cannot_be_decoded_is_asked_once_more_and_the_others_are_identified():
    """Nodes 104 (answers the Grid cannot decode), 105 and 106 join at the same look: 104 is asked twice and taken
    in unidentified, 105 and 106 are identified (each answer is pulled on its own: none is lost with 104's)."""
    class Joining(UndecodableGrid):
        online = [101, 102, 103]

        def get_node_ids(self):
            return list(self.online)

    grid = Joining("query")
    roster = Roster(Link(grid, 60.0), _NoDelays(), identify=True, probe_first=False)
    roster.start([101, 102, 103], 5.0)
    roster.refresh_every, roster.join_wait_s = 0.0, 3.0
    grid.online = [101, 102, 103, 104, 105, 106]
    _look_until_taken_in(roster, grid.online)
    asked_104 = [m for m in grid.pushed if m.metadata.message_type == "query" and m.metadata.dst_node_id == BAD_NODE]
    assert grid.raised == 2 and len(asked_104) == 2 and roster.unidentified == 1
    assert {roster.owners.get(roster.index_of[node]) for node in (105, 106)} == {"partition-id:4", "partition-id:5"}


def test_a_node_that_rejoins_under_new_node_ids_keeps_its_owner():
    """One data owner (partition-id 2) joins mid-run, leaves, and joins again twice under new node ids: each time it
    is that owner (the DP ledger's entry), not an unidentified client."""
    owner_of = {101: 0, 102: 1, 201: 2, 202: 2, 203: 2}

    class Rejoining(FakeGrid):
        def _identify(self, node, message):
            return Message(RecordDict({"config": ConfigRecord({"partition-id": owner_of[node]})}), reply_to=message)

    grid = Rejoining(2, _honest)
    roster = Roster(grid, _NoDelays(), identify=True, probe_first=False)
    roster.start([101, 102], 5.0)
    roster.refresh_every = 0.0
    for node in (201, 202, 203):
        grid.nodes = [101, 102, node]
        _look_until_taken_in(roster, [node])
        assert roster.owners[roster.index_of[node]] == "partition-id:2"
    assert roster.unidentified == 0
