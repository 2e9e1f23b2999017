"""A ClientApp written the way Flower's quickstart-pytorch writes one, knowing nothing of asyncfl.

It follows only Flower's train convention: read ``"arrays"``, train, reply
with ``"arrays"`` and ``"metrics"`` (``num-examples``, ``train-loss``). It has
no ``query`` handler, so the asyncfl engine falls back to node-id order.
"""

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.datasets import load_digits

app = ClientApp()


class Net(torch.nn.Module):
    """Same architecture (and parameter names) as the server's model: a 64-unit MLP."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


@app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    pid, n = context.node_config["partition-id"], context.node_config["num-partitions"]
    digits = load_digits()
    x = torch.tensor(digits.images[pid::n] / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target[pid::n], dtype=torch.long)
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(10):
        idx = torch.from_numpy(np.random.default_rng(0).choice(len(x), 16))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(x), "train-loss": float(np.mean(losses))})})
    return Message(content=content, reply_to=msg)
