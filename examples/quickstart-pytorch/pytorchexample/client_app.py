"""pytorchexample: the ClientApp as a synchronous Flower app has it, plus one optional asyncfl mod.

``report_train_seconds`` adds each job's training seconds to its reply's metrics: in a simulation on one
machine the engine then knows how long jobs queue for a worker, and FedBuff's ``dispatch_hold`` lets a freed
slot wait that long for a fresher model (docs/library.md, "Your ClientApp"). The app works without it.
"""

import torch
from asyncfl import report_train_seconds
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pytorchexample.task import Net, load_data
from pytorchexample.task import test as test_fn
from pytorchexample.task import train as train_fn

app = ClientApp(mods=[report_train_seconds])  # optional: see the module docstring
torch.set_num_threads(1)  # simulated clients share the machine's cores


def _model_and_data(msg: Message, context: Context):
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loaders = load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                        context.run_config["batch-size"], context.run_config["dataset"])
    return model, loaders


@app.train()
def train(msg: Message, context: Context):
    """Train the received model on this node's data."""
    model, (trainloader, _) = _model_and_data(msg, context)
    train_loss = train_fn(model, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"], "cpu")
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.dataset)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the received model on this node's validation data."""
    model, (_, valloader) = _model_and_data(msg, context)
    eval_loss, eval_acc = test_fn(model, valloader, "cpu")
    metrics = MetricRecord({"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
