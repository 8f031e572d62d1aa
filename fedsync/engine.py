"""The asynchronous aggregation engine: what happens to an update, without Flower.

::

    plan_task(node)   -> InFlight: version, uplink spec, downlink payload (the task's record)
    arrived(flight)   -> staleness, once, kept on the record
    receive(flight, reply payload, metrics)
        -> strategy.check -> decode (the task's codec only) -> validate (once: ValidUpdate)
        -> norm guard -> staleness gate -> strategy.weight -> strategy.contribution
        -> buffer (K cached) -> server optimizer step -> version + 1

The engine knows nothing of messages, nodes' addresses or time: the server's loop
(``fedsync/serverapp/loop.py``) asks it for a task plan when a device gets work and hands it
each reply's bytes when the clock releases them. All it keeps of a task in flight is on
the task's :class:`InFlight` record, which travels with the task (the loop hands it to
the clock, the clock back on the event that ends the task): nothing is looked up by task
id. Everything is deterministic given the order of calls, so simulations repeat exactly.
A :class:`~fedsync.strategies.Strategy` says how updates are gated, weighted and
combined; the buffer, the optimizer, the codecs and the downlink encoder are the same
for every strategy. A pruned run (``prune-at-version``) cuts the model once
(:mod:`fedsync.aggregation.pruning`); from then on every spec of both directions is
masked and each plan carries the mask frame to a device that does not hold it yet. An
AB-Training run (``ab-rank``) plans each task with the factor it trains and the frozen
other one, and rebuilds its reply exactly (:mod:`fedsync.aggregation.ab_training`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch

from fedsync.aggregation import (
    InvalidUpdate,
    UpdateBuffer,
    ValidUpdate,
    validate_update,
)
from fedsync.aggregation.ab_training import ABTraining
from fedsync.aggregation.downlink import (
    CodecFactory,
    DownlinkEncoder,
    DownlinkKind,
    DownlinkPayload,
    UpdateCodecLike,
)
from fedsync.aggregation.guard import UpdateNormGuard, update_norm
from fedsync.aggregation.local_steps import DynamicLocalSteps
from fedsync.aggregation.placement import canonical_device, tensor_devices
from fedsync.aggregation.pruning import PrunedModel
from fedsync.aggregation.relay_downlink import RelayDownlink
from fedsync.aggregation.schedule_clock import ScheduleClock
from fedsync.aggregation.server_optimizer import ServerOptimizer, optimizer_from_hyperparameters
from fedsync.aggregation.shared_downlink import SharedDownlink, grid_of
from fedsync.aggregation.tally import RunTally
from fedsync.config import RunConfig, SettingsError
from fedsync.factored import Side
from fedsync.models.initial import state_digest
from fedsync.strategies import STRATEGIES, Arrival, Strategy
from fedsync.updates import SparseTensor, TensorSpec, tensor_specs
from fedsync.wire import UnexpectedCodec
from fedsync.wire.relay import RelayEntry

__all__ = ["AggregationEngine", "InFlight", "Rejection", "Verdict", "default_codec_factory"]


def default_codec_factory(
    spec: str,
    *,
    seed: int = 0,
    specs: Mapping[str, TensorSpec] | None = None,
    masks: Mapping[str, torch.Tensor] | None = None,
) -> UpdateCodecLike:
    """Build :class:`fedsync.codecs.UpdateCodec` from a spec string.

    ``seed`` fixes the random choices of stochastic codecs (random-k, stochastic
    rounding) the server encodes downlinks with; decoding needs no seed. With the
    model's ``specs`` its frames carry the model's schema digest, not its tensor table.
    ``masks`` are a pruned run's explicit masks (``mask:digest=...`` specs).
    """
    from fedsync.codecs import UpdateCodec  # the codec pulls in numba kernels: load late

    codec: UpdateCodecLike = UpdateCodec(spec, seed=seed, specs=specs, masks=masks)
    return codec


@dataclass(slots=True, eq=False)
class InFlight:
    """One task in flight: the one record the server keeps of it, from its dispatch to
    the clock event that ends it.

    :meth:`AggregationEngine.plan_task` makes it; the server's loop stamps its dispatch
    time and hands it to the clock, which carries it on the task's reply, error or drop
    event; :meth:`AggregationEngine.arrived` writes its staleness once, and
    :meth:`AggregationEngine.receive` (or :meth:`AggregationEngine.forget`) consumes it.
    What the task carries is set once, at planning; only ``dispatched`` and
    ``staleness`` are written later.

    Attributes
    ----------
    task_id : str
        ``task-<number>``.
    number : int
        Tasks handed out before it, plus one (over the whole job).
    node_id : int
        The device.
    version : int
        The model version it starts from.
    uplink_spec : str
        The codec spec its update must come back with.
    downlink : DownlinkPayload
        The encoded model (or delta) it carries.
    seed : int
        Seeds the task's random choices on the device (shuffling, stochastic rounding):
        distinct and reproducible per (run seed, task number).
    mask : bytes
        The pruning-mask frame (:mod:`fedsync.wire.mask`) when the device does not hold
        the masks yet; empty otherwise.
    ab_side : {"", "A", "B"}
        An AB-Training run's side: the factor the task trains (``""``: not such a run).
    factors : bytes
        The frozen factors of an AB-Training task (a frame; empty otherwise).
    frozen : dict of str to torch.Tensor or None
        That frame as the device decodes it: what the task's reply is rebuilt with
        (AB-Training; ``None`` otherwise).
    local_steps : int
        The task's step budget (``0``: no cap, epochs decide).
    schedule_step : int
        The run's position the device's learning-rate schedule starts the task at
        (:mod:`fedsync.aggregation.schedule_clock`); ``-1`` when the device counts its
        own steps (``client-schedule-clock = "device"``).
    dispatched : float
        The clock time the task was sent at (the loop sets it).
    staleness : int or None
        Aggregations between the task's model version and its arrival, set once by
        :meth:`AggregationEngine.arrived` (``None`` until then); the staleness weight,
        the gate and the run's counters all read it from here.
    """

    task_id: str
    number: int
    node_id: int
    version: int
    uplink_spec: str
    downlink: DownlinkPayload
    seed: int
    mask: bytes = b""
    ab_side: str = ""
    factors: bytes = b""
    frozen: dict[str, torch.Tensor] | None = None
    local_steps: int = 0
    schedule_step: int = -1
    dispatched: float = 0.0
    staleness: int | None = None
    in_collective: bool = False

    @property
    def downlink_bytes(self) -> int:
        """Everything the task carries to the device: model, masks, frozen factors; 0 in
        a run counted as a collective (run-config ``collective``), where every site
        computes the model it starts from itself."""
        if self.in_collective:
            return 0
        return len(self.downlink.payload) + len(self.mask) + len(self.factors)


@dataclass(frozen=True)
class Rejection:
    """Why a reply was rejected: the kind it is counted under, and the reason in words.

    Attributes
    ----------
    kind : str
        The key of ``rejections`` in ``summary.json``: :attr:`CODEC_MISMATCH`,
        ``decode:<Error>`` (the :class:`~fedsync.wire.PayloadError` subclass, or other
        exception, the payload failed to decode with), :attr:`INVALID`, :attr:`NORM` or
        :attr:`MALFORMED`.
    detail : str
        The reason, for logs and events.
    """

    CODEC_MISMATCH: ClassVar[str] = "codec-mismatch"
    """A well-formed frame of another codec than the task assigned (refused on its
    header: nothing of it is decoded)."""
    INVALID: ClassVar[str] = "invalid"
    """Decoded, but not a valid update of the expected tensors."""
    NORM: ClassVar[str] = "norm"
    """Refused by the update-norm guard."""
    MALFORMED: ClassVar[str] = "malformed"
    """The reply could not be read, or the strategy refused it (no examples, ...)."""

    kind: str
    detail: str

    @classmethod
    def decode_failed(cls, error: Exception) -> Rejection:
        """The rejection of a payload whose decoding raised ``error``."""
        if isinstance(error, UnexpectedCodec):
            return cls(cls.CODEC_MISMATCH, f"codec mismatch: {error}")
        name = type(error).__name__
        return cls(f"decode:{name}", f"decode failed: {name}: {error}")


@dataclass(frozen=True)
class Verdict:
    """What became of one reply.

    Attributes
    ----------
    status : {"aggregated", "buffered", "stale", "rejected"}
        ``buffered``: cached; ``aggregated``: cached and the buffer stepped the model;
        ``stale``: dropped by the staleness gate; ``rejected``: unusable (see
        ``rejection``).
    staleness : int
        Aggregations since the task's model version.
    rejection : Rejection or None
        For ``rejected`` (and only then): why.
    updates, weight_sum : int, float
        For ``aggregated``: what the buffer held.
    """

    status: Literal["aggregated", "buffered", "stale", "rejected"]
    staleness: int
    rejection: Rejection | None = None
    updates: int = 0
    weight_sum: float = 0.0

    def __post_init__(self) -> None:
        if (self.status == "rejected") != (self.rejection is not None):
            raise ValueError("a verdict has a rejection if and only if it is 'rejected'")

    @property
    def kind(self) -> str:
        """The rejection's kind (``""`` unless rejected)."""
        return self.rejection.kind if self.rejection is not None else ""

    @property
    def why(self) -> str:
        """The rejection's detail (``""`` unless rejected)."""
        return self.rejection.detail if self.rejection is not None else ""


