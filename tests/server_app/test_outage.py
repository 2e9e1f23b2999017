"""A SuperLink outage mid-run, on the fake Grid: the run waits it out and sends again what it lost, or ends saying
why when it lasts too long (issue 56, "every run end says why").

The outage grid stops answering once a chosen train job went out: every call raises httpx's ``ConnectError``, as a
Grid call does when nothing listens on the SuperLink's address (Flower 1.42's own Grid retries that inside the call:
``RetryingOutageGrid`` does the same, through Flower's ``RetryInvoker``). It comes back once the outage has lasted
longer than a timeout, so the jobs out at its start are past their timeout by then; a restarted SuperLink may
have lost what it held, answering for those messages nothing at all or Flower's "unavailable" error reply.
The tests wait on these conditions, never on a fixed sleep, and assert no timing.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_ins_message
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError, ObjectUnavailableError
from flwr.supercore.retry import RetryInvoker, exponential

from asyncfl import FedBuff
from asyncfl.errors import ConfigError
from asyncfl.server_app.transport import Link, SuperLinkUnreachable, is_unreachable, outage_limit
from tests.fake_grid import FakeGrid, trained_reply
from tests.server_app.test_engine import FIXED, Recording, make_engine, plus_one

JOB_TIMEOUT = 2.0  # seconds; the outage lasts longer, the run's limit is 3 x this


class OutageGrid(FakeGrid):
    """A FakeGrid whose SuperLink goes away once the ``down_after``-th train job went out, until ``up_when()``.

    ``lost``: what the restarted SuperLink says of the messages it held before the outage: ``"kept"`` (a database
    that kept them: their replies come), ``"nothing"`` (pulls return nothing for them) or ``"unavailable"``
    (Flower's error reply for a message it does not have). ``nodes_back_after``: calls to ``get_node_ids`` after
    the outage that list no node yet (SuperNodes that have not reconnected).
    """

    def __init__(self, num_nodes, handler, down_after: int, up_when=None, lost: str = "kept",
                 nodes_back_after: int = 0, on_back=None) -> None:
        super().__init__(num_nodes, handler)
        self.down_after, self.lost, self.nodes_back_after, self.on_back = down_after, lost, nodes_back_after, on_back
        self.up_when = up_when or (lambda grid: time.monotonic() - grid.down_since > JOB_TIMEOUT)
        self.train_jobs = 0
        self.down_since: float | None = None
        self.came_back: float | None = None
        self.failed_calls = 0
        self.lost_ids: set[str] = set()
        self.lost_nodes: set[int] = set()  # nodes whose job the outage lost
        self.nodes_after: list[int] = []  # nodes of the train jobs pushed once the SuperLink was back

    def _check_link(self) -> None:
        if self.down_since is not None and self.came_back is None:
            if not self.up_when(self):
                self.failed_calls += 1
                raise httpx.ConnectError("[Errno 111] Connection refused")
            self.came_back = time.monotonic()

    def get_node_ids(self):
        with self._lock:
            self._check_link()
            if self.came_back is not None and self.nodes_back_after > 0:
                self.nodes_back_after -= 1
                return []
            return super().get_node_ids()

    def push_messages(self, messages):
        with self._lock:
            self._check_link()
            messages = list(messages)
            ids = self._push(messages)
            train = [m for m in messages if m.metadata.message_type == "train"]
            if self.came_back is not None:
                if self.on_back is not None and not self.nodes_after:  # the run's first push once it is back
                    self.on_back()
                self.nodes_after += [m.metadata.dst_node_id for m in train]
            self.train_jobs += len(train)
            if self.down_since is None and self.train_jobs >= self.down_after:
                self._go_down()
            return ids

    def _go_down(self) -> None:
        self.down_since = time.monotonic()
        if self.lost != "kept":  # the restart loses the messages out and the replies waiting
            self.lost_ids = set(self._waiting)
            self.lost_nodes = {reply.metadata.src_node_id for reply in self._waiting.values()}
            self._waiting.clear()

    def pull_messages(self, message_ids):
        with self._lock:
            self._check_link()
            replies = self._pull(message_ids)
            if self.lost == "unavailable":
                unknown = [mid for mid in message_ids if mid in self.lost_ids]
                self.lost_ids -= set(unknown)
                replies += [create_message_error_unavailable_ins_message(mid, 0) for mid in unknown]
            return replies


class RetryingOutageGrid(OutageGrid):
    """As Flower 1.42's ``HttpGrid``: every call retries a connection error inside, through Flower's own
    ``RetryInvoker`` (no limit on tries or time), so it blocks rather than raises while the SuperLink is away."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._retry_invoker = RetryInvoker(lambda: exponential(0.01, 2, 0.1), (httpx.ConnectError,), None, None,
                                           jitter=None)

    def get_node_ids(self):
        return self._retry_invoker.invoke(super().get_node_ids)

    def push_messages(self, messages):
        return self._retry_invoker.invoke(super().push_messages, list(messages))

    def pull_messages(self, message_ids):
        return self._retry_invoker.invoke(super().pull_messages, list(message_ids))


