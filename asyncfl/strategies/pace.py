"""The default server step of methods that add client deltas: as large as staleness allows.

With ``K`` jobs in flight and equal speeds, an update is ``K - 1`` accepted updates stale
when it lands, and waits ``(B - 1) / 2`` more on average in a buffer of ``B`` before it is
applied: a delay of ``d = K - 1 + (B - 1) / 2`` updates. If every update adds ``g`` times
its delta, a direction on which a client's update moves the model by ``lambda`` times its
distance to the minimum follows ``x[t+1] = x[t] - g * lambda * x[t-d]``; that recursion is
stable exactly when ``g * lambda < 2 sin(pi / (2 (2d + 1)))``. A local optimizer that
converges on its own has ``lambda < 2``, so

    ``g = sin(pi / (2 (2d + 1)))``  (about ``0.8 / K`` for large ``K``)

is the largest step that stays stable for every such client, whatever the app. It is close
to FedAvg's pace (one mean update per ``K`` updates, ``g = 1 / K``), which sits on the edge:
a FedBuff step of ``B / K`` oscillates at equal speeds where ``B * g`` does not, and the papers'
fixed steps (FedBuff's ``eta_s = 1``: 1.6 mean updates per job at ``B = 5, K = 8``) diverge
(measured in the drop-in study: docs/methods.md, "Default server steps"). With heterogeneous
speeds the delays spread out and the system is more forgiving; equal speeds (e.g. Ray running
same-sized jobs in turn) are the worst case. A method's paper setting stays a keyword away.

That bound is paid in rounds where learning is slow (small client steps: SGD at a small lr).
With ``pace="measured"`` (the default of FedBuff, CA2FL, AFL-DW, FedEcho and FedRevive) a method
measures the clients' response from each client's consecutive jobs
(:mod:`asyncfl.strategies.response`) and guards against
``lambda_bound = min(2, max(1, 3 * lambda_hat))`` instead of 2: up to twice the stable step
for clients that do not overshoot.

The buffer matters as much as the step. With ``B`` close to ``K`` (FedBuff's former ``B = 5`` at
``K = 6``) every update of an aggregation started from the previous version: at equal speeds all
of them are one version stale, and the measured pace oscillated in short runs.
:func:`auto_buffer_size` keeps ``B`` near ``K / 4``, where neither pace does.
"""

from __future__ import annotations

import math

#: What a server step of 0 (automatic) follows: the clients' measured response, or the bound for any client.
PACES = ("measured", "stable")
#: The automatic buffer's bounds: two updates at least (one would let the measured pace read a client's response
#: to its own previous update, see :func:`auto_buffer_size`), ten at most (the FedBuff paper's buffer).
BUFFER_BOUNDS = (2, 10)


def auto_buffer_size(concurrency: int) -> int:
    """A buffered method's default ``B`` for ``K`` jobs in flight: ``K // 4`` within ``[2, 10]``, at most ``K``.

    With ``B`` close to ``K`` nearly every update of a step started from the previous version: at
    equal speeds the staleness is one version for all of them, a single sharp delay on which the
    step resonates, where ``K / B >= 4`` spreads the delays over several versions (measured in the
    drop-in study: docs/methods.md). ``B >= 2`` because with ``B = 1`` and the measured pace a client
    re-dispatched from the model its own update made reads its own delta back as no response.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be >= 1")
    low, high = BUFFER_BOUNDS
    return min(concurrency, high, max(low, concurrency // 4))


def update_delay(concurrency: int, updates_per_step: int = 1) -> float:
    """``d = K - 1 + (B - 1) / 2``: accepted updates between a job's dispatch and its update's application."""
    if concurrency < 1 or updates_per_step < 1:
        raise ValueError(f"concurrency={concurrency} and updates_per_step={updates_per_step} must be >= 1")
    return (concurrency - 1) + (updates_per_step - 1) / 2


def cache_lag(concurrency: int, updates_per_step: int) -> float:
    """``K / 2 - B / 4``: the delay, in updates, that re-applying cached updates adds (CA2FL).

    CA2FL adds the mean of every client's cached update at each step until the client's next
    update replaces it, about ``K`` arrivals later, so an update's weight is spread over those
    arrivals instead of landing once. On the scalar recursion with equal speeds the largest
    stable step then is close to the stable pace of a delay ``d + K / 2 - B / 4`` at ``B = K / 4``,
    and below it for larger buffers (how close, measured on the recursion for ``K`` from 6 to 100:
    docs/methods.md, "Default server steps"; ``tests/strategies/test_pace.py`` runs the recursion through
    :class:`~asyncfl.strategies.ca2fl.CA2FL`). At ``K = 8, B = 2`` the step is
    0.69 times FedBuff's; at FedBuff's step CA2FL oscillated (docs/methods.md).
    """
    return max(0.0, concurrency / 2 - updates_per_step / 4)


def per_update_share(concurrency: int, updates_per_step: int = 1, extra_delay: float = 0.0) -> float:
    """``g = sin(pi / (2 (2d + 1)))``: the share of its delta one update adds to the global model
    (``extra_delay`` updates added to ``d``, e.g. :func:`cache_lag`)."""
    return math.sin(math.pi / (2 * (2 * (update_delay(concurrency, updates_per_step) + extra_delay) + 1)))


def paced_server_lr(updates_per_step: int, concurrency: int, response_bound: float = 2.0,
                    extra_delay: float = 0.0) -> float:
    """A method's server learning rate when it averages ``updates_per_step`` updates per step:
    ``min(1, B * g * 2 / lambda_bound)``; ``lambda_bound = 2`` (any client) is the stable pace, a smaller
    measured bound (:class:`asyncfl.strategies.response.ResponseMeter`) a proportionally larger step."""
    share = per_update_share(concurrency, updates_per_step, extra_delay) * 2.0 / response_bound
    return min(1.0, updates_per_step * share)
