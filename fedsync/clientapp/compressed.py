"""Compressed train tasks: decode the downlink, train, send an error-fed-back update.

The server's side of the downlink is :class:`fedsync.aggregation.downlink.DownlinkEncoder`:
a ``full`` payload decodes to the whole model; a ``delta`` payload decodes to the
difference against the model this node decoded last time, which the node keeps in
Flower's ``context.state``. A delta that arrives without that base (the node restarted,
so its state is gone) is refused with a clear error: the server then resets its replica
and sends a full model next time, instead of this node training from a wrong one.

The uplink is ``local model - start model``, compressed with the task's codec spec (its
density and bit width may change from task to task); the codec's sender memory (error
feedback residual, step counter) lives in ``context.state`` too, so the update mass a
task did not send goes out with a later one. A restarted SuperNode has an empty
``context.state``; with ``state-dir`` the memory is also kept crash-safe on disk and
picked up from there (:mod:`fedsync.clientapp.node_store`). Node config ``fault`` turns
the node into a faulty one for deployment tests (:mod:`fedsync.clientapp.faults`).

A ``relay`` downlink (:mod:`fedsync.aggregation.relay_downlink`) is the server's
aggregations since the version this node holds, which the node replays on its model and
its copy of the server optimizer (both kept in the node state): its model is then the
server's, bit for bit. A node with no such state (its first task, or one the server
knows it lost) gets them from version 0 and starts from the seeded initial model.

A ``shared`` downlink (:mod:`fedsync.aggregation.shared_downlink`) is one frame of the
changes since the model version this node holds (kept with the model in
``context.state``), a whole model, or nothing at all when the node holds its start
model already; on a node's first contact the start may be the seeded initial model,
which the node checks against the digest the task carries. A frame for another version
or base than the node holds, and an initial model whose digest differs, are refused
with a :class:`SharedDownlinkError` (the node's model is left as it was): the server
then resends the whole model.

In a pruned run (``prune-at-version``) the first task after the cut brings the pruning
masks (a bitmap frame, :mod:`fedsync.wire.mask`); the node keeps them in
``context.state``. Tasks whose codec specs name masks (``mask:digest=...``) decode the
downlink with them, train with the pruned weights held at zero (their gradients are
masked), and send values at the kept positions only. A node asked for masks it does not
hold (restarted) or holds other masks than the task names refuses the task with
:class:`PruningMaskError`: the server then sends the masks again with the next one.

Where this module says ``context.state`` for arrays (the codec's memory, the decoded
model, the masks), it means the node's :class:`~fedsync.clientapp.node_store.NodeStore`:
``context.state``, or with ``node-state = "disk"`` files and a token in
``context.state``, what a simulation of many nodes needs when the model is large.

In an AB-Training run (``ab-rank``) every task also names the factor it trains and
brings the frozen other one (:mod:`fedsync.clientapp.ab_training`); the update is then the
trained factor's delta for each factored tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING

import numpy as np
import torch
from flwr.app import ConfigRecord, Context
from flwr.common.logger import log

from fedsync.clientapp.ab_training import FactoredModel
from fedsync.clientapp.faults import FaultInjector
from fedsync.clientapp.frame_audit import audit_folder, safe_name
from fedsync.clientapp.frame_audit import record as record_frame
from fedsync.clientapp.node_store import CODEC_STATE, NodeStore, keeps_live_state
from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.compression.pruning import mask_digest
from fedsync.compression.sparsifiers.mask import MaskConfig
from fedsync.compression.spec import parse_spec
from fedsync.models.initial import state_digest
from fedsync.protocol import TrainTask
from fedsync.records import get_int
from fedsync.updates import TensorSpec, densify
from fedsync.wire import UnexpectedCodec
from fedsync.wire.mask import decode_masks
from fedsync.wire.shared import advance, decode_shared

DOWNLINK_BASE = "fedsync-downlink-base"
"""Node store kind: the model this node decoded from its last downlink."""
FAULT_COUNTER = "fedsync-faults"
"""``context.state`` record: compressed tasks seen, to cycle injected fault kinds."""
PRUNING_MASK = "fedsync-pruning-mask"
"""Node store kind: the pruning-mask frame this node was sent (a pruned run)."""
DOWNLINK_VERSION = "fedsync-downlink-version"
"""``context.state`` record: the shared downlink's ``epoch`` and ``version`` of the model
kept in :data:`DOWNLINK_BASE`."""
RELAY_OPTIMIZER = "fedsync-relay-optimizer"
"""Node store kind: a relay downlink's copy of the server optimizer's buffers, by
``"<slot>:<tensor position>"``."""
RELAY_SENT = "fedsync-relay-sent"
"""Node store kind: the uplink frames this node sent in a relay run (the last
:data:`RELAY_SENT_KEPT`), by ``"<order>-<digest hex>"``: a relay frame names them by
digest instead of sending them back."""
RELAY_SENT_KEPT = 8
"""Most sent uplink frames a relay node keeps (one is named by the frame after its
aggregation; a refused or dropped one is never named and ages out)."""
RELAY_VERSION = "fedsync-relay-version"
"""``context.state`` record: the ``version`` of the relay downlink's model (kept in
:data:`DOWNLINK_BASE`), its optimizer copy's ``steps`` and how many ``buffers`` arrays
:data:`RELAY_OPTIMIZER` holds (a node that lost them refuses the frame)."""

Masks = dict[str, torch.Tensor]


class MissingDownlinkBase(ValueError):
    """A delta downlink arrived, but this node holds no model to apply it to."""


class SharedDownlinkError(MissingDownlinkBase):
    """A shared downlink this node cannot apply to what it holds; the node's model is
    left as it was and the server resends the whole model."""


class DownlinkVersionMismatch(SharedDownlinkError):
    """A shared frame for another model version than the task's, or from another base
    than the version this node holds."""


class InitialModelMismatch(SharedDownlinkError):
    """The task starts from the seeded initial model, and this node's differs from the
    server's (another seed, model or platform): its digest does not match."""