def honest(node, message):
    w = message.content.array_records["arrays"]["w"].numpy()
    return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(0.1))}))


def server_evaluate(round_, arrays):
    return MetricRecord({"accuracy": float(arrays["w"].numpy().mean()), "loss": 1.0})


def _start(grid, tmp_path, **options):
    common = dict(num_rounds=0, train_config=ConfigRecord({}), timeout=JOB_TIMEOUT, clock="wall", max_arrivals=8,
                  concurrency=1, output_dir=str(tmp_path), run_name="run", evaluate_fn=server_evaluate)
    return FedBuff(buffer_size=2, fraction_evaluate=0.0).start(grid, ArrayRecord({"w": Array(np.zeros(3, np.float32))}),
                                                               **{**common, **options})


@pytest.mark.parametrize("grid_type, lost, nodes_back_after", [
    (OutageGrid, "kept", 0),  # the SuperLink kept its messages: the reply comes once it is back
    (OutageGrid, "nothing", 0),  # it lost them and says nothing: the job's timeout runs out, then it goes out again
    (OutageGrid, "unavailable", 0),  # it lost them and says so (Flower's MESSAGE_UNAVAILABLE): sent again at once
    (OutageGrid, "unavailable", 1),  # ... and lists no node until they reconnect: a job goes out once they are back
    (RetryingOutageGrid, "nothing", 0),  # Flower's own Grid, which retries inside the call and never raises
])
def test_an_outage_longer_than_a_job_timeout_is_waited_out_and_its_jobs_sent_again(tmp_path, grid_type, lost,
                                                                                    nodes_back_after):
    # Prepare: 2 nodes, one job out at a time (the outage's job holds the run until it is settled); the SuperLink
    # goes away as soon as the 4th train job went out, for longer than a timeout
    grid = grid_type(2, honest, down_after=4, lost=lost, nodes_back_after=nodes_back_after)
    # Execute
    result = _start(grid, tmp_path)
    # Assert: the run reached its stop; the outage is counted; no client counted failing for it
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop-reason"] == result.summary["stop-reason"] == "max-arrivals 8 reached"
    assert summary["arrivals"] == 8 and summary["finished"] is True
    assert summary["superlink-outages"] == 1 and summary["superlink-outage-seconds"] > 0
    assert summary["superlink-failed-tries"] >= 1 and grid.failed_calls >= 1
    assert summary["rejected-updates"] == 0 and summary["rejected-by-reason"] == {}
    assert len(grid.lost_nodes) == (0 if lost == "kept" else 1)
    assert summary["jobs-lost-to-outage"] == len(grid.lost_nodes)
    assert summary["jobs-resent-after-outage"] == (0 if nodes_back_after else len(grid.lost_nodes))
    # the client whose job it lost got it again first thing once the SuperLink was back; where no node was listed
    # yet, the next job went out once they were
    if nodes_back_after:
        assert grid.nodes_after
    else:
        assert grid.lost_nodes <= set(grid.nodes_after[:1])


