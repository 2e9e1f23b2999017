"""Shared fixtures: Flower's task identity for building Messages outside a run."""

import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture(autouse=True)
def task_identity():
    """Messages need a run id; a real ServerApp process has one, unit tests set it."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    yield
