"""Shared fixtures: Flower's task identity for building Messages outside a run; a private node-data cache."""

import atexit
import os
import shutil
import tempfile

import pytest
from flwr.supercore.task_identity import TaskIdentity

# ClientApps started by the tests (also in subprocesses) cache node data here, not in the user's home.
if "ASYNCFL_CACHE_DIR" not in os.environ:
    os.environ["ASYNCFL_CACHE_DIR"] = tempfile.mkdtemp(prefix="asyncfl-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ASYNCFL_CACHE_DIR"], ignore_errors=True)  # the session made it


@pytest.fixture(autouse=True)
def task_identity():
    """Messages need a run id; a real ServerApp process has one, unit tests set it."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    yield
