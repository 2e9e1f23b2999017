"""ThreadedPuller: how often each in-flight message is pulled (fake clock, counting grid)."""

import threading
import time

from asyncfl.server_app.puller import ThreadedPuller


class CountingGrid:
    """Never has a reply; counts the pulls of each message id."""

    def __init__(self) -> None:
        self.pulls: dict[str, int] = {}
        self._lock = threading.Lock()

    def pull_messages(self, message_ids):
        with self._lock:
            for message_id in message_ids:
                self.pulls[message_id] = self.pulls.get(message_id, 0) + 1
        return []


def _settle(puller: ThreadedPuller, expected: int) -> None:
    deadline = time.monotonic() + 5.0
    while puller.pulls < expected and time.monotonic() < deadline:
        time.sleep(0.005)


def test_the_wait_between_pulls_grows_with_the_message_age_within_bounds():
    puller = ThreadedPuller(CountingGrid(), workers=1, min_interval=0.2, max_interval=1.0, age_fraction=0.125)
    assert puller.interval(0.0) == 0.2  # young: the floor
    assert puller.interval(4.0) == 0.5  # an eighth of its age
    assert puller.interval(60.0) == 1.0  # old: the cap


def test_the_cap_defaults_to_the_class_value_which_an_ablation_may_set(monkeypatch):
    assert ThreadedPuller(CountingGrid(), workers=1).interval(60.0) == ThreadedPuller.MAX_INTERVAL == 1.0
    monkeypatch.setattr(ThreadedPuller, "MAX_INTERVAL", 2.5)
    puller = ThreadedPuller(CountingGrid(), workers=1)
    assert (puller.interval(8.0), puller.interval(16.0), puller.interval(60.0)) == (1.0, 2.0, 2.5)
    assert ThreadedPuller(CountingGrid(), workers=1, max_interval=0.5).interval(60.0) == 0.5  # an explicit cap wins


def test_a_message_is_pulled_again_only_after_its_interval():
    now = [0.0]
    grid = CountingGrid()
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    puller.poll(["m"])  # first sight: pulled at once
    _settle(puller, 1)
    for t in (0.1, 0.19):  # within the 0.2 s floor: not again
        now[0] = t
        puller.poll(["m"])
    now[0] = 0.25
    puller.poll(["m"])
    _settle(puller, 2)
    assert grid.pulls == {"m": 2}
    # At age 8 s the wait is 1 s: a poll 0.9 s after the last pull does not pull, one 1.05 s after does.
    now[0] = 8.0
    puller.poll(["m"])
    _settle(puller, 3)
    now[0] = 8.9
    puller.poll(["m"])
    now[0] = 9.05
    puller.poll(["m"])
    _settle(puller, 4)
    assert grid.pulls == {"m": 4}


def test_forgotten_messages_start_young_again():
    now = [0.0]
    grid = CountingGrid()
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    puller.poll(["m"])
    _settle(puller, 1)
    now[0] = 50.0
    puller.forget("m")
    puller.poll(["m"])  # a fresh message under a reused id: pulled at once, then at the floor again
    _settle(puller, 2)
    now[0] = 50.25
    puller.poll(["m"])
    _settle(puller, 3)
    assert grid.pulls == {"m": 3}


def test_a_message_whose_reply_was_pulled_is_not_pulled_again():
    """The SuperLink deletes a job once its reply is pulled; pulling the id again only brings Flower's
    MESSAGE_UNAVAILABLE error (and costs a request)."""
    import threading as _threading

    class Grid:
        def __init__(self):
            self.pulls, self.done = [], _threading.Event()

        def pull_messages(self, ids):
            self.pulls.extend(ids)
            self.done.set()
            return [object()]

    grid, now = Grid(), [0.0]
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    puller.poll(["m"])
    assert grid.done.wait(10)
    deadline = time.monotonic() + 10
    got = []
    while not got and time.monotonic() < deadline:
        got = puller.poll(["m"])
    now[0] += 100.0  # long past any interval: an id not yet delivered would be pulled again
    puller.poll(["m"])
    assert puller._requests.empty() and "m" not in puller._pending  # no second pull asked for
    assert grid.pulls == ["m"] and len(got) == 1


