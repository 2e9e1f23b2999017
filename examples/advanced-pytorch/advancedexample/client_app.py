"""advancedexample: the ClientApp as a synchronous Flower app has it, plus one optional asyncfl mod.

Each client keeps its own classification head between the jobs it runs (``context.state``, which
Flower keeps per node for the whole run): it trains the received model with its own head in place
and evaluates that way, a simple personalisation. The whole model goes back to the server.

``report_train_seconds`` adds each job's training seconds to its reply's metrics: in a simulation on one
machine the engine then knows how long jobs queue for a worker, and FedBuff's ``dispatch_hold`` lets a freed
slot wait that long for a fresher model (docs/library.md, "Your ClientApp"). The app works without it.
"""

import torch
from asyncfl import report_train_seconds
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from advancedexample.task import HEAD, Net, load_data
from advancedexample.task import test as test_fn
from advancedexample.task import train as train_fn

app = ClientApp(mods=[report_train_seconds])  # optional: see the module docstring
torch.set_num_threads(1)  # simulated clients share the machine's cores
PERSONAL_HEAD = "personal-head"


def _model_and_data(msg: Message, context: Context):
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    if PERSONAL_HEAD in context.state.array_records:  # this client's own head from its last job
        getattr(model, HEAD).load_state_dict(context.state[PERSONAL_HEAD].to_torch_state_dict())
    cfg = context.run_config
    loaders = load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                        cfg["batch-size"], cfg["dirichlet-alpha"], cfg["data-dir"])
    return model, loaders


@app.train()
def train(msg: Message, context: Context):
    """Train the received model, with this client's own head, on its data; keep the head for next time."""
    model, (trainloader, _) = _model_and_data(msg, context)
    config = msg.content["config"]
    loss = train_fn(model, trainloader, context.run_config["local-epochs"], config["lr"], "cpu",
                    seed=int(config.get("server-round", 0)))
    context.state[PERSONAL_HEAD] = ArrayRecord(getattr(model, HEAD).state_dict())
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(trainloader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the received model with this client's own head on its validation data."""
    model, (_, validloader) = _model_and_data(msg, context)
    loss, accuracy = test_fn(model, validloader, "cpu")
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(validloader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
