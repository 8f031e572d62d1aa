"""quickstart: A Flower / PyTorch app."""

import torch
from fedsync.clientapp import probe_reply, receive
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from quickstart.task import Net, load_data
from quickstart.task import test as test_fn
from quickstart.task import train as train_fn

# Flower ClientApp
app = ClientApp()
app.query()(probe_reply)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    task = receive(msg, context, model)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    batch_size = int(context.run_config["batch-size"])
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)

    # Call the training function
    train_loss = train_fn(
        model,
        trainloader,
        int(context.run_config["local-epochs"]),
        float(msg.content["config"]["lr"]),
        device,
    )

    # Construct and return reply Message
    return task.reply(num_examples=len(trainloader.dataset), metrics={"train_loss": train_loss})


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    batch_size = int(context.run_config["batch-size"])
    _, valloader = load_data(partition_id, num_partitions, batch_size)

    # Call the evaluation function
    eval_loss, eval_acc = test_fn(model, valloader, device)

    # Construct and return reply Message
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