class ReadyAtGrid:
    """A message's reply is there from a given (fake) time on; counts every pull and when it started."""

    def __init__(self, now: list[float], ready_at: dict[str, float]) -> None:
        self.now, self.ready_at, self.pulled_at = now, ready_at, []
        self._lock = threading.Lock()

    def pull_messages(self, message_ids):
        (message_id,) = message_ids
        with self._lock:
            self.pulled_at.append((message_id, self.now[0]))
        return [message_id] if self.now[0] >= self.ready_at[message_id] else []


def _poll_at(puller, now, t, waiting, sources):
    """Poll at fake time ``t``; wait until any pull that poll asked for has ended."""
    now[0] = t
    got = puller.poll(waiting, sources)
    deadline = time.monotonic() + 5.0
    while puller._pending and time.monotonic() < deadline:
        time.sleep(0.002)
    return got + puller.poll([], sources)


def test_a_client_s_next_reply_is_pulled_at_its_learned_time_then_densely():
    now = [0.0]
    grid = ReadyAtGrid(now, {"a1": 6.3, "a2": 106.3, "b1": 1000.0})
    puller = ThreadedPuller(grid, workers=1, min_interval=0.2, max_interval=1.0, age_fraction=0.125, fine=0.05,
                            clock=lambda: now[0])
    # First job of client "a": the age rule alone (at age 6.3 s its wait is 0.79 s): misses at 5.6 and, too soon
    # after it, no pull at 6.3, where the reply is ready; found at 6.4, 0.1 s late.
    for t in (0.0, 5.6, 6.3):
        assert _poll_at(puller, now, t, ["a1"], {"a1": "a"}) == []
    assert _poll_at(puller, now, 6.4, ["a1"], {"a1": "a"}) == ["a1"]
    assert puller.ready_after == {"a": 5.6}  # not there at 5.6 s: a lower bound on a's time to reply
    puller.forget("a1")
    # Its next job, first seen at 100 s: the age rule would wait 0.6-0.7 s around age 5.6, the learned time pulls
    # at 105.6 exactly and then every 0.05 s.
    assert _poll_at(puller, now, 100.0, ["a2", "b1"], {"a2": "a", "b1": "b"}) == []
    assert _poll_at(puller, now, 105.0, ["a2", "b1"], {"a2": "a", "b1": "b"}) == []
    grid.pulled_at.clear()
    for t in (105.55, 105.6, 105.62, 105.66):
        _poll_at(puller, now, t, ["a2", "b1"], {"a2": "a", "b1": "b"})
    # b (nothing learned) keeps the age rule's 0.66 s wait after its pull at 105.0; a: 105.6 (due), then 0.05 later
    assert grid.pulled_at == [("a2", 105.6), ("a2", 105.66)]
    got = []
    for t in (105.7, 105.75, 105.8, 106.0, 106.3, 106.35):
        got += _poll_at(puller, now, t, ["a2"], {"a2": "a"})
    assert got == ["a2"]
    # after the due moment the wait is a quarter of the time since, at least 0.05 s: a reply 0.7 s after the learned
    # time is still found at the first poll that sees it (the age rule's wait there would be 0.79 s)
    found = [t for m, t in grid.pulled_at if m == "a2"][-1]
    assert 106.3 <= found <= 106.35
    assert puller.ready_after["a"] == [t for m, t in grid.pulled_at if m == "a2"][-2] - 100.0
    # the puller's own delay, as a bound: from the last miss to the finding pull, 6.4 - 5.6 for a1, then a2's
    a2_last_miss = [t for m, t in grid.pulled_at if m == "a2"][-2]
    assert puller.miss_gap[1] == 2 and abs(puller.miss_gap[0] - (0.8 + found - a2_last_miss)) < 1e-9


def test_a_reply_found_at_its_first_pull_teaches_nothing_and_no_source_means_the_age_rule():
    now = [0.0]
    grid = ReadyAtGrid(now, {"x": 0.0, "y": 50.0})
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    assert _poll_at(puller, now, 0.0, ["x"], {"x": "c"}) == ["x"]
    assert puller.ready_after == {}
    assert _poll_at(puller, now, 0.0, ["y"], None) == []
    assert _poll_at(puller, now, 49.0, ["y"], None) == []
    assert _poll_at(puller, now, 50.0, ["y"], None) == ["y"]
    assert puller.ready_after == {}  # no client named: nothing learned
    assert puller.wait_after(8.0, None) == puller.interval(8.0) == 1.0
    assert puller.wait_after(8.0, 7.9) == 0.05 and puller.wait_after(8.0, 6.0) == 0.5  # (8 - 6) / 4
    assert puller.wait_after(40.0, 10.0) == 1.0  # never longer than the age rule
    ablated = ThreadedPuller(ReadyAtGrid(now, {"z": 51.0}), workers=1, fine=0.0, clock=lambda: now[0])
    for t in (50.0, 50.5, 51.0):
        _poll_at(ablated, now, t, ["z"], {"z": "c"})
    assert ablated.pulls == 3 and ablated.ready_after == {}  # fine 0: the age rule alone, nothing learned


