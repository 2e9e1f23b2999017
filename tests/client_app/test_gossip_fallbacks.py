"""The order in which a gossip peer retries an event whose model left the bounds, and how it picks the suspect."""

import numpy as np
import pytest

from asyncfl.client_app.gossip import fallbacks
from asyncfl.decentralized.baselines import AsyncDFedAvg
from asyncfl.decentralized.bitpack import pack_indices
from asyncfl.decentralized.codec import CENTROIDS, INDICES, Layout
from asyncfl.decentralized.divshare import DivShare, fragment_indices
from asyncfl.decentralized.peer import Received
from asyncfl.decentralized.pushcen import PushCen
from asyncfl.decentralized.wcp import index_bits


def _message(sender, value):
    return Received({"w": np.array([value], np.float32)}, 0.25, sender)


def _tried(received, **kwargs):
    return [(start, [r.sender for r in merged])
            for _, start, merged in fallbacks(received, lambda rs: rs[-1], **kwargs)]


def test_fallbacks_drop_the_farthest_senders_messages_then_every_message_then_restart():
    # Prepare: sender 3 is the suspect and sent twice (no deduplication); sender 1 once
    received = [_message(1, 1.0), _message(3, 4.0), _message(3, 5.0)]
    # Execute / Assert
    assert _tried(received) == [("stored", [1, 3, 3]), ("stored", [1]), ("stored", []), ("trained", []),
                                ("initial", [])]


def test_the_suspect_is_looked_for_only_once_the_first_event_failed_and_only_among_two_senders_or_more():
    # Prepare
    asked = []
    attempts = fallbacks([_message(1, 1.0), _message(2, 2.0)], lambda rs: asked.append(1) or rs[0])
    # Execute
    next(attempts)
    # Assert
    assert asked == []
    next(attempts)
    assert asked == [1]
    one_sender = fallbacks([_message(2, 1.0), _message(2, 2.0)], lambda rs: asked.append(2) or rs[0])
    assert [start for _, start, _ in one_sender] == ["stored", "stored", "trained", "initial"] and asked == [1]


def test_with_one_sender_or_none_there_is_no_suspect_and_a_method_that_trains_first_restarts_at_once():
    # Execute / Assert
    restarts = [("trained", []), ("initial", [])]
    assert _tried([_message(1, 1.0)]) == [("stored", [1]), ("stored", [])] + restarts
    assert _tried([_message(2, 1.0), _message(2, 3.0)]) == [("stored", [2, 2]), ("stored", [])] + restarts
    assert _tried([]) == [("stored", [])] + restarts
    assert _tried([_message(1, 1.0), _message(2, 3.0)], trains_before_merging=True) == [("stored", [1, 2])] + restarts


def test_a_whole_models_distance_is_the_rms_of_its_difference_to_the_receivers_model():
    # Prepare: differences (3, -4) and (0, 0): RMS sqrt(25 / 4)
    own = {"a": np.array([1.0, 1.0], np.float32), "b": np.array([2.0, 2.0], np.float32)}
    message = {"a": np.array([4.0, -3.0], np.float32), "b": np.array([2.0, 2.0], np.float32)}
    # Execute / Assert
    assert AsyncDFedAvg().distance(message, own, None, ["a", "b"]) == pytest.approx(2.5)


def test_pushcens_distance_is_over_the_decoded_layer_not_its_small_centroid_table():
    # Prepare: a 4-weight layer of k = 4 (three non-zero centroids, ascending); every index on centroid 0.3
    class FakeLayout:
        kinds, shapes = {"w": "clustered"}, {"w": (4,)}
    centroids = np.array([0.001, 0.002, 0.3], np.float32)
    indices = np.full(4, 3)  # entry 0 of the table is the implied zero
    message = {"w" + CENTROIDS: centroids, "w" + INDICES: np.frombuffer(pack_indices(indices, index_bits(4)), np.uint8)}
    own = {"w": np.zeros(4, np.float32)}
    # Execute / Assert: 0.3 everywhere, where the table's own RMS is 0.17
    assert PushCen().distance(message, own, FakeLayout(), ["w"]) == pytest.approx(0.3, rel=1e-6)


def test_divshares_distance_is_over_the_fragments_own_coordinates():
    # Prepare: a 6-value model of 0..5, fragment 1 of 2 (seed 7) carrying its coordinates' values + 2
    flat = np.arange(6, dtype=np.float32)
    coordinates = fragment_indices(6, 2, 7)[1]
    message = {"values": flat[coordinates] + 2.0, "fragment": np.array([7, 1, 2], np.int64)}
    own = {"a": flat[:2].copy(), "b": flat[2:].copy()}
    # Execute / Assert
    assert DivShare().distance(message, own, None, ["a", "b"]) == pytest.approx(2.0)
