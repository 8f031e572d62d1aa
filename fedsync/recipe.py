"""The recipe both apps share: which data, which model, which state a model sends.

The ClientApp and the ServerApp each build the same model from the same settings; this
module is where that recipe lives, so the two sides cannot drift apart.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fedsync.config import TrainingSection
from fedsync.data import ArrayDataset, DatasetSplits, load_dataset, load_partition
from fedsync.models import build_model


def dataset_for(settings: TrainingSection) -> DatasetSplits:
    """Load (once per process) the dataset the run config names: a bundled one, or the
    user's loader by import path (``package.module:loader``, imported in this process)."""
    return load_dataset(settings.dataset, settings.data_dir_or_none, seed=settings.seed)


def model_for(settings: TrainingSection) -> torch.nn.Module:
    """Build the run's model with a seeded initialisation (same on every process): a
    bundled one, ``auto``'s pick for the dataset, or the user's factory by import path
    (``package.module:factory``, imported in this process)."""
    splits = dataset_for(settings)
    # torch.manual_seed(seed), less its cost on a machine without CUDA: there it queues
    # a CUDA seeding for later with a formatted traceback of the caller, every call.
    torch.random.default_generator.manual_seed(settings.seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(settings.seed)
    return build_model(
        settings.model, splits.num_classes, splits.input_shape, dataset=settings.dataset
    )


def client_data(
    settings: TrainingSection, partition_id: int, num_partitions: int
) -> tuple[ArrayDataset, ArrayDataset]:
    """This client's (train, validation) split of its partition."""
    return load_partition(
        settings.dataset,
        partition_id,
        num_partitions,
        settings.partitioning,
        alpha=settings.dirichlet_alpha,
        shards_per_client=settings.shards_per_client,
        seed=settings.seed,
        data_dir=settings.data_dir_or_none,
    )


def model_state(model: torch.nn.Module) -> OrderedDict[str, torch.Tensor]:
    """The model's floating-point state (parameters and float buffers), detached, on CPU."""
    return OrderedDict(
        (name, tensor.detach().to("cpu", copy=True))
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point()
    )
