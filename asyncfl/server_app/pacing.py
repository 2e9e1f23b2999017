"""How often to pull replies: fast when they come, slower when they do not, never at the producer's expense.

A pull of ``k`` message ids costs the SuperLink (or, in a simulation, the link
state that Flower's simulation runtime shares with the ServerApp, under one
lock) work in ``k``. Polling thousands of pending ids every few milliseconds
starves the runtime that produces the replies: the simulation process spends
its core inside our pulls while the Ray workers answering them idle (measured in
a 10,000-node identity discovery: docs/scale.md, benchmarks/scale/README.md).
So after every pull the caller waits at least ``duty`` times what that pull
took (pulling then takes at most ``1 / (1 + duty)`` of the wall time, whatever
``k`` is), and, while nothing arrives, a backoff that doubles from ``first`` to
``longest``.
"""

from __future__ import annotations

import time


class PollPacer:
    """Waits between pulls.

    Parameters
    ----------
    first, longest : float
        Backoff bounds in seconds while pulls return nothing.
    duty : float
        Wait at least this many times the last pull's duration.
    """

    def __init__(self, first: float = 0.001, longest: float = 0.05, duty: float = 4.0) -> None:
        self.first, self.longest, self.duty = first, longest, duty
        self._backoff = first

    def progress(self) -> None:
        """Something useful happened: poll quickly again."""
        self._backoff = self.first

    def wait(self, pull_seconds: float, got: int) -> None:
        """Sleep after a pull that took ``pull_seconds`` and returned ``got`` replies."""
        idle = 0.0 if got else self._backoff
        time.sleep(max(idle, self.duty * pull_seconds))
        if not got:
            self._backoff = min(2 * self._backoff, self.longest)
