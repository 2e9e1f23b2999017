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


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the class is what is tested
        return exc
    raise AssertionError("nothing raised")


def test_a_bad_setting_is_a_config_error_wherever_it_is_made():
    # The same mistake, made in Python and through the built-in app's run-config, is the one class users catch.
    import tomllib
    from pathlib import Path

    from asyncfl.client_app.drills import check_drill
    from asyncfl.config import parse_run_config
    from asyncfl.data.datasets import load_dataset
    from asyncfl.data.partition import _make_partitioner
    from asyncfl.decentralized.peer import PeerConfig
    from asyncfl.decentralized.settings import GossipConfig
    from asyncfl.errors import ConfigError
    from asyncfl.models.zoo import build_model
    from asyncfl.simulation.delays import ComponentDelay, parse_tiers
    from asyncfl.strategies.registry import strategy_class

    defaults = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    cfg = defaults["tool"]["flwr"]["app"]["config"]
    pairs = [
        (lambda: strategy_class("fedprox"), lambda: parse_run_config({**cfg, "strategy": "fedprox"})),
        (lambda: parse_tiers("fast"), lambda: parse_run_config({**cfg, "delay-model": "custom",
                                                                "delay.train.tiers": "fast"})),
        (lambda: ComponentDelay("weibull", ((1.0, 1.0),)), lambda: parse_run_config(
            {**cfg, "delay-model": "custom", "delay.train.distribution": "weibull"})),
        (lambda: GossipConfig(out_degree=0), lambda: parse_run_config(
            {**cfg, "strategy": "pushcen", "max-time": 5.0, "gossip.out-degree": 0})),
        (lambda: asyncfl.FedBuff(aggregation="mode"), lambda: parse_run_config(
            {**cfg, "fedbuff.aggregation": "mode"})),
        (lambda: check_drill({"drill-attack": "meteor", "drill-attackers": 1}), lambda: parse_run_config(
            {**cfg, "drill-attack": "meteor", "drill-attackers": 1})),
        (lambda: build_model("vgg", (1, 28, 28), 10), lambda: parse_run_config({**cfg, "model": "vgg"})),
        (lambda: asyncfl.RunOptions(clock="sundial"), lambda: parse_run_config({**cfg, "clock": "sundial"})),
        (lambda: load_dataset("imagenet"), lambda: parse_run_config({**cfg, "dataset": "imagenet"})),
        (lambda: PeerConfig(penalty="l7"), lambda: parse_run_config(
            {**cfg, "strategy": "pushcen", "max-time": 5.0, "pushcen.penalty": "l7"})),
        (lambda: _make_partitioner("stripes", 4, 0.5, 2, 0), lambda: parse_run_config(
            {**cfg, "partitioning": "stripes"})),
    ]
    for in_python, in_run_config in pairs:
        assert type(_raised(in_python)) is ConfigError, _raised(in_python)
        assert type(_raised(in_run_config)) is ConfigError, _raised(in_run_config)