@pytest.mark.parametrize("grid_type", [OutageGrid, RetryingOutageGrid])
def test_an_outage_past_the_limit_ends_the_run_saying_so_with_everything_written(tmp_path, grid_type):
    # Prepare: the SuperLink goes away once the 4th train job went out and never comes back
    grid = grid_type(2, honest, down_after=4, up_when=lambda grid: False, lost="nothing")
    # Execute
    with pytest.raises(SuperLinkUnreachable, match="outage limit of 6s"):
        _start(grid, tmp_path, checkpoint_every=1)
    # Assert: summary.json says why and what was done; the last row and a checkpoint to resume from are written
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop-reason"].startswith("superlink unreachable: SuperLinkUnreachable: no Grid call got through")
    assert summary["finished"] is False and summary["superlink-outages"] == 1
    assert summary["rejected-updates"] == 0 and summary["arrivals"] == 3
    rows = (run / "metrics.csv").read_text().splitlines()
    assert rows[-1].split(",")[rows[0].split(",").index("arrivals")] == str(summary["arrivals"])
    assert list((run / "checkpoints").glob("*.npz"))


def test_a_run_flower_stops_after_an_outage_says_so_before_the_process_is_gone(tmp_path):
    """Flower 1.42's SuperLink fails a ServerApp task whose heartbeat lapsed (60 s) during an outage; a call once it
    is back is refused (401) and Flower stops its own process from the main thread: exit handlers, then
    ``SystemExit``, and ``os._exit`` 5 s later, maybe before the run's ``finally``. summary.json is written from the
    exit handlers."""
    from flwr.supercore.exit.exit_handler import trigger_exit_handlers

    written = {}

    def flower_stops_the_process():
        trigger_exit_handlers(run_before_force_exit=True)  # what flwr_exit runs before its force-exit timer
        written.update(json.loads((tmp_path / "run" / "summary.json").read_text()))
        raise SystemExit(1)

    grid = OutageGrid(2, honest, down_after=4, lost="unavailable", on_back=flower_stops_the_process)
    with pytest.raises(SystemExit):
        _start(grid, tmp_path)
    assert written["stop-reason"].startswith("interrupted (the ServerApp process is exiting on a signal")
    assert "SuperLink outage" in written["stop-reason"] and written["finished"] is False
    assert written["superlink-outages"] == 1 and written["arrivals"] == 3
    final = json.loads((tmp_path / "run" / "summary.json").read_text())  # the run's own end, here in time
    assert final["stop-reason"].startswith("interrupted (the process was told to exit, code 1")
    assert "SuperLink outage" in final["stop-reason"]


