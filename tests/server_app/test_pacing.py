"""The pull pacer of the virtual clock's reply loop: its backoff by hand."""

from __future__ import annotations

import pytest

from asyncfl.server_app import pacing
from asyncfl.server_app.pacing import PollPacer


@pytest.fixture
def slept(monkeypatch):
    seconds: list[float] = []
    monkeypatch.setattr(pacing.time, "sleep", seconds.append)
    return seconds


def test_while_nothing_arrives_the_backoff_doubles_to_its_longest(slept):
    pacer = PollPacer(first=0.001, longest=0.05)
    for _ in range(8):
        pacer.wait(0.0, got=0)
    assert slept == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05])
    pacer.wait(0.0, got=1)  # a reply came: no idle wait
    pacer.progress()
    pacer.wait(0.0, got=0)
    assert slept[-2:] == pytest.approx([0.0, 0.001])
    pacer.wait(0.01, got=1)  # a pull of 10 ms: at least duty (4) times it before the next
    assert slept[-1] == pytest.approx(0.04)