class PruningMaskError(ValueError):
    """A task names pruning masks this node does not hold (or holds others)."""


def uplink_delta(
    model: torch.nn.Module,
    start: Mapping[str, torch.Tensor],
    specs: Mapping[str, TensorSpec],
    *,
    factored: FactoredModel | None = None,
    masks: Masks | None = None,
) -> dict[str, torch.Tensor]:
    """``trained - start`` of every tensor the frames carry, where training ran.

    On a GPU node the codec then runs the Triton kernels there
    (:mod:`fedsync.kernels.dispatch` picks them for CUDA tensors), and only the encoded
    payload crosses to the host. An AB-Training task sends its trained factor's delta in
    place of each factored weight's; a pruned run keeps the pruned positions at zero.
    """
    trained = model.state_dict()
    factor_deltas = factored.factor_deltas() if factored is not None else {}
    delta = {}
    for name in specs:
        if name in factor_deltas:
            delta[name] = factor_deltas[name]
            continue
        now = trained[name].detach()
        delta[name] = now.float() - start[name].to(now.device).float()
    for name, mask in (masks or {}).items():
        delta[name] = delta[name] * mask.to(delta[name].device)
    return delta


def encode_uplink(
    delta: Mapping[str, torch.Tensor],
    task: TrainTask,
    context: Context,
    *,
    partition_id: int,
    masks: Masks | None = None,
    store: NodeStore | None = None,
) -> bytes:
    """Compress ``delta`` with this node's error-feedback memory and keep the memory.

    The memory is kept in ``store`` (default: the store the node's settings select,
    :class:`~fedsync.clientapp.node_store.NodeStore`; ``state-dir`` keeps it crash-safe
    too). The codec's random choices are seeded by the run's seed and ``partition_id``;
    node config ``fault`` corrupts the frame (deployment tests,
    :mod:`fedsync.clientapp.faults`). With ``FEDSYNC_FRAME_AUDIT`` set, each encode's inputs
    and frame are recorded for replay on another device (:mod:`fedsync.clientapp.frame_audit`).
    """
    # Both ends know the model: frames carry its schema digest, not its tensor table.
    specs = tensor_specs(delta)
    codec = UpdateCodec(
        task.uplink_codec,
        seed=task.run_seed * 100_003 + partition_id,
        specs=specs,
        masks=masks,
    )
    held = store if store is not None else NodeStore.of(context, job=task.job)
    # On an accelerator the residual stays there between tasks (NodeStore.take_live);
    # the saved copy below is still written every task.
    device = next(iter(delta.values())).device
    live = keeps_live_state(device)
    if not (live and held.take_live(codec)):
        arrays = held.get(CODEC_STATE, specs=specs)
        if arrays is not None:
            codec.load_state(arrays)
    audit = audit_folder() if masks is None else None
    before = codec.to_state() if audit is not None else None
    uplink = codec.encode(delta)
    if audit is not None and before is not None:
        try:
            record_frame(
                audit,
                name=f"run{context.run_id}-{safe_name(task.job)}-node{context.node_id}"
                f"-p{partition_id}-v{task.version:06d}-s{task.task_seed}",
                spec=task.uplink_codec,
                seed=codec.seed,
                update=delta,
                before=before,
                after=codec.to_state(),
                frame=uplink,
                state_device=str(device) if live else "cpu",
            )
        except (OSError, ValueError) as err:  # a diagnostic: the task goes on without it
            log(WARNING, "[fedsync] frame audit: could not record this encode: %s", err)
    held.put(CODEC_STATE, codec.to_state(), task=f"v{task.version}/{task.task_seed}")
    if live:
        held.keep_live(codec)
    sent = _maybe_corrupt(uplink, delta, task, context, masks)
    if task.downlink_kind == "relay":
        keep_sent_uplink(sent, held)
    return sent


