"""fedechoexample: a plain Flower ClientApp, plus asyncfl's identity answer for a repeatable simulation."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from asyncfl import answer_identity
from fedechoexample.task import DigitNet, client_data, train as train_fn

app = ClientApp()
torch.set_num_threads(1)


def _data(context: Context):
    return client_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                       context.run_config["dirichlet-alpha"])


# Clients report their partition id, so the server orders them the same way in every run (seeded).
answer_identity(app, num_examples=lambda context: len(_data(context)[1]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    model = DigitNet()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = _data(context)
    seed = int(msg.content["config"]["model-version"]) * 10_000 + int(context.node_config["partition-id"])
    loss = train_fn(model, x, y, context.run_config["local-epochs"], msg.content["config"]["lr"], seed)
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)