class AggregationEngine:
    """The global model and everything that changes it.

    Parameters
    ----------
    config : RunConfig
        The run's settings (strategy, compression, seed, ...).
    global_state : mapping of str to torch.Tensor
        The model to start from (a state dict; floating-point tensors are trained, the
        others passed through unchanged).
    codec_factory : callable, optional
        Spec string -> codec; default :func:`default_codec_factory` with the run's seed.
    norm_guard : UpdateNormGuard, optional
        Rejects updates of absurd L2 norm; none: no norm check.
    device : str or torch.device, optional
        Where the engine's state lives (global model, update buffer, optimizer state,
        downlink replicas, pruning masks) and uplinks are decoded to; default: the
        run config's ``server-device``. Only encoded payloads (bytes) leave it.
    version : int
        The model version of ``global_state`` (a resumed run).
    optimizer_state : dict, optional
        The server optimizer's state to continue from (a resumed run).
    pruning_state : dict, optional
        The pruning cut to continue from (a resumed pruned run,
        :meth:`PrunedModel.checkpoint_state`); empty or ``None``: none saved.
    strategy : Strategy, optional
        The strategy object (default: the class ``config.strategy`` names, built from
        the run config's asynchronous section); its name must be ``config.strategy``.
    optimizer : ServerOptimizer, optional
        The server optimizer (default: the one the run config describes).
    """

    def __init__(
        self,
        config: RunConfig,
        global_state: Mapping[str, torch.Tensor],
        *,
        codec_factory: CodecFactory | None = None,
        norm_guard: UpdateNormGuard | None = None,
        device: str | torch.device | None = None,
        version: int = 0,
        optimizer_state: Mapping[str, Any] | None = None,
        pruning_state: Mapping[str, Any] | None = None,
        strategy: Strategy | None = None,
        optimizer: ServerOptimizer | None = None,
    ) -> None:
        if config.strategy not in STRATEGIES:
            raise SettingsError(f"strategy {config.strategy!r} does not run on the engine")
        self.config = config
        self.device = (
            config.asynchronous.server_torch_device()
            if device is None
            else canonical_device(device)
        )
        """Where every tensor of the engine's state lives (see :meth:`placement`)."""
        if strategy is not None and strategy.name != config.strategy:
            raise SettingsError(
                f"the strategy object is {strategy.name!r}, the run config names "
                f"{config.strategy!r}"
            )
        self.strategy: Strategy = strategy or Strategy.from_run_config(config)
        self.collective = config.asynchronous.collective
        """How this run's bytes are counted: as sent, or as a collective moves them."""
        decaying = self.strategy.decaying_compression
        self.schedule = config.compression.schedule(decaying=decaying)
        self.downlink_schedule = config.compression.downlink_schedule(decaying=decaying)
        settings = config.asynchronous
        self.optimizer = optimizer or settings.build_optimizer(
            buffer_size=self.strategy.buffer_size
        )
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state, device=self.device)
        self.norm_guard = norm_guard
        # --- the global model: float tensors are trained, the rest passed through ---
        self.state = {k: v.detach().to(self.device, copy=True) for k, v in global_state.items()}
        self.trained = {k: v for k, v in self.state.items() if v.is_floating_point()}
        if not self.trained:
            raise ValueError("global_state has no floating-point tensors to train")
        self.specs = tensor_specs(self.trained)
        self.version = version
        # --- codecs (built once per spec; the uplink ones checked now, not mid-run) ---
        seed = config.training.seed
        self.pruned: PrunedModel | None = None
        """The masks of a pruned run, once cut (``prune-at-version``)."""
        self._codec_factory: Callable[[str], UpdateCodecLike] = codec_factory or (
            lambda spec: default_codec_factory(
                spec,
                seed=seed,
                specs=self.specs,
                masks=self.pruned.masks if self.pruned is not None else None,
            )
        )
        self._codecs: dict[str, UpdateCodecLike] = {}
        for spec in self.schedule.extreme_specs():
            self._codec(spec)
        compression = config.compression
        delta = compression.downlink_kind == "delta"
        if delta:
            for spec in self.downlink_schedule.extreme_specs():
                self._downlink_codec(spec)
        self.downlink: DownlinkEncoder | SharedDownlink | RelayDownlink
        self._relayed: list[RelayEntry] = []
        """A relay downlink's record of the updates in the buffer (its next aggregation)."""
        self._relayed_from: list[int] = []
        """Their senders' node ids (a relay frame names a device's own by digest)."""
        if compression.downlink_kind == "shared":
            self.downlink = self._shared_downlink(global_state, version)
        elif compression.downlink_kind == "relay":
            self.downlink = self._relay_downlink(global_state, version)
        else:
            self.downlink = DownlinkEncoder(
                self.specs,
                full_codec=self._downlink_codec(compression.downlink_codec),
                kind=cast(DownlinkKind, compression.downlink_kind),
                delta_codec=(
                    (
                        lambda version: self._codec(
                            self._masked(self.downlink_schedule.spec(version))
                        )
                    )
                    if delta
                    else None
                ),
                keep_start=self.strategy.needs_start_model,
                max_lag=compression.downlink_max_lag,
                device=self.device,
                **(self._seeded_start(global_state, version) if delta else {}),
            )
        self.buffer = UpdateBuffer(
            self.specs,
            capacity=self.strategy.buffer_size,
            normalization=self.strategy.mean,
            device=self.device,
        )
        self._scales_step = settings.staleness_scales_step and self.strategy.mean != "count"
        """Scale each aggregate by its updates' mean staleness weight (``staleness-scales-
        step``), where the buffer's mean cancelled the weights."""
        self._staleness_weights = 0.0
        """The staleness weights of the updates in the buffer, summed."""
        training = config.training
        self.schedule_clock: ScheduleClock | None = (
            ScheduleClock(
                self.strategy.concurrency,
                synchronous=self.strategy.synchronous,
                # A resumed run without its count in the checkpoint (an older one): the
                # steps its versions stand for (restore_progress puts the saved count in).
                steps_before=version * self.strategy.buffer_size * training.local_steps,
            )
            if training.client_schedule_clock == "run"
            else None
        )
        """Where the run stands for the devices' schedules (``None``: their own counts)."""
        self.local_steps: DynamicLocalSteps | None = (
            DynamicLocalSteps(training.local_steps, minimum=training.local_steps_min)
            if training.local_steps_policy == "speed"
            else None
        )
        """Step budgets by measured speed (``local-steps-policy = "speed"``)."""
        if self.local_steps is not None and self.strategy.synchronous:
            raise SettingsError(
                "local-steps-policy 'speed' is for asynchronous strategies: a synchronous "
                f"round of {self.strategy.name!r} waits for its slowest site whatever its budget"
            )
        self.steps_planned = 0
        """The step budgets of every task planned (what a dynamic budget run stops by)."""
        # --- bookkeeping ---
        self.tally = RunTally(target_accuracy=config.stop.target_accuracy)
        if isinstance(self.downlink, SharedDownlink):
            self.tally.bytes_down_broadcast = 0
        self.rejections: Counter[str] = Counter()
        """Rejected replies by :attr:`Rejection.kind`."""
        if pruning_state:
            # A resumed pruned run: the saved cut (masks, version), not a new one.
            self.pruned = PrunedModel.restore(
                self.trained,
                self.specs,
                pruning_state,
                sparsity=compression.prune_sparsity,
            )
            self._rebase_downlink()
        elif 0 <= compression.prune_at_version <= version:
            # Pruning at version 0, or a resumed run that saved no cut (an older
            # checkpoint): a cut model's zeros are its smallest entries, so the same masks
            # come out again unless a kept weight is exactly zero.
            self._prune()
        self.ab: ABTraining | None = None
        """An AB-Training run's factors (``ab-rank`` > 0)."""
        if compression.ab_rank > 0:
            self.ab = ABTraining(
                self.specs,
                rank=compression.ab_rank,
                min_rate=compression.ab_min_rate,
                schedule=compression.ab_schedule,
                refactor_every=compression.ab_refactor_every,
                device=self.device,
                codec_factory=lambda specs: default_codec_factory(
                    compression.downlink_codec, seed=seed, specs=specs
                ),
            )

    # --- tasks --------------------------------------------------------------------------------
    def plan_task(self, node_id: int, number: int) -> InFlight:
        """Plan the ``number``-th task, for ``node_id``, from the current model: its
        record, for as long as it is in flight."""
        version = self.version
        task_id = f"task-{number:06d}"
        downlink = self.downlink.prepare(node_id, self.trained, version)
        side, factors, frozen = (
            self.ab.for_task(number, version, self.trained)
            if self.ab is not None
            else ("", b"", None)
        )
        budget = (
            self.local_steps.budget(node_id)
            if self.local_steps is not None
            else self.config.training.local_steps
        )
        self.steps_planned += budget
        flight = InFlight(
            task_id=task_id,
            number=number,
            node_id=node_id,
            version=version,
            uplink_spec=self._masked(self.schedule.spec(version)),
            downlink=downlink,
            seed=task_seed(self.config.training.seed, number),
            mask=self.pruned.for_task(node_id) if self.pruned is not None else b"",
            ab_side=side,
            factors=factors,
            frozen=frozen,
            local_steps=budget,
            schedule_step=(
                self.schedule_clock.plan(version, budget) if self.schedule_clock is not None else -1
            ),
            in_collective=self.collective != "none",
        )
        self.tally.tasks += 1
        self.tally.bytes_down += flight.downlink_bytes
        if downlink.broadcast_bytes is not None and self.tally.bytes_down_broadcast is not None:
            # Masks and factors are per device: as sent, in either figure.
            extra = flight.downlink_bytes - len(downlink.payload)
            self.tally.bytes_down_broadcast += downlink.broadcast_bytes + extra
        return flight

    def forget(self, flight: InFlight) -> None:
        """The task failed or was lost: the device's copy of the model is unknown now."""
        self.downlink.reset(flight.node_id)
        if self.pruned is not None:
            self.pruned.forget(flight.node_id)

    def arrived(
        self, flight: InFlight, payload_bytes: int, *, steps: int = 0, compute_s: float = 0.0
    ) -> int:
        """A reply is in (counted now, whatever becomes of it): its staleness, computed
        here once and kept on the record (:attr:`InFlight.staleness`). ``steps``: the
        optimizer steps the reply reports (the schedule clock counts them for a task
        without a step budget); ``compute_s``: the seconds they took on the device
        (dynamic local steps measure its speed by them)."""
        if self.schedule_clock is not None and flight.local_steps == 0:
            self.schedule_clock.reported(steps)
        if self.local_steps is not None:
            self.local_steps.observe(flight.node_id, compute_s, steps)
        # The device replied, so it holds what its downlink decoded to.
        self.downlink.commit(flight.node_id)
        if self.pruned is not None:
            self.pruned.commit(flight.node_id)
        self.tally.arrivals += 1
        self.tally.bytes_up += self.wire_bytes_up(payload_bytes)
        flight.staleness = self.version - flight.version
        return flight.staleness

    def wire_bytes_up(self, payload_bytes: int) -> int:
        """What a reply's payload costs on the wire: its length, or in a run counted as
        a collective among its ``C`` sites what the collective moves for it: an
        all-gather sends it to the ``C - 1`` others, a ring all-reduce sends
        ``2 (C - 1) / C`` of it."""
        sites = self.strategy.buffer_size
        if self.collective == "allgather":
            return payload_bytes * (sites - 1)
        if self.collective == "allreduce":
            return round(payload_bytes * 2 * (sites - 1) / sites)
        return payload_bytes

    # --- replies ------------------------------------------------------------------------------
    def receive(
        self, flight: InFlight, payload: bytes, num_examples: int, *, malformed: str = ""
    ) -> Verdict:
        """Judge one reply (after :meth:`arrived`) and aggregate when K are cached.

        Parameters
        ----------
        flight : InFlight
            The task it answers (its staleness set by :meth:`arrived`).
        payload : bytes
            The encoded update.
        num_examples : int
            The device's training examples, as the reply says.
        malformed : str
            Non-empty when the reply could not even be read (why).

        Raises
        ------
        ValueError
            If :meth:`arrived` has not been told of the reply yet.
        """
        staleness = flight.staleness
        if staleness is None:
            raise ValueError(f"{flight.task_id}: receive() before arrived()")
        arrival = Arrival(staleness=staleness, num_examples=num_examples, version=flight.version)
        refused = malformed or self.strategy.check(arrival)
        update = (
            Rejection(Rejection.MALFORMED, refused) if refused else self._decode(flight, payload)
        )
        if isinstance(update, Rejection):
            return self._reject(staleness, update)
        norm = update_norm(update.tensors) if self.norm_guard is not None else 0.0
        if self.norm_guard is not None and (why := self.norm_guard.check(norm)):
            return self._reject(staleness, Rejection(Rejection.NORM, why))
        if not self.strategy.accepts(arrival):
            self.tally.drops["stale"] += 1
            return Verdict("stale", staleness)
        weight = self.strategy.weight(arrival)
        start = flight.downlink.start
        contribution = self.strategy.contribution(update.tensors, arrival, self.trained, start)
        # The update itself is valid already; a strategy's own contribution (new tensors,
        # e.g. fedasync-mix's model mixing) is checked here, once, before the buffer.
        self.buffer.add(
            update if contribution is update.tensors else validate_update(contribution, self.specs),
            weight,
        )
        if isinstance(self.downlink, RelayDownlink):
            self._relayed.append(RelayEntry(weight, flight.uplink_spec, bytes(payload)))
            self._relayed_from.append(flight.node_id)
        self._staleness_weights += self.strategy.staleness(staleness)
        if self.norm_guard is not None:
            self.norm_guard.accept(norm)
        self.tally.aggregated += 1
        self.tally.staleness[staleness] += 1
        if not self.buffer.is_full:
            return Verdict("buffered", staleness)
        aggregate = self.buffer.take()  # on the model's device: no copy to step with
        factor = 1.0
        if self._scales_step:
            # The mean (weight, selected) cancelled the staleness weights: put them back
            # as one factor, the K updates' mean staleness weight (count's division by K).
            factor = self._staleness_weights / aggregate.count
            if factor != 1.0:
                for tensor in aggregate.update.values():
                    tensor.mul_(factor)
        self._staleness_weights = 0.0
        self.optimizer.step(self.trained, aggregate.update)
        if isinstance(self.downlink, RelayDownlink):
            self.downlink.record(self.version + 1, factor, self._relayed, self._relayed_from)
            self._relayed, self._relayed_from = [], []
        self.version += 1
        if self.pruned is not None:
            # The optimizer's momentum from before the cut must not revive pruned entries.
            self.pruned.apply(self.trained)
        elif self.version == self.config.compression.prune_at_version:
            self._prune()
        return Verdict(
            "aggregated", staleness, updates=aggregate.count, weight_sum=aggregate.weight_sum
        )

    def _decode(self, flight: InFlight, payload: bytes) -> ValidUpdate[SparseTensor] | Rejection:
        """The reply's update, decoded and validated (the one check it gets), or why not."""
        # An AB-Training reply holds factor deltas: its schema is its side's.
        side = cast(Side, flight.ab_side)
        expected = self.ab.uplink[side] if self.ab is not None else self.specs
        codec = self._codec(flight.uplink_spec)
        try:
            # The task's codec and no other: a frame naming another one is refused on its
            # header, before a pipeline is built or anything allocated for it.
            decoded = codec.decode(payload, expected, device=self.device, own_spec_only=True)
        except Exception as err:  # any failure to decode is the payload's fault here
            return Rejection.decode_failed(err)
        try:
            update = validate_update(decoded, expected)
        except InvalidUpdate as err:
            return Rejection(Rejection.INVALID, f"invalid update: {err}")
        if self.ab is not None:
            # The exact rank-r products of a valid reply's factor deltas with the factors
            # the task carried: valid by construction, not checked again.
            if flight.frozen is None:
                raise RuntimeError(f"AB-Training task {flight.task_id} carries no factors")
            rebuilt = self.ab.rebuild(side, flight.frozen, update.tensors)
            return ValidUpdate(MappingProxyType(rebuilt), MappingProxyType(self.specs))
        return update

    def _reject(self, staleness: int, rejection: Rejection) -> Verdict:
        self.tally.drops["rejected"] += 1
        self.rejections[rejection.kind] += 1
        return Verdict("rejected", staleness, rejection=rejection)

    # --- progress -----------------------------------------------------------------------------
    def progress_state(self) -> dict[str, int]:
        """The steps planned so far (dynamic budgets) and the schedule clock's count, for a
        checkpoint (:meth:`restore_progress` puts them back)."""
        state = {"steps_planned": self.steps_planned}
        if self.schedule_clock is not None:
            state["schedule_steps"] = self.schedule_clock.steps
        return state

    def restore_progress(self, state: Mapping[str, Any]) -> None:
        """Continue a resumed run's counts from :meth:`progress_state` (an older checkpoint
        has none: the schedule clock then keeps its estimate from the version)."""
        self.steps_planned = int(state.get("steps_planned", self.steps_planned))
        if self.schedule_clock is not None and "schedule_steps" in state:
            self.schedule_clock.steps = int(state["schedule_steps"])

    # --- the end ------------------------------------------------------------------------------
    def discard_buffer(self) -> int:
        """Drop the updates cached for an aggregation that will not come; returns how many."""
        discarded = len(self.buffer)
        self.buffer.clear()
        self._staleness_weights = 0.0
        self._relayed, self._relayed_from = [], []
        return discarded

    def placement(self) -> dict[str, torch.device]:
        """The device of every tensor the engine holds, by path (``buffer._sums['w']``).

        Everything is walked (:func:`~fedsync.aggregation.placement.tensor_devices`) but
        the codecs: they hold no state of the run, only what they derive from the masks
        (their own copy of the mask positions, to decode frames by) and nothing at all
        when no model is pruned. Every entry should be :attr:`device`.
        """
        return tensor_devices(self, skip=_is_codec)

    def describe(self) -> dict[str, Any]:
        """The strategy, optimizer and guard, for ``summary.json``."""
        return {
            "policy": self.strategy.describe(),
            "server_optimizer": repr(self.optimizer),
            "collective": self.collective,
            "schedule_clock": (
                self.schedule_clock.describe() if self.schedule_clock is not None else None
            ),
            "local_steps": (self.local_steps.describe() if self.local_steps is not None else None),
            "steps_planned": self.steps_planned,
            "rejections": dict(sorted(self.rejections.items())),
            "downlink_resyncs": self.downlink.resyncs,
            **(
                {"downlink_shared": self.downlink.describe()}
                if isinstance(self.downlink, SharedDownlink)
                else {"downlink": self.downlink.describe()}
            ),
            "pruning": self.pruned.describe() if self.pruned is not None else None,
            "ab_training": self.ab.describe() if self.ab is not None else None,
            "update_guard": self.norm_guard.summary() if self.norm_guard is not None else None,
        }

    # --- pruning ------------------------------------------------------------------------------
    def _prune(self) -> None:
        """Cut the global model now; every later payload both ways is masked."""
        self.pruned = PrunedModel(
            self.trained,
            self.specs,
            sparsity=self.config.compression.prune_sparsity,
            version=self.version,
        )
        self._rebase_downlink()

    def _rebase_downlink(self) -> None:
        # Replicas from before the cut hold the pruned entries: full payloads next.
        self.downlink.rebase(
            self._downlink_codec(self._masked(self.config.compression.downlink_codec))
        )

    def _masked(self, spec: str) -> str:
        """``spec``, restricted to the masks once the model is pruned."""
        return self.pruned.spec(spec) if self.pruned is not None else spec

    # --- helpers ------------------------------------------------------------------------------
    def _codec(self, spec: str) -> UpdateCodecLike:
        codec = self._codecs.get(spec)
        if codec is None:
            try:
                codec = self._codec_factory(spec)
            except ValueError as err:
                raise SettingsError(f"codec spec {spec!r} is not valid: {err}") from err
            self._codecs[spec] = codec
        return codec

    def _shared_downlink(
        self, global_state: Mapping[str, torch.Tensor], version: int
    ) -> SharedDownlink:
        """``downlink-kind = "shared"``: one change per version for every device; a run
        that starts at version 0 with ``downlink-seeded-start`` starts every device at the
        seeded initial model (otherwise a first contact gets the whole model, and the
        sequence starts on the grid)."""
        compression = self.config.compression
        seeded = self._seeded_start(global_state, version)
        for spec in self.downlink_schedule.extreme_specs():
            if _has_feedback(self._codec(spec)):
                raise SettingsError(
                    f"downlink-delta-codec {spec!r} must not use error feedback (+ef) with "
                    "downlink-kind 'shared': the server keeps the one residual itself"
                )
        try:
            grid = grid_of(compression.downlink_codec)
        except ValueError as err:
            raise SettingsError(str(err)) from err
        return SharedDownlink(
            self.specs,
            full_codec=self._downlink_codec(compression.downlink_codec),
            grid=grid,
            delta_codec=lambda v: self._codec(self._masked(self.downlink_schedule.spec(v))),
            **seeded,
            max_versions=compression.downlink_max_versions,
            max_lag=compression.downlink_max_lag,
            keep_start=self.strategy.needs_start_model,
            device=self.device,
        )

    def _relay_downlink(
        self, global_state: Mapping[str, torch.Tensor], version: int
    ) -> RelayDownlink:
        """``downlink-kind = "relay"``: every device replays the server's aggregations
        from the seeded initial model (:mod:`fedsync.aggregation.relay_downlink`), so
        only what those aggregations do to the model may change it."""
        compression = self.config.compression
        why = ""
        if version != 0 or not compression.downlink_seeded_start:
            why = "needs downlink-seeded-start = true and a run that starts at version 0"
        elif compression.prune_at_version >= 0 or compression.ab_rank > 0:
            why = "cannot follow pruning or AB-Training (they change the model between steps)"
        elif (
            self.strategy.needs_start_model
            or type(self.strategy).contribution is not Strategy.contribution
        ):
            why = f"cannot replay strategy {self.strategy.name!r} (it does not add the updates)"
        else:
            try:
                replayed = optimizer_from_hyperparameters(self.optimizer.hyperparameters())
            except ValueError as err:
                why = f"cannot replay the server optimizer {self.optimizer!r}: {err}"
            else:
                if type(replayed) is not type(self.optimizer):
                    why = (
                        f"cannot replay the server optimizer {self.optimizer!r}: devices step "
                        f"with fedsync's {type(replayed).__name__}, not this subclass"
                    )
        if why:
            raise SettingsError(f"downlink-kind 'relay' {why}")
        seeded = self._seeded_start(global_state, version)
        return RelayDownlink(
            mean=self.strategy.mean,
            optimizer=self.optimizer,
            initial_digest=seeded["initial_digest"],
        )

    def _seeded_start(
        self, global_state: Mapping[str, torch.Tensor], version: int
    ) -> dict[str, Any]:
        """The delta and shared downlinks' seeded start: the initial model and its digest
        when the run starts at version 0 and ``downlink-seeded-start`` says every device
        builds that model itself; empty otherwise."""
        if version != 0 or not self.config.compression.downlink_seeded_start:
            return {}
        return {
            "initial": self.trained,
            "initial_digest": state_digest({name: global_state[name] for name in self.specs}),
        }

    def _downlink_codec(self, spec: str) -> UpdateCodecLike:
        codec = self._codec(spec)
        # One server codec encodes for every device: an error-feedback memory inside it
        # would mix all devices' residuals. downlink-kind = "delta" keeps a residual per
        # device instead (global minus that device's replica).
        if _has_feedback(codec):
            raise SettingsError(
                f"downlink codec {spec!r} must not use error feedback (+ef): use "
                "downlink-kind = 'delta', which keeps a per-device residual on the server"
            )
        return codec


def task_seed(seed: int, number: int) -> int:
    """A distinct, reproducible 31-bit seed (torch/numpy) per (run seed, task number)."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, number]).generate_state(1)[0]
    return int(state) & 0x7FFFFFFF


def _has_feedback(codec: UpdateCodecLike) -> bool:
    """Whether a codec keeps an error-feedback memory (``+ef``)."""
    return getattr(getattr(codec, "config", None), "feedback", None) is not None


def _is_codec(obj: object) -> bool:
    return callable(getattr(obj, "encode", None)) and callable(getattr(obj, "decode", None))
