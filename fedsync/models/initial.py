"""The seeded initial model: built the same, bit for bit, wherever it is built.

Every process of a run (the ServerApp, each SuperNode, a simulation worker) can build
version 0 of the global model from the model's factory and the run's ``seed`` alone:
:func:`seeded_model` builds it with the CPU generator seeded in a scope (the global RNG
is left as it was), ``float32`` as the default dtype and one intra-op thread, so
neither the caller's RNG, nor its default dtype, nor its thread count can change a
bit. :func:`state_digest` names such a state in 64 hex digits (SHA-256 of the tensors'
names, dtypes, shapes and bytes): the server sends it with a task whose start is the
seeded version 0 (``downlink-kind = "shared"``), and the device checks its own build
against it before it trains from it.

Built on the CPU: CUDA's generators are not touched, and a model moved to a GPU after
the build holds the same values.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn

__all__ = ["deterministic_init", "seeded_model", "seeded_state", "state_digest"]


@contextlib.contextmanager
def deterministic_init(seed: int) -> Iterator[None]:
    """A scope in which a model's initialisation is a function of ``seed`` alone.

    Inside it the CPU generator is seeded with ``seed``, the default dtype is
    ``float32`` and torch runs one intra-op thread; on the way out all three are
    restored (the generator to its state before the scope).
    """
    threads = torch.get_num_threads()
    dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(int(seed))
        torch.set_default_dtype(torch.float32)
        if threads != 1:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_default_dtype(dtype)
            if threads != 1:
                torch.set_num_threads(threads)


def seeded_model(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``factory()`` built under :func:`deterministic_init` (``seed``).

    The same as ``torch.manual_seed(seed); factory()`` on the CPU, without changing the
    caller's RNG, default dtype or thread count.
    """
    with deterministic_init(seed):
        model = factory()
    if not isinstance(model, nn.Module):
        raise TypeError(f"the factory returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def seeded_state(factory: Callable[[], nn.Module], seed: int) -> dict[str, torch.Tensor]:
    """The floating-point tensors of :func:`seeded_model`, detached, on the CPU: what a
    delta or shared downlink carries of the model, and what :func:`state_digest` names."""
    return {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in seeded_model(factory, seed).state_dict().items()
        if tensor.is_floating_point()
    }


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 (hex) of a state: per tensor in name order, its name, dtype, shape and
    bytes (CPU, contiguous, native byte order -- little-endian on every platform fedsync
    runs on). Equal digests mean equal bits."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        digest.update(f"{name}\0{dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
