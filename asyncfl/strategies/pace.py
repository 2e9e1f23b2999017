"""The default server step of methods that add client deltas: one mean update per K arrivals, as FedAvg.

With ``K`` jobs in flight, a job's base model is about ``K`` accepted updates old when its
update arrives (under equal speeds ``K - 1`` others land while it trains). If every update
moves the global model by ``w * Delta``, the model drifts by about ``K * w`` mean updates
during one job. Synchronous FedAvg with a cohort of ``K`` moves by exactly one mean update
per ``K`` updates and its updates are never stale; ``w = 1 / K`` gives the asynchronous
server the same pace per client update, so no update was computed on a model more than
about one FedAvg step away. Larger ``w`` (FedBuff's ``eta_s = 1`` with ``B < K``: ``K / B``
mean updates per job) amplifies stale directions: on Flower's quickstart app with SGD
momentum 0.9 at lr 0.1, FedBuff with ``eta_s = 1, B = 5, K = 8`` oscillated and ended at
0.59 mean accuracy (3 seeds) where FedAvg ended at 0.92 (``benchmarks/dropin``). Smaller
``w`` learns slower than FedAvg at equal client work.

It is the condition analyses of delayed SGD put on the step size (of order one over the
delay), written in FL terms. A method's paper setting (FedBuff's ``eta_s = 1``) stays a
keyword away.
"""

from __future__ import annotations


def per_update_share(concurrency: int) -> float:
    """``w = 1 / K``: the share of its delta one update adds to the global model."""
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be >= 1")
    return 1.0 / concurrency


def paced_server_lr(updates_per_step: int, concurrency: int) -> float:
    """A buffered method's server learning rate for ``updates_per_step`` updates averaged per step:
    ``min(1, B / K)`` (``B >= K`` is FedAvg's full step, never more)."""
    return min(1.0, updates_per_step * per_update_share(concurrency))