def keep_sent_uplink(payload: bytes, store: NodeStore) -> None:
    """Keep an uplink frame this node sends in a relay run: the relay frame that carries
    its aggregation names it by digest (:func:`fedsync.wire.relay.uplink_digest`) instead
    of sending it back. The last :data:`RELAY_SENT_KEPT` are kept, in :data:`RELAY_SENT`.
    """
    from fedsync.wire.relay import uplink_digest

    kept = dict(store.get(RELAY_SENT) or {})
    order = 1 + max((int(key.partition("-")[0]) for key in kept), default=-1)
    kept[f"{order:012d}-{uplink_digest(payload).hex()}"] = np.frombuffer(payload, np.uint8)
    store.put(RELAY_SENT, dict(sorted(kept.items())[-RELAY_SENT_KEPT:]))


def _sent_digest(key: str) -> bytes:
    """The digest a :data:`RELAY_SENT` key names (``"<order>-<digest hex>"``)."""
    return bytes.fromhex(key.partition("-")[2])


def _sent_uplinks(store: NodeStore) -> dict[bytes, bytes]:
    """The uplink frames :func:`keep_sent_uplink` kept, by digest."""
    return {_sent_digest(key): a.tobytes() for key, a in (store.get(RELAY_SENT) or {}).items()}


def apply_downlink(
    payload: bytes,
    kind: str,
    specs: Mapping[str, TensorSpec],
    context: Context,
    *,
    keep_base: bool = True,
    masks: Masks | None = None,
    initial_digest: str = "",
    initial: Mapping[str, torch.Tensor] | None = None,
    store: NodeStore | None = None,
    codecs: Sequence[str] = (),
) -> dict[str, torch.Tensor]:
    """Decode the downlink into the model to start from; remember it if ``keep_base``.

    The model is remembered in ``store`` (default: the store the node's settings select,
    :class:`~fedsync.clientapp.node_store.NodeStore`).

    ``masks`` are the pruning masks a masked downlink (``mask:digest=...``) needs. A
    delta with ``initial_digest`` (a seeded start: the task is this node's first and the
    run started from the seeded initial model) applies to ``initial``, this node's own
    initial model, checked against the digest (:class:`InitialModelMismatch` otherwise),
    not to a base the node holds; its payload is empty while the global model is still
    that version 0. ``codecs``: the codec the task names for the payload's frame (empty:
    any); a frame of another raises :class:`~fedsync.wire.UnexpectedCodec`, the node's
    state untouched.
    """
    held = store if store is not None else NodeStore.of(context)
    start = _downlink_start(payload, kind, specs, held, masks, initial_digest, initial, codecs)
    if not keep_base:
        held.drop(DOWNLINK_BASE)
        return start
    held.put(DOWNLINK_BASE, {name: tensor.numpy() for name, tensor in start.items()})
    return start


