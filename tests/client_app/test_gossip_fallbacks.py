"""The order in which a gossip peer retries an event whose merge left its model out of bounds."""

import numpy as np

from asyncfl.client_app.gossip import fallbacks, largest_message
from asyncfl.decentralized.peer import Received


def _message(sender, *values):
    return Received({"w": np.array(values, np.float32), "index": np.array([7, 9], np.int64)}, 0.25, sender)


def test_the_suspect_is_the_message_of_largest_root_mean_square_and_integer_arrays_do_not_count():
    # Prepare: RMS 1.0, sqrt(12.5) ~ 3.54 and 4.0; one spike of 5 has an RMS of only 3.54 over two values
    quiet, spiky, broad = _message(1, 1.0, -1.0), _message(2, 5.0, 0.0), _message(3, 4.0, -4.0)
    # Execute / Assert
    assert largest_message([quiet, spiky, broad]) is broad
    assert largest_message([quiet, spiky]) is spiky


def test_fallbacks_drop_the_suspect_then_every_message_then_restart():
    # Prepare
    quiet, broad = _message(1, 1.0), _message(3, 4.0)
    # Execute
    tried = fallbacks([quiet, broad])
    # Assert
    assert [(from_initial, [r.sender for r in merged]) for _, from_initial, merged in tried] == [
        (False, [1, 3]), (False, [1]), (False, []), (True, [])]
    assert tried[1][0] == "dropping the message of largest values (peer 3)"


def test_with_one_message_or_none_there_is_no_suspect_to_try():
    # Execute / Assert
    assert [(i, len(m)) for _, i, m in fallbacks([_message(1, 1.0)])] == [(False, 1), (False, 0), (True, 0)]
    assert [(i, len(m)) for _, i, m in fallbacks([])] == [(False, 0), (True, 0)]
