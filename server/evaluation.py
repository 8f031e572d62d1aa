"""Central evaluation of the global model on the test split (the same for every strategy)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedsync.config import TrainingSection, resolve_device
from fedsync.models.training import evaluate as evaluate_model
from fedsync.task import dataset_for, model_for


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
        self.test_set = dataset_for(settings).test

    def initial_state(self) -> dict[str, torch.Tensor]:
        """The seeded initial model (the same one every process builds)."""
        return {
            name: tensor.detach().to("cpu", copy=True)
            for name, tensor in model_for(self.settings).state_dict().items()
        }

    def __call__(self, state: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Return ``{"accuracy", "loss", "num_examples"}`` of ``state`` on the test split."""
        self.model.load_state_dict(dict(state), strict=False)
        result = evaluate_model(self.model, self.test_set, batch_size=512, device=self.device)
        return {
            "accuracy": float(result["accuracy"]),
            "loss": float(result["loss"]),
            "num_examples": float(result["num_examples"]),
        }