class RefusingGrid(RetryingOutageGrid):
    """Flower 1.42's SuperLink once back refuses a ServerApp task whose heartbeat lapsed: every push answers 401, on
    which Flower's retry stops the process (``should_giveup`` sends SIGINT; the ServerApp's handler exits)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._retry_invoker = RetryInvoker(lambda: exponential(0.01, 2, 0.1), (httpx.ConnectError,
                                                                               httpx.HTTPStatusError), None, None,
                                           jitter=None, should_giveup=self._flower_gives_up)

    @staticmethod
    def _flower_gives_up(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 401:
            raise SystemExit(2)  # what Flower's signal handler does in the main thread
        return False

    def push_messages(self, messages):
        return self._retry_invoker.invoke(self._refusing_push, list(messages))

    def _refusing_push(self, messages):
        with self._lock:
            self._check_link()
            if self.came_back is not None:
                raise httpx.HTTPStatusError("401 Unauthorized", request=httpx.Request("POST", "http://superlink"),
                                            response=httpx.Response(401))
        return OutageGrid.push_messages(self, messages)


def test_a_task_the_superlink_refuses_after_an_outage_is_named_in_the_stop_reason(tmp_path):
    grid = RefusingGrid(2, honest, down_after=4, lost="unavailable")
    with pytest.raises(SystemExit):
        _start(grid, tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop-reason"].startswith("interrupted (the process was told to exit, code 2")
    assert "SuperLink outage" in summary["stop-reason"]
    assert "the SuperLink refused the run's task token (HTTP 401)" in summary["stop-reason"]


@pytest.mark.parametrize("lost", ["nothing", "unavailable"])
def test_on_the_virtual_clock_an_outage_changes_nothing_the_seed_gives(lost):
    # Prepare: the same seeded run without and with an outage, from the 4th dispatch, whose restart loses the replies
    # the SuperLink held
    baseline = make_engine(FakeGrid(4, plus_one), Recording(), max_arrivals=10, timeout=JOB_TIMEOUT)
    baseline.run()
    grid = OutageGrid(4, plus_one, down_after=4, lost=lost)
    engine = make_engine(grid, Recording(), max_arrivals=10, timeout=JOB_TIMEOUT)
    # Execute
    engine.run()
    # Assert: the same arrivals in the same order (the lost jobs went out again as they were), none counted failing
    assert engine.strategy.seen == baseline.strategy.seen
    assert np.array_equal(engine.global_model, baseline.global_model)
    assert engine.grid.summary()["superlink-outages"] == 1
    assert engine.stats.outage_jobs == engine.stats.outage_resent == len(grid.lost_nodes) >= 1
    assert engine.stats.rejected == {} and engine.state.failures_in_a_row == 0 and not engine.state.failing_clients


def test_a_grid_error_that_is_no_outage_still_ends_the_run():
    assert is_unreachable(httpx.ConnectError("refused")) and is_unreachable(ConnectionResetError())
    assert is_unreachable(httpx.HTTPStatusError("503", request=httpx.Request("POST", "http://x"),
                                                response=httpx.Response(503)))
    assert not is_unreachable(httpx.HTTPStatusError("500", request=httpx.Request("POST", "http://x"),
                                                    response=httpx.Response(500)))
    assert not is_unreachable(ValueError("a malformed message"))


@pytest.mark.parametrize("limit", [0.0, -1.0, float("nan")])
def test_a_bad_outage_limit_is_refused_in_one_line(limit):
    with pytest.raises(ConfigError) as refused:
        Link(FakeGrid(1, honest), limit)
    message = str(refused.value)
    assert "\n" not in message and "3 x timeout; a timeout must be a number of seconds > 0" in message


def test_the_outage_limit_is_three_job_timeouts():
    assert outage_limit(30.0) == 90.0 and outage_limit(float("inf")) == float("inf")


def test_flowers_simulation_grid_is_still_recognised_through_the_link():
    # Flower's simulation runtime (its InMemoryGrid) is found inside the Link: its Ray actors are counted
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from asyncfl.server_app.clock import WallClock

    clock = WallClock(delays=None)
    clock.puller(Link(InMemoryGrid.__new__(InMemoryGrid), 1.0), concurrency=2)
    assert clock.simulation_workers is not None


class LostObjectsGrid(FakeGrid):
    """A SuperLink restarted between a message and its objects: the 4th push raises Flower's ObjectPushError (its
    push session gone) and the 6th pull Flower's ObjectUnavailableError (a reply's objects gone)."""

    def __init__(self, n, handler):
        super().__init__(n, handler)
        self.pushes = self.pulls = 0

    def push_messages(self, messages):
        self.pushes += 1
        if self.pushes == 4:
            raise ObjectPushError("obj", 1, "session")
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        self.pulls += 1
        if self.pulls == 6:
            raise ObjectUnavailableError("obj")
        return super().pull_messages(message_ids)


def test_a_message_whose_objects_the_superlink_lost_is_lost_not_the_run(tmp_path):
    result = _start(LostObjectsGrid(2, honest), tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop-reason"] == result.summary["stop-reason"] == "max-arrivals 8 reached"
    assert summary["arrivals"] == 8 and summary["superlink-outages"] >= 1
    assert set(summary["rejected-by-reason"]) <= {"push-refused"}  # the lost push; no client counted failing
