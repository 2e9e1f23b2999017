"""fedechoexample: FedEcho with the user's own model and unlabeled data, in simulated time.

FedEcho (Wang, Ma and Chen) buffers client updates and, at every global update, distils
the averaged model towards the mean of every client's latest logits on unlabeled server
inputs, weighting soft and hard targets by the teacher's uncertainty. It needs a network
on the server, so it takes your ``model_fn`` and your unlabeled inputs.
"""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from asyncfl import FedEcho
from fedechoexample.task import DigitNet, evaluate, test_set, unlabeled_inputs

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    torch.manual_seed(config["seed"])
    arrays = ArrayRecord(DigitNet().state_dict())
    x_test, y_test = test_set()

    def global_evaluate(version: int, arrays: ArrayRecord) -> MetricRecord:
        model = DigitNet()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, x_test, y_test)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    strategy = FedEcho(model_fn=DigitNet, distill_inputs=unlabeled_inputs(), buffer_size=config["buffer-size"],
                       distill_steps=config["distill-steps"], distill_lr=1e-3, fraction_evaluate=0.0)
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        num_rounds=config["num-server-rounds"],
        train_config=ConfigRecord({"lr": config["learning-rate"]}),
        evaluate_fn=global_evaluate,
        # simulated time: job durations drawn from the FedRevive paper's delay model, replies accepted in that
        # order whatever order Ray finishes them in; same seed, same metrics
        clock="virtual", delay_model="fedrevive-default", seed=config["seed"], concurrency=config["concurrency"],
        output_dir=config["output-dir"], run_name=config["run-name"],
    )
    print(f"final accuracy {result.evaluate_metrics_serverapp[max(result.evaluate_metrics_serverapp)]['accuracy']:.3f}, "
          f"mean staleness {result.summary['staleness-mean']:.2f}")
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")
