"""Run failures are typed: catchable one by one, still RuntimeErrors, and Flower exits with its ServerApp code."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from flwr.app.exception import AppExitException
from flwr.supercore.exit import ExitCode

import asyncfl
from asyncfl.errors import NoNodesConnected
from tests.fake_grid import FakeGrid


def test_a_run_with_no_node_raises_no_nodes_connected_naming_the_wait():
    grid = FakeGrid(0, lambda node, message: None)
    with pytest.raises(NoNodesConnected, match="no node connected within") as error:
        asyncfl.FedBuff().start(grid, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), num_rounds=1,
                                wait_for_nodes=0.2)
    assert isinstance(error.value, RuntimeError) and isinstance(error.value, AppExitException)
    assert error.value.exit_code == ExitCode.SERVERAPP_EXCEPTION


def test_every_run_failure_is_public_and_a_run_failed():
    for name in ("NoNodesConnected", "NothingToDispatch", "ClientAppsFailing", "TooFewPeers", "MissingClientInfo"):
        assert issubclass(getattr(asyncfl, name), asyncfl.RunFailed)
