"""Train a model on the run's data for a few tasks per client and keep what each update
sends: the real frames, decoded as the server decodes them.

The loop is a synchronous stand-in for a run, built from the pieces a run uses: the
model and data of :mod:`fedsync.recipe` (same settings, same seeded partitions), local
training with :func:`fedsync.models.training.train` and the run's local settings,
and per client one :class:`~fedsync.codecs.UpdateCodec` with its own sender memory
(error feedback carries over from task to task, as on a device). In each round every
client trains from the current global model, its ``local - start`` delta is encoded
with the task's uplink spec (the run's schedule at that model version), the frame is
decoded and checked by the server's decoder, and the decoded updates are averaged by
the server's :class:`~fedsync.aggregation.UpdateBuffer` into the next global model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedsync.aggregation import UpdateBuffer, validate_update
from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.config import RunConfig
from fedsync.models.training import InnerOptimizer, evaluate, train
from fedsync.recipe import client_data, dataset_for, model_for, model_state
from fedsync.strategies import STRATEGIES, Strategy
from fedsync.updates import TensorSpec
from fedsync.wire import TensorLayout, inspect_frame
from fedsync.wire.index_coding import IndexPlan

__all__ = ["Collection", "UpdateRecord", "collect_updates", "uplink_plan"]


@dataclass
class UpdateRecord:
    """One client's update of one round, as it went over the wire.

    Attributes
    ----------
    client, round : int
        Who sent it, and from which global model version.
    spec : str
        The uplink codec spec of the task.
    payload_bytes : int
        Length of the real frame.
    supports : dict of str to numpy.ndarray
        Decoded positions per tensor (int64, sorted; every position for a tensor the
        codec sent dense).
    value_bits : dict of str to int
        Bits per value on the wire per tensor (the frame's code width).
    sent_coding : dict of str to str
        The index coding the frame encoder chose per tensor (``dense`` for none).
    sent_index_bytes : dict of str to int
        Bytes those positions took in the frame: the section, plus the parameter
        byte and length varint of the codings that carry them.
    train_loss : float
        The local training loss.
    """

    client: int
    round: int
    spec: str
    payload_bytes: int
    supports: dict[str, np.ndarray]
    value_bits: dict[str, int]
    sent_coding: dict[str, str]
    sent_index_bytes: dict[str, int]
    train_loss: float


@dataclass
class Collection:
    """Everything :func:`collect_updates` measured."""

    specs: dict[str, TensorSpec]
    clients: int
    rounds: int
    buffer_size: int
    updates: list[UpdateRecord] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    """Central test accuracy of the global model after each round."""
    seconds: float = 0.0

    def round_updates(self, round_index: int) -> list[UpdateRecord]:
        """The updates of one round, in client order."""
        return [u for u in self.updates if u.round == round_index]


def uplink_plan(config: RunConfig) -> tuple[Callable[[int], str], int]:
    """The uplink spec per model version and ``K`` (updates per aggregation), as the
    run's strategy uses them (``fedavg``: the run's start values, ``K`` = 0 meaning
    every client of a round)."""
    if config.strategy in STRATEGIES:
        strategy = Strategy.from_run_config(config)
        schedule = config.compression.schedule(decaying=strategy.decaying_compression)
        return schedule.spec, strategy.buffer_size
    return config.compression.schedule(decaying=False).spec, 0


def collect_updates(
    config: RunConfig,
    *,
    clients: int,
    rounds: int,
    codec: str | None = None,
    log: Callable[[str], None] | None = None,
) -> Collection:
    """Run ``rounds`` rounds of ``clients`` tasks and record every update.

    Parameters
    ----------
    config : RunConfig
        Data, model, partitioning, local training and codec settings, as in a run.
    clients : int
        Clients (partitions of the data), all training in every round.
    rounds : int
        Tasks per client.
    codec : str, optional
        The uplink codec spec; default the run's (:func:`uplink_plan`).
    log : callable, optional
        Receives one line per round.

    Raises
    ------
    ValueError
        If ``clients`` or ``rounds`` is below 1.
    fedsync.compression.errors.SpecError
        For an invalid codec spec.
    """
    if clients < 1 or rounds < 1:
        raise ValueError(f"clients and rounds must be >= 1, got {clients} and {rounds}")
    started = time.perf_counter()
    settings = config.training
    scheduled, k = uplink_plan(config)
    if codec is not None:
        UpdateCodec(codec)  # a bad spec fails here, before any training
    fixed = codec

    def spec_at(version: int) -> str:
        return fixed if fixed is not None else scheduled(version)

    model = model_for(settings)
    global_state: dict[str, torch.Tensor] = dict(model_state(model))
    specs = tensor_specs(global_state)
    test_set = dataset_for(settings).test
    data = [client_data(settings, c, clients)[0] for c in range(clients)]
    codecs = [
        UpdateCodec(spec_at(0), seed=settings.seed * 100_003 + c, specs=specs)
        for c in range(clients)
    ]
    server = UpdateCodec(specs=specs)
    collection = Collection(specs, clients, rounds, k if k > 0 else clients)
    torch.manual_seed(settings.seed)
    # Each client's optimizer memory across rounds, as the app keeps it (the step count
    # always: it drives the schedule; the moments with client-optimizer-state = "keep").
    inners = [InnerOptimizer() for _ in range(clients)]
    for round_index in range(rounds):
        buffer = UpdateBuffer(specs, capacity=clients)
        spec = spec_at(round_index)
        for c in range(clients):
            model.load_state_dict(global_state, strict=False)
            result = train(
                model,
                data[c],
                epochs=settings.local_epochs,
                batch_size=settings.batch_size,
                lr=settings.learning_rate,
                momentum=settings.momentum,
                proximal_mu=settings.proximal_mu,
                max_steps=settings.local_steps or None,
                seed=(settings.seed * 1_000_003 + c * 7919 + round_index) % 2**31,
                inner=inners[c],
                **settings.optimizer_settings,
            )
            if not settings.keeps_optimizer_state:
                inners[c].state = None
            trained = model.state_dict()
            delta = {name: trained[name].detach().float() - global_state[name] for name in specs}
            # Same sender memory across tasks, this task's spec (density, bits).
            sender = UpdateCodec(spec, seed=codecs[c].seed, state=codecs[c].state, specs=specs)
            payload = sender.encode(delta)
            decoded = server.decode(payload)
            _, layouts = inspect_frame(payload, expected=specs)
            buffer.add(validate_update(decoded, specs), 1.0)
            collection.updates.append(
                UpdateRecord(
                    client=c,
                    round=round_index,
                    spec=spec,
                    payload_bytes=len(payload),
                    supports={
                        name: t.indices.cpu().numpy().astype(np.int64)
                        for name, t in decoded.items()
                    },
                    value_bits={lay.spec.name: lay.bits for lay in layouts},
                    sent_coding={
                        lay.spec.name: lay.coding if lay.index_mode == "explicit" else "dense"
                        for lay in layouts
                    },
                    sent_index_bytes={lay.spec.name: _index_bytes(lay) for lay in layouts},
                    train_loss=float(result["train_loss"]),
                )
            )
        step = buffer.take().update
        global_state = {name: global_state[name] + step[name] for name in specs}
        model.load_state_dict(global_state, strict=False)
        accuracy = evaluate(model, test_set)["accuracy"]
        collection.accuracy.append(accuracy)
        if log is not None:
            mean_bytes = np.mean([u.payload_bytes for u in collection.round_updates(round_index)])
            log(
                f"round {round_index + 1}/{rounds}: {spec}, mean frame {mean_bytes:.0f} B, "
                f"test accuracy {accuracy:.4f}"
            )
    collection.seconds = time.perf_counter() - started
    return collection


def _index_bytes(layout: TensorLayout) -> int:
    """Bytes a tensor's positions took in a real frame (0 for a tensor sent dense)."""
    if layout.index_mode != "explicit":
        return 0
    return IndexPlan(layout.coding, layout.coding_param, layout.index_nbytes).frame_bits // 8
