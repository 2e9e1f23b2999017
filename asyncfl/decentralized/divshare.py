"""DivShare (Biswas et al., 2025, "Boosting asynchronous decentralized learning with model fragmentation").

A sender cuts its model into as many fragments as it has out-neighbours (a
seeded random partition of the coordinates, redrawn every push) and sends a
different fragment to each, so one push costs about one model in total instead
of one model per neighbour. A receiver averages, coordinate by coordinate, its
own value with every received value of that coordinate. A fragment carries its
values plus ``(seed, fragment id, fragments)``, from which the receiver
regenerates the coordinate indices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def fragment_indices(size: int, fragments: int, seed: int) -> list[np.ndarray]:
    """The seeded partition of ``range(size)`` into ``fragments`` near-equal index sets."""
    if fragments < 1:
        raise ValueError(f"need at least one fragment, got {fragments}")
    return np.array_split(np.random.default_rng([seed, 17]).permutation(size), fragments)


@dataclass(frozen=True)
class Fragment:
    """One fragment on the wire."""

    values: np.ndarray
    seed: int
    index: int
    fragments: int


def split_model(flat: np.ndarray, fragments: int, seed: int) -> list[Fragment]:
    """``flat`` cut into ``fragments`` fragments."""
    return [Fragment(flat[ix].astype(np.float32), seed, i, fragments)
            for i, ix in enumerate(fragment_indices(flat.size, fragments, seed))]


def merge_fragments(own: np.ndarray, received: list[Fragment]) -> np.ndarray:
    """Per coordinate, the mean of the own value and every received value of it."""
    sums = own.astype(np.float64).copy()
    counts = np.ones(own.size)
    for fragment in received:
        index = fragment_indices(own.size, fragment.fragments, fragment.seed)[fragment.index]
        if index.size != fragment.values.size:
            raise ValueError(f"fragment {fragment.index} has {fragment.values.size} values, its index set {index.size}")
        sums[index] += fragment.values
        counts[index] += 1
    return (sums / counts).astype(own.dtype)
