"""pytorchexample: the ServerApp of Flower's quickstart, made asynchronous.

The only change from the synchronous app is the strategy:

    -from flwr.serverapp.strategy import FedAvg
    +from asyncfl import FedBuff
    -    strategy = FedAvg(fraction_evaluate=fraction_evaluate)
    +    strategy = FedBuff(fraction_evaluate=fraction_evaluate)

``start()`` keeps Flower's signature and returns Flower's ``Result``; ``num_rounds``
buys the same client work as under FedAvg (``num_rounds`` x the nodes FedAvg would
train per round), with the clients training without waiting for each other.
"""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from asyncfl import FedBuff
from pytorchexample.task import Net, load_centralized_dataset
from pytorchexample.task import test as test_fn

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train asynchronously, evaluating the global model on the server after every version."""
    fraction_evaluate = context.run_config["fraction-evaluate"]
    num_rounds = context.run_config["num-server-rounds"]
    lr = context.run_config["learning-rate"]
    dataset = context.run_config["dataset"]

    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    strategy = FedBuff(fraction_evaluate=fraction_evaluate)

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(model, load_centralized_dataset(dataset), "cpu")
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )

    print("\nSaving final model to disk...")
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")
