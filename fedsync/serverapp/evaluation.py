"""Central evaluation of the global model on the test split (the same for every strategy)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from fedsync.config import TrainingSection, resolve_device
from fedsync.models.training import evaluate as evaluate_model
from fedsync.recipe import dataset_for, model_for


class CentralEvaluator:
    """Evaluates a model state on the run's test split.

    Parameters
    ----------
    settings : TrainingSection
        Which dataset and model; the device comes from ``device`` (CUDA when present).
    """

    def __init__(self, settings: TrainingSection) -> None:
        self.settings = settings
        self.device = resolve_device(settings.device)
        self.model = model_for(settings).to(self.device)
        splits = dataset_for(settings)
        self.test_set = splits.test
        labels = np.asarray(self.test_set.y).reshape(-1)
        counts = np.bincount(labels.astype(np.int64), minlength=splits.num_classes)
        self.chance_accuracy = float(counts.max() / max(1, counts.sum()))
        """What always answering the test set's most frequent class scores."""
        self.chance_loss = math.log(splits.num_classes)
        """The cross-entropy of a uniform guess over the classes."""

    def initial_state(self) -> dict[str, torch.Tensor]:
        """The seeded initial model (the same one every process builds)."""
        return {
            name: tensor.detach().to("cpu", copy=True)
            for name, tensor in model_for(self.settings).state_dict().items()
        }

    def __call__(self, state: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Return ``{"accuracy", "loss", "num_examples"}`` of ``state`` on the test split,
        with ``chance_accuracy`` and ``chance_loss``, the references the run's health
        check reads (:mod:`fedsync.aggregation.health`)."""
        self.model.load_state_dict(dict(state), strict=False)
        result = evaluate_model(self.model, self.test_set, batch_size=512, device=self.device)
        return {
            "accuracy": float(result["accuracy"]),
            "loss": float(result["loss"]),
            "num_examples": float(result["num_examples"]),
            "chance_accuracy": self.chance_accuracy,
            "chance_loss": self.chance_loss,
        }
