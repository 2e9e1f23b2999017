"""Rows of the training split that the server keeps for itself.

``server-holdout`` removes a seeded, class-stratified fraction of the training
split from every client's partitioning (clients never see those rows); methods
that distil on the server (FedEcho with ``distill-set = "holdout"``) use them
with their labels dropped.
"""

from __future__ import annotations

import numpy as np


def stratified_rows(labels: np.ndarray, fraction: float, seed: int, salt: int) -> np.ndarray:
    """A seeded, class-stratified ``fraction`` of the rows (at least one per class present), sorted."""
    rng = np.random.default_rng([seed, salt])
    rows = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rows.append(rng.choice(members, size=max(1, int(round(fraction * len(members)))), replace=False))
    return np.sort(np.concatenate(rows))


def holdout_rows(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The server's hold-out rows; empty when ``fraction`` is 0."""
    if fraction <= 0.0:
        return np.zeros(0, dtype=np.int64)
    return stratified_rows(labels, fraction, seed, salt=7)


def client_pool(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The training rows the clients partition among themselves: all but the hold-out."""
    keep = np.ones(len(labels), dtype=bool)
    keep[holdout_rows(labels, fraction, seed)] = False
    return np.flatnonzero(keep)
