"""quickstart: A Flower / PyTorch app."""

from functools import lru_cache

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 42


class Net(nn.Module):
    """A small MLP: 30 standardized tumour features -> malignant / benign."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(30, 32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@lru_cache(maxsize=1)
def _splits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled Breast Cancer Wisconsin data (569 samples, no download),
    split 80/20 into a training pool and a held-out test set, standardized with the
    training pool's statistics."""
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=SEED
    )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def _dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))


def load_data(
    partition_id: int, num_partitions: int, batch_size: int = 16
) -> tuple[DataLoader, DataLoader]:
    """Partition ``partition_id`` of the training pool (IID, the same for every run):
    80% to train on, 20% to evaluate on."""
    x, y, _, _ = _splits()
    order = np.random.default_rng(SEED).permutation(len(y))
    part = np.array_split(order, num_partitions)[partition_id]
    cut = int(0.8 * len(part))
    train, val = part[:cut], part[cut:]
    trainloader = DataLoader(_dataset(x[train], y[train]), batch_size=batch_size, shuffle=True)
    valloader = DataLoader(_dataset(x[val], y[val]), batch_size=batch_size)
    return trainloader, valloader


def load_centralized_dataset(batch_size: int = 64) -> DataLoader:
    """The held-out test set (20% of the data, never trained on)."""
    _, _, x, y = _splits()
    return DataLoader(_dataset(x, y), batch_size=batch_size)


def train(
    net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device: torch.device
) -> float:
    """Train the model on the training set; the mean loss per batch."""
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for features, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(features.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: nn.Module, testloader: DataLoader, device: torch.device) -> tuple[float, float]:
    """Validate the model on the test set; ``(loss, accuracy)``."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    net.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for features, labels in testloader:
            outputs = net(features.to(device))
            labels = labels.to(device)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(dim=1) == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
