"""The consensus projection: an update's component against the recent updates' average is taken out (by hand)."""

import numpy as np
import pytest

from asyncfl.server_app.consensus import ConsensusProjection
from asyncfl.strategies.arrival import Arrival


def arrival(delta, base=(0.0, 0.0), client=0) -> Arrival:
    base = np.asarray(base, np.float32)
    return Arrival(client, 0, 0, base + np.asarray(delta, np.float32), base, 1, 0.0, 0.0)


def test_the_first_update_passes_and_starts_the_consensus_as_its_direction():
    projection = ConsensusProjection(decay=0.5)
    first = arrival([3.0, 4.0])
    assert projection.apply(first) is first
    assert projection.mean == pytest.approx([0.3, 0.4])  # (1 - 0.5) x (0.6, 0.8): a unit vote


def test_an_update_against_the_consensus_keeps_only_its_orthogonal_part():
    """Consensus along x; an update (-2, 1) from base (1, 1) loses its -2 along x: aggregated as (1, 2)."""
    projection = ConsensusProjection(decay=0.5)
    projection.apply(arrival([5.0, 0.0]))
    out = projection.apply(arrival([-2.0, 1.0], base=(1.0, 1.0), client=1))
    assert out.weights == pytest.approx([1.0, 2.0])
    assert out.delta == pytest.approx([0.0, 1.0])
    assert projection.projected == 1
    assert projection.mean == pytest.approx([0.25, 0.5])  # 0.5 x (0.5, 0) + 0.5 x (0, 1)


def test_an_update_in_the_consensus_half_space_passes_as_it_came():
    projection = ConsensusProjection()
    projection.apply(arrival([1.0, 0.0]))
    agreeing = arrival([0.1, -50.0], client=1)  # nearly orthogonal, but on the consensus' side
    assert projection.apply(agreeing) is agreeing and projection.projected == 0


def test_a_large_update_votes_no_more_than_a_small_one():
    """Raw averaging let an update at the bound's ceiling steer the consensus toward itself; a unit vote does not."""
    projection = ConsensusProjection(decay=0.5)
    projection.apply(arrival([1.0, 0.0]))
    projection.apply(arrival([0.0, 1000.0], client=1))
    assert projection.mean == pytest.approx([0.25, 0.5])


def test_only_the_masked_entries_are_projected():
    projection = ConsensusProjection(mask=np.array([True, False]), decay=0.5)
    projection.apply(arrival([1.0, 0.0]))
    out = projection.apply(arrival([-3.0, -7.0], client=1))
    assert out.delta == pytest.approx([0.0, -7.0])  # the unmasked entry is the norm bound's alone


def test_a_sign_flipped_sender_is_held_to_no_progress_against_honest_ones():
    """Seven clients send noisy copies of g; the eighth sends -g. After the projection the flipper's updates
    have no component along g, so the aggregate still moves along g as seven honest clients' would."""
    rng = np.random.default_rng(0)
    g = rng.normal(size=50).astype(np.float32)
    projection, total = ConsensusProjection(), np.zeros(50, np.float32)
    for step in range(200):
        client = step % 8
        delta = -g if client == 0 else g + rng.normal(scale=1.0, size=50).astype(np.float32)
        total += projection.apply(arrival(delta, base=np.zeros(50), client=client)).delta
    honest_only = 175 * g  # 175 honest updates of mean g
    assert float(np.dot(total, g)) >= 0.95 * float(np.dot(honest_only, g))