def _downlink_start(
    payload: bytes,
    kind: str,
    specs: Mapping[str, TensorSpec],
    store: NodeStore,
    masks: Masks | None,
    initial_digest: str,
    initial: Mapping[str, torch.Tensor] | None,
    codecs: Sequence[str],
) -> dict[str, torch.Tensor]:
    if kind not in ("full", "delta"):
        raise ValueError(f"downlink-kind must be 'full' or 'delta', got {kind!r}")
    if kind == "full":
        return _decoded(payload, specs, masks, codecs, 0)
    if initial_digest:
        base = _initial_base(initial_digest, initial, specs)[2]
        if not payload:
            return base
    else:
        base_arrays = store.get(DOWNLINK_BASE)
        if base_arrays is None or set(base_arrays) != set(specs):
            raise MissingDownlinkBase(
                "delta downlink but this node holds no base model (restarted?); "
                "the server must send a full model"
            )
        base = {name: torch.from_numpy(base_arrays[name]) for name in specs}
    decoded = _decoded(payload, specs, masks, codecs, 0)
    return {name: base[name] + decoded[name] for name in specs}


def _decoded(
    frame: bytes,
    specs: Mapping[str, TensorSpec],
    masks: Masks | None,
    codecs: Sequence[str],
    position: int,
    built: dict[str, UpdateCodec] | None = None,
) -> dict[str, torch.Tensor]:
    """The ``position``-th update frame of a downlink, decoded with the codec the task
    names for it (any codec when it names none); ``built`` keeps the codecs of one
    downlink's frames by spec, so a frame of many changes builds each codec once."""
    if not codecs:
        return densify(UpdateCodec(masks=masks).decode(frame, expected=specs))
    if position >= len(codecs):
        raise UnexpectedCodec(
            "the downlink holds more frames than the task names codecs for",
            field="downlink-codecs",
            expected=f"> {position} codecs",
            got=len(codecs),
        )
    spec = codecs[position]
    cache = built if built is not None else {}
    codec = cache.get(spec)
    if codec is None:
        codec = cache[spec] = UpdateCodec(spec, masks=masks)
    return densify(codec.decode(frame, expected=specs, own_spec_only=True))