def test_a_failed_pull_is_neither_a_miss_nor_a_find():
    class FailsOnce(ReadyAtGrid):
        def pull_messages(self, message_ids):
            if self.now[0] == 1.0:
                raise ConnectionError("the SuperLink did not answer")
            return super().pull_messages(message_ids)

    now = [0.0]
    puller = ThreadedPuller(FailsOnce(now, {"m": 1.5}), workers=1, clock=lambda: now[0])
    for t in (0.0, 1.0):
        assert _poll_at(puller, now, t, ["m"], {"m": "c"}) == []
    assert _poll_at(puller, now, 2.0, ["m"], {"m": "c"}) == ["m"]
    # the failed pull at 1.0 says nothing: the lower bound stays the miss at 0.0, and one reply was found after it
    assert puller.errors == 1 and puller.ready_after == {"c": 0.0} and puller.miss_gap == (2.0, 1)


def test_a_message_forgotten_while_its_pull_runs_leaves_nothing_behind():
    release = threading.Event()

    class Stuck:
        def pull_messages(self, message_ids):
            release.wait(10)
            return ["an error reply after the upload session expired"]

    puller = ThreadedPuller(Stuck(), workers=1)
    puller.poll(["x"], {"x": "c"})
    deadline = time.monotonic() + 5
    while puller._requests.qsize() and time.monotonic() < deadline:  # the worker has taken it
        time.sleep(0.002)
    puller.forget("x")  # its job was lost meanwhile (timed out, node offline)
    release.set()
    _settle(puller, 1)
    time.sleep(0.05)
    assert puller.poll([]) == []  # the reply of a forgotten job is not handed on
    assert not (puller._last_try or puller._last_miss or puller._delivered or puller._first_seen or puller._pending)


def test_an_early_reply_and_an_error_reply_update_what_was_learned():
    class ErrorReply:
        def has_error(self):
            return True

    now = [0.0]
    grid = ReadyAtGrid(now, {"early": 0.0, "error": 0.0})
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    puller.ready_after["c"] = 5.0
    assert _poll_at(puller, now, 0.0, ["early"], {"early": "c"}) == ["early"]
    assert puller.ready_after == {}  # found at its first pull: the old bound is dropped, not kept
    puller.ready_after["c"] = 5.0
    grid.pull_messages = lambda ids: [ErrorReply()] if now[0] >= 1.0 else []
    assert _poll_at(puller, now, 0.0, ["error"], {"error": "c"}) == []
    assert len(_poll_at(puller, now, 1.0, ["error"], {"error": "c"})) == 1
    assert puller.ready_after == {"c": 5.0} and puller.miss_gap == (0.0, 0)  # an error reply teaches nothing


def test_threads_start_with_work_and_end_when_idle_a_held_one_when_its_pull_returns():
    """No thread before the first poll; idle threads end after ``idle_s``, one held in a pull once it returns (a
    finished run's puller holds no thread for long); a later poll starts threads again."""
    release = threading.Event()

    class OneStuck(CountingGrid):
        def pull_messages(self, message_ids):
            if "stuck" in message_ids:
                release.wait(10)
            return super().pull_messages(message_ids)

    grid = OneStuck()
    puller = ThreadedPuller(grid, workers=3, idle_s=0.05)
    assert puller.threads == 0
    puller.poll(["stuck", "a"])
    assert puller.threads == 2
    _wait_for(lambda: puller.threads == 1 and grid.pulls.get("a") == 1)  # the idle one ended, the held one not
    assert puller.threads == 1
    release.set()
    _wait_for(lambda: puller.threads == 0)
    assert puller.threads == 0 and grid.pulls["stuck"] == 1
    puller.poll(["b"])
    _wait_for(lambda: grid.pulls.get("b") == 1)
    assert grid.pulls.get("b") == 1


def _wait_for(condition, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.002)
