"""quickstart: A Flower / PyTorch app."""

import json
from pathlib import Path

import torch
from fedsync.serverapp import TEASQ
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from quickstart.task import Net, load_centralized_dataset, test

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    max_aggregations = int(context.run_config["max-aggregations"])
    lr = float(context.run_config["learning-rate"])
    output_dir = Path(str(context.run_config["output-dir"]))

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize the strategy
    strategy = TEASQ(concurrency=5, buffer_size=3)

    # Start the strategy
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        max_aggregations=max_aggregations,
        evaluate_fn=global_evaluate,
    )

    # Save the final model and its central metrics to disk
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.save(result.arrays.to_torch_state_dict(), output_dir / "final_model.pt")
    evaluations = {n: dict(m) for n, m in sorted(result.evaluate_metrics_serverapp.items())}
    (output_dir / "final_metrics.json").write_text(json.dumps(evaluations, indent=1))
    print(f"Final central metrics: {evaluations[max(evaluations)]}")


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the model on the held-out test set."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Evaluate the global model on the test set
    test_loss, test_acc = test(model, load_centralized_dataset(), device)

    # Return the evaluation metrics
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})