def apply_shared_downlink(
    payload: bytes,
    specs: Mapping[str, TensorSpec],
    context: Context,
    *,
    version: int,
    initial_digest: str = "",
    initial: Mapping[str, torch.Tensor] | None = None,
    masks: Masks | None = None,
    store: NodeStore | None = None,
    codecs: Sequence[str] = (),
) -> dict[str, torch.Tensor]:
    """Apply a shared downlink (:mod:`fedsync.wire.shared`) and keep the model it gives
    (in ``store``), with its version (in ``context.state``).

    Parameters
    ----------
    payload : bytes
        The task's downlink: a shared frame, or empty (the node holds its start).
    specs : mapping of str to TensorSpec
        The model's floating-point tensors.
    context : flwr.app.Context
        The node's context (the model's version is kept in ``context.state``).
    version : int
        The model version the task starts from.
    initial_digest : str
        Non-empty: the start's base is the seeded initial model, version 0, whose
        digest this is (:func:`fedsync.models.initial.state_digest`).
    initial : mapping of str to torch.Tensor, optional
        This node's own initial model (a freshly built, seeded one), used only with
        ``initial_digest``.
    masks : dict of str to torch.Tensor, optional
        The pruning masks a masked frame needs.
    store : NodeStore, optional
        Where the model is kept (default: the store the node's settings select).
    codecs : sequence of str
        The codec the task names for each update frame (its changes in order, or the
        whole model); empty: any.

    Raises
    ------
    fedsync.wire.PayloadError
        For a broken frame, or one of another codec than the task names
        (:class:`~fedsync.wire.UnexpectedCodec`).
    InitialModelMismatch
        If ``initial`` does not have ``initial_digest``.
    DownlinkVersionMismatch
        If the frame is for another version than ``version``, or from another base
        than the node holds.
    MissingDownlinkBase
        If the frame needs a base and the node holds none.

    On any of them the node's state is left as it was.
    """
    held_store = store if store is not None else NodeStore.of(context)
    frame = decode_shared(payload) if payload else None
    if frame is not None and frame.target != version:
        raise DownlinkVersionMismatch(
            f"shared downlink for model version {frame.target}, the task starts from {version}"
        )
    if frame is not None and frame.whole is not None:
        epoch = frame.epoch
        start = _decoded(frame.whole, specs, masks, codecs, 0)
    else:
        held = (
            _initial_base(initial_digest, initial, specs)
            if initial_digest
            else _held_shared_base(context, held_store, specs)
        )
        if held is None:
            raise MissingDownlinkBase(
                "shared downlink but this node holds no base model (restarted?); "
                "the server must send a whole model"
            )
        epoch, at, start = held
        base, sequence = (frame.base, frame.epoch) if frame is not None else (version, epoch)
        if (base, sequence) != (at, epoch):
            raise DownlinkVersionMismatch(
                f"shared downlink from version {base} of sequence {sequence}, this node "
                f"holds version {at} of sequence {epoch}"
            )
        if frame is not None:
            built: dict[str, UpdateCodec] = {}
            for position, (_, change) in enumerate(frame.links):
                change_values = _decoded(change, specs, masks, codecs, position, built)
                start = advance(start, change_values, frame.grid)
    held_store.put(DOWNLINK_BASE, {name: tensor.numpy() for name, tensor in start.items()})
    context.state.config_records[DOWNLINK_VERSION] = ConfigRecord(
        {"epoch": epoch, "version": version}
    )
    return start


