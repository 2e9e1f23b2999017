"""The asyncfl ServerApp: parse the run-config, build the parts, run the engine."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from asyncfl.client_app.gossip import push_check
from asyncfl.client_app.task import node_data
from asyncfl.config import RunConfig, parse_run_config
from asyncfl.data import load_dataset
from asyncfl.models import build_model
from asyncfl.server_app import checkpoint
from asyncfl.server_app.evaluation import CentralEvaluator, DriftingEvaluator, RecordEvaluator, save_state_dict
from asyncfl.server_app.relay import GossipRelay
from asyncfl.server_app.run_folder import write_json, write_run_config
from asyncfl.strategies.registry import strategy_class
from asyncfl.strategies.resources import StrategyResources

app = ServerApp()
log = logging.getLogger("asyncfl")
#: The run folder's models, as torch state dicts: ``model.load_state_dict(torch.load(folder / FINAL_MODEL_FILE))``
FINAL_MODEL_FILE = "final_model.pt"
BEST_MODEL_FILE = "best_model.pt"  # the model of the best server-side accuracy, rewritten whenever it improves


def run_folder(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>``; the run name defaults to strategy, dataset, seed and a timestamp, or when
    resuming to the run folder the checkpoint is in."""
    if cfg.options.resume_from and not cfg.output.run_name:
        found = checkpoint.find(cfg.options.resume_from)
        if found.parent.name == checkpoint.FOLDER:
            return found.parent.parent.resolve()
    name = cfg.output.run_name or f"{cfg.strategy}-{cfg.data.dataset}-seed{cfg.options.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.output.output_dir).expanduser().resolve() / name


def _configure_logging() -> None:
    """INFO for asyncfl's own loggers only; Flower's HTTP chatter stays quiet."""
    logger = logging.getLogger("asyncfl")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _run_gossip(grid: Grid, cfg: RunConfig) -> None:
    """Decentralized methods: the relay schedules and forwards peer messages; there is no global model."""
    folder = run_folder(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", cfg.to_dict())
    # the peers' seeded initial model, so the relay checks each push as its receivers will before forwarding it
    splits = load_dataset(cfg.data.dataset, cfg.data.data_dir, cfg.data.test_fraction, cfg.options.seed)
    model = build_model(cfg.data.model, splits.input_shape, splits.num_classes, cfg.data.batchnorm,
                        seed=cfg.options.seed, track_statistics=cfg.data.track_statistics)
    relay = GossipRelay(grid, cfg.strategy, cfg.gossip, cfg.options, cfg.timeout, cfg.train.to_message_config(), folder,
                        check_push=push_check(cfg, model))
    log.info("asyncfl: gossip method=%s dataset=%s model=%s horizon=%g -> %s", cfg.strategy, cfg.data.dataset,
             cfg.data.model, cfg.options.max_time, folder)
    relay.run()  # writes summary.json as it goes, atomically, and once more at the end
    summary = relay.summary()
    log.info("asyncfl: done: mean peer accuracy %s after %d events (%s)", summary["final-mean-accuracy"],
             summary["events"], folder)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one asynchronous (or synchronous-preset) FL experiment: run-config -> strategy -> ``start()``."""
    _configure_logging()
    cfg = parse_run_config(context.run_config)
    torch.set_num_threads(max(1, int(context.run_config.get("server-threads", 1))))
    if cfg.gossip is not None:
        _run_gossip(grid, cfg)
        return

    splits = load_dataset(cfg.data.dataset, cfg.data.data_dir, cfg.data.test_fraction, cfg.options.seed)
    model = build_model(cfg.data.model, splits.input_shape, splits.num_classes, cfg.data.batchnorm, seed=cfg.options.seed,
                        track_statistics=cfg.data.track_statistics)
    initial_arrays = ArrayRecord(model.state_dict())
    resources = StrategyResources(
        make_model=lambda: build_model(cfg.data.model, splits.input_shape, splits.num_classes, cfg.data.batchnorm,
                                       track_statistics=cfg.data.track_statistics),
        x_train=splits.x_train,
        y_train=splits.y_train,
        seed=cfg.options.seed,
        data_dir=cfg.data.data_dir,
        server_holdout=cfg.data.server_holdout,
        num_classes=splits.num_classes,
        label_histogram=lambda pid, n: np.bincount(node_data(cfg.data, pid, n, cfg.options.seed).y_train,
                                                   minlength=splits.num_classes),
        train_config=cfg.train.to_message_config(),
    )
    # the built-in app evaluates on the server only (no federated evaluation) and waits for one node at least
    strategy = strategy_class(cfg.strategy).from_config(cfg.strategy_config, resources, fraction_evaluate=0.0,
                                                        min_available_nodes=1)
    strategy.name = cfg.strategy
    if cfg.drift.active:
        evaluator = DriftingEvaluator(model, splits.x_test, splits.y_test, cfg.data.eval_batch_size,
                                      splits.num_classes, cfg.drift, cfg.options.seed)
    else:
        evaluator = CentralEvaluator(model, splits.x_test, splits.y_test, cfg.data.eval_batch_size, splits.num_classes)

    folder = run_folder(cfg)
    if not cfg.options.resume_from:  # a resumed run keeps the run-config it was started with
        folder.mkdir(parents=True, exist_ok=True)
        write_run_config(folder, dict(context.run_config))
    log.info("asyncfl: strategy=%s dataset=%s model=%s clock=%s -> %s", cfg.strategy, cfg.data.dataset,
             cfg.data.model, cfg.options.clock, folder)  # start() says the concurrency once it knows the nodes
    result = strategy.start(
        grid, initial_arrays, num_rounds=0, timeout=cfg.timeout,
        train_config=ConfigRecord(cfg.train.to_message_config()),
        evaluate_fn=RecordEvaluator(evaluator, best_model_path=folder / BEST_MODEL_FILE),
        options=replace(cfg.options, output_dir=str(folder.parent), run_name=folder.name),
        run_config=cfg.to_dict(),
    )
    save_state_dict(result.arrays.to_torch_state_dict(), folder / FINAL_MODEL_FILE)
    summary = result.summary
    log.info("asyncfl: done: final accuracy %.4f after %d arrivals (%s)", summary["final-accuracy"] or 0.0,
             summary["arrivals"], folder)
