"""A ServerApp that drives our ClientApp with Flower's own ``Grid.send_and_receive`` loop.

The peer in ``benchmarks/deploy/run.py``: each round it sends one train message
to every node and blocks in ``send_and_receive`` (which pulls, then sleeps 3 s
while replies are missing). It writes per-round wall time and the clients'
reported ``train-seconds`` to ``<output-dir>/flower-loop.json``.
"""

import json
import time
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from asyncfl.config import parse_run_config
from asyncfl.data import load_dataset
from asyncfl.models import build_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = parse_run_config(context.run_config)
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < cfg.options.concurrency:
        time.sleep(0.5)
        nodes = sorted(grid.get_node_ids())
    splits = load_dataset(cfg.data.dataset, cfg.data.data_dir, cfg.data.test_fraction, cfg.options.seed)
    model = build_model(cfg.data.model, splits.input_shape, splits.num_classes, cfg.data.batchnorm, seed=0)
    arrays = ArrayRecord(model.state_dict())
    train_config = cfg.train.to_message_config()
    rounds = max(1, cfg.options.max_arrivals // len(nodes))
    result = {"nodes": len(nodes), "rounds": []}
    for server_round in range(rounds):
        messages = [
            Message(RecordDict({"arrays": arrays, "config": ConfigRecord({**train_config, "job-seed": server_round})}),
                    dst_node_id=node, message_type=MessageType.TRAIN)
            for node in nodes
        ]
        started = time.monotonic()
        replies = list(grid.send_and_receive(messages, timeout=600))
        elapsed = time.monotonic() - started
        train = [float(r.content.metric_records["metrics"]["train-seconds"]) for r in replies if not r.has_error()]
        result["rounds"].append({"seconds": elapsed, "replies": len(replies), "train-seconds": train})
    out = Path(cfg.output.output_dir) / "flower-loop.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