def apply_relay_downlink(
    payload: bytes,
    specs: Mapping[str, TensorSpec],
    context: Context,
    *,
    version: int,
    initial_digest: str = "",
    initial: Mapping[str, torch.Tensor] | None = None,
    store: NodeStore | None = None,
) -> dict[str, torch.Tensor]:
    """Replay a relay downlink (:mod:`fedsync.wire.relay`) and keep the model and the
    optimizer copy it gives (in ``store``), with their version (in ``context.state``).

    Parameters
    ----------
    payload : bytes
        The task's downlink: a relay frame, or empty (the node holds its start).
    specs : mapping of str to TensorSpec
        The model's floating-point tensors.
    context : flwr.app.Context
        The node's context.
    version : int
        The model version the task starts from.
    initial_digest : str
        Non-empty: the replay starts from the seeded initial model, version 0, whose
        digest this is, with a fresh optimizer.
    initial : mapping of str to torch.Tensor, optional
        This node's own initial model (a freshly built, seeded one), used only with
        ``initial_digest``.
    store : NodeStore, optional
        Where the model and the optimizer copy are kept (default: the store the node's
        settings select).

    Raises
    ------
    fedsync.wire.PayloadError
        For a broken frame, or an update frame in it of another codec than it names.
    fedsync.aggregation.InvalidUpdate
        For an update in it that is not one of this model's.
    InitialModelMismatch
        If ``initial`` does not have ``initial_digest``.
    DownlinkVersionMismatch
        If the frame is for another version than ``version``, or from another base
        than the node holds.
    MissingDownlinkBase
        If the frame needs a base and the node holds none, or names an uplink frame
        of this node's that it no longer keeps (:func:`keep_sent_uplink`).

    On any of them the node's state is left as it was.
    """
    from fedsync.aggregation.relay_downlink import frame_optimizer, replay
    from fedsync.wire.relay import decode_relay

    held_store = store if store is not None else NodeStore.of(context)
    frame = decode_relay(payload) if payload else None
    if frame is not None and frame.target != version:
        raise DownlinkVersionMismatch(
            f"relay downlink for model version {frame.target}, the task starts from {version}"
        )
    names = sorted(specs)
    if initial_digest:
        at, start, saved = 0, _initial_base(initial_digest, initial, specs)[2], None
    else:
        record = context.state.config_records.get(RELAY_VERSION)
        arrays = held_store.get(DOWNLINK_BASE) if record is not None else None
        if record is None or arrays is None or set(arrays) != set(specs):
            raise MissingDownlinkBase(
                "relay downlink but this node holds no model (restarted?); the server must "
                "replay from version 0"
            )
        at = get_int(record, "version", -1)
        start = {name: torch.from_numpy(arrays[name].copy()) for name in specs}
        kept = held_store.get(RELAY_OPTIMIZER)
        if len(kept or {}) != get_int(record, "buffers", 0):
            raise MissingDownlinkBase(
                "relay downlink but this node lost its copy of the server optimizer; the "
                "server must replay from version 0"
            )
        saved = (get_int(record, "steps", 0), kept or {})
    base = frame.base if frame is not None else version
    if base != at:
        raise DownlinkVersionMismatch(
            f"relay downlink from version {base}, this node holds version {at}"
        )
    if frame is None and saved is not None:
        return start  # it holds the task's version already
    model, steps, buffers = start, 0, {}
    used = frame.own if frame is not None else set()
    if used and frame is not None:
        try:
            frame = frame.with_own(_sent_uplinks(held_store))
        except KeyError as err:
            raise MissingDownlinkBase(
                f"relay downlink names this node's own updates: {err.args[0]}; the server "
                "must replay from version 0"
            ) from None
    if frame is not None:
        optimizer = frame_optimizer(frame)
        if saved is not None:
            optimizer.load_state_dict(
                {
                    "kind": optimizer.kind,
                    "steps": saved[0],
                    "buffers": _buffers_from(saved[1], names),
                }
            )
        model = replay(frame, start, optimizer, specs)
        steps, buffers = optimizer.steps, optimizer.state_dict()["buffers"]
    kept_buffers = {
        f"{slot}:{names.index(name)}": tensor.numpy()
        for slot, tensors in buffers.items()
        for name, tensor in tensors.items()
    }
    held_store.put(DOWNLINK_BASE, {name: tensor.numpy() for name, tensor in model.items()})
    held_store.put(RELAY_OPTIMIZER, kept_buffers)
    if used:  # named once: the node's own update is in its model now
        sent = held_store.get(RELAY_SENT) or {}
        held_store.put(RELAY_SENT, {k: v for k, v in sent.items() if _sent_digest(k) not in used})
    context.state.config_records[RELAY_VERSION] = ConfigRecord(
        {"version": version, "steps": steps, "buffers": len(kept_buffers)}
    )
    return model


def _buffers_from(
    arrays: Mapping[str, np.ndarray], names: list[str]
) -> dict[str, dict[str, torch.Tensor]]:
    """The optimizer buffers :data:`RELAY_OPTIMIZER` keeps, by slot and tensor name."""
    buffers: dict[str, dict[str, torch.Tensor]] = {}
    for key, array in arrays.items():
        slot, _, position = key.rpartition(":")
        buffers.setdefault(slot, {})[names[int(position)]] = torch.from_numpy(array.copy())
    return buffers


def _initial_base(
    digest: str, initial: Mapping[str, torch.Tensor] | None, specs: Mapping[str, TensorSpec]
) -> tuple[int, int, dict[str, torch.Tensor]]:
    """This node's seeded initial model as version 0 of sequence 0, if its digest is
    the server's."""
    own = {}
    if initial is not None and set(specs) <= set(initial):
        own = {name: initial[name].detach().to("cpu", copy=True) for name in specs}
    held = state_digest(own) if own else "none"
    if held != digest:
        raise InitialModelMismatch(
            f"the task starts from the seeded initial model {digest[:16]}..., this node "
            f"builds {held[:16]}... (another seed, model or platform?); the server must "
            "send a whole model (initial arrays a device does not build itself: run with "
            "downlink-seeded-start = false)"
        )
    return 0, 0, own


