"""A ServerApp that runs Flower's own built-in FedAvg strategy against the asyncfl ClientApp."""

import json
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from asyncfl.config import parse_run_config
from asyncfl.data import load_dataset
from asyncfl.models import build_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = parse_run_config(context.run_config)
    splits = load_dataset(cfg.data.dataset, cfg.data.data_dir, cfg.data.test_fraction, cfg.options.seed)
    model = build_model(cfg.data.model, splits.input_shape, splits.num_classes, seed=cfg.options.seed)
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2,
                            train_config=ConfigRecord({"lr": 0.05}))
    out = Path(cfg.output.output_dir) / cfg.output.run_name
    out.mkdir(parents=True, exist_ok=True)
    train = {r: dict(m) for r, m in result.train_metrics_clientapp.items()}
    evaluate = {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
    (out / "flower_fedavg.json").write_text(json.dumps({"train": train, "evaluate": evaluate}))