def _held_shared_base(
    context: Context, store: NodeStore, specs: Mapping[str, TensorSpec]
) -> tuple[int, int, dict[str, torch.Tensor]] | None:
    """The shared downlink's model this node holds: ``(epoch, version, tensors)``."""
    config = context.state.config_records.get(DOWNLINK_VERSION)
    arrays = store.get(DOWNLINK_BASE) if config is not None else None
    if arrays is None or config is None or set(arrays) != set(specs):
        return None
    tensors = {name: torch.from_numpy(arrays[name]) for name in specs}
    return get_int(config, "epoch", -1), get_int(config, "version", -1), tensors


def pruning_masks(
    task: TrainTask,
    specs: Mapping[str, TensorSpec],
    context: Context,
    store: NodeStore | None = None,
) -> Masks | None:
    """The pruning masks the task's codecs name, keeping any the task delivers (in
    ``store``; default: the store the node's settings select).

    Returns ``None`` when the uplink spec names no masks (no cut yet, or not a pruned
    run).

    Raises
    ------
    fedsync.wire.PayloadError
        For a mask frame that is broken or made for another model (the node keeps what
        it held before).
    PruningMaskError
        If the spec names masks this node does not hold, or other masks than it holds,
        or the delivered masks were cut after the task's model version.
    """
    if task.mask:
        delivered = decode_masks(task.mask, specs)
        if delivered.version > task.version:
            raise PruningMaskError(
                f"pruning masks cut at model version {delivered.version} came with a task "
                f"of version {task.version}"
            )
    held = store if store is not None else NodeStore.of(context, job=task.job)
    if task.mask:
        held.put(PRUNING_MASK, {"frame": np.frombuffer(task.mask, dtype=np.uint8).copy()})
    sparsifier = parse_spec(task.uplink_codec).sparsifier
    if not isinstance(sparsifier, MaskConfig) or sparsifier.digest is None:
        return None
    record = held.get(PRUNING_MASK)
    if record is None or "frame" not in record:
        raise PruningMaskError(
            f"the task's codec {task.uplink_codec!r} names pruning masks this node does not "
            "hold (restarted?); the server must send them again"
        )
    masks = decode_masks(record["frame"].tobytes(), specs).masks
    digest = mask_digest(masks)
    if digest != sparsifier.digest:
        raise PruningMaskError(
            f"the task names pruning masks {sparsifier.digest}, this node holds {digest}"
        )
    return masks


def hold_pruned_at_zero(
    model: torch.nn.Module, masks: Masks | None
) -> list[torch.utils.hooks.RemovableHandle]:
    """Mask the gradients of pruned parameters: the pruned weights, zero in the start
    model, stay zero through SGD (momentum, weight decay and the proximal term of a
    zero weight with a zero gradient are zero)."""
    if not masks:
        return []
    hooks = []
    for name, parameter in model.named_parameters():
        mask = masks.get(name)
        if mask is not None:
            keep = mask.to(parameter.device, parameter.dtype)
            hooks.append(parameter.register_hook(lambda grad, keep=keep: grad * keep))
    return hooks


def _maybe_corrupt(
    uplink: bytes,
    delta: Mapping[str, torch.Tensor],
    task: TrainTask,
    context: Context,
    masks: Masks | None = None,
) -> bytes:
    """Replace the honest uplink when node config ``fault`` asks (deployment tests only)."""
    injector = FaultInjector.from_node_config(context.node_config)
    if injector is None:
        return uplink
    counter = context.state.config_records.get(FAULT_COUNTER, ConfigRecord({"tasks": 0}))
    index = get_int(counter, "tasks", 0)
    context.state.config_records[FAULT_COUNTER] = ConfigRecord({"tasks": index + 1})
    kind = injector.pick(index, task.task_seed)
    return (
        injector.corrupt(kind, uplink, delta, task.uplink_codec, task.task_seed, masks)
        if kind
        else uplink
    )
