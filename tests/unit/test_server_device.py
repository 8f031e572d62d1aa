"""``server-device``: the engine's state on one device, and the same bits as before on CPU.

* A fixed, seeded sequence of tasks and real encoded replies drives the engine through
  several versions in six settings (decaying top-k uplink with delta downlinks, a
  pruned run with Nesterov momentum, FedAsync mixing with Adam and the sign transform,
  PowerSGD factors with momentum, sparse and dense accumulators); a SHA-256 of the
  model, the optimizer state, every downlink and mask frame and every verdict must
  equal the digest the engine wrote before ``server-device`` (everything on the host).
* The state walker (:meth:`AggregationEngine.placement`) reaches every tensor the
  engine holds: the test plants a tensor on another device in each part and the walker
  must name it.
* The engine built on a device holds nothing elsewhere: on ``cpu`` here, on ``meta``
  for an engine resumed from a checkpoint (model and optimizer state: placement alone,
  nothing computed), on CUDA where one is present (skipped otherwise, as is every
  CUDA test here).
* Checkpoints hold CPU tensors; one written on CUDA resumes on the host.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from fedsync.aggregation.placement import misplaced, tensor_devices
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig, SettingsError
from fedsync.engine import AggregationEngine, InFlight
from fedsync.reports import RunRecorder
from fedsync.serverapp.checkpoint import CheckpointStore, load_checkpoint
from fedsync.serverapp.journal import RunJournal
from fedsync.updates import TensorSpec
from fedsync.wire.mask import decode_masks

_NO_CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"
)


def CUDA(test: Callable[..., None]) -> Callable[..., None]:
    """Marks a test ``gpu`` (``pytest -m gpu`` selects it) and skips it without CUDA."""
    return pytest.mark.gpu(_NO_CUDA(test))


SHAPES: dict[str, tuple[int, ...]] = {
    "embed.weight": (256, 64),
    "fc1.weight": (24, 16),
    "fc1.bias": (24,),
    "fc2.weight": (10, 24),
    "fc2.bias": (10,),
}
SPECS = {name: TensorSpec(name, shape) for name, shape in SHAPES.items()}


def initial_state() -> dict[str, torch.Tensor]:
    """A seeded model, plus an integer buffer the engine passes through untouched."""
    generator = torch.Generator().manual_seed(7)
    state = {name: torch.randn(shape, generator=generator) * 0.1 for name, shape in SHAPES.items()}
    state["bn.num_batches_tracked"] = torch.tensor(3, dtype=torch.int64)
    return state


SETTINGS: dict[str, dict[str, Any]] = {
    # TEASQ as configured by default: decaying top-k + 8..4 bits + EF up, delta downlinks.
    "teasq-delta": {"strategy": "teasq", "buffer_size": 2, "density_decay": 0.2},
    # A pruned run (cut at version 2) with Nesterov momentum and whole-model downlinks.
    "fedbuff-pruned-nesterov": {
        "strategy": "fedbuff",
        "buffer_size": 2,
        "server_optimizer": "nesterov",
        "server_learning_rate": 0.7,
        "downlink_kind": "full",
        "prune_at_version": 2,
        "prune_sparsity": 0.5,
    },
    # Model mixing (needs each task's start model) with Adam and the sign transform.
    "fedasync-mix-adam-sign": {
        "strategy": "fedasync-mix",
        "server_optimizer": "adam",
        "server_learning_rate": 0.01,
        "server_update_transform": "sign",
    },
    # Adam on the plain update: its second moment and root on every device alike.
    "fedbuff-adam": {
        "strategy": "fedbuff",
        "buffer_size": 2,
        "server_optimizer": "adam",
        "server_learning_rate": 0.01,
    },
    # Low-rank factors in the buffer, momentum on the server.
    "fedbuff-powersgd-momentum": {
        "strategy": "fedbuff",
        "buffer_size": 3,
        "uplink_codec": "powersgd:2+uniform:8",
        "server_optimizer": "momentum",
    },
    # Very sparse updates: the large tensor stays in the buffer's sparse accumulator.
    "fedbuff-sparse": {
        "strategy": "fedbuff",
        "buffer_size": 2,
        "uplink_codec": "topk:0.002+fp32",
    },
    # Dense updates (every position): the buffer's dense accumulators.
    "fedbuff-dense": {
        "strategy": "fedbuff",
        "buffer_size": 3,
        "uplink_codec": "none+uniform:8",
        "downlink_kind": "full",
        "downlink_codec": "none+fp32",
    },
}

MATMUL_DIGESTS = {
    "fedbuff-powersgd-momentum": (
        "9235e98a21530622082b9d4fd892a99a6b7ef4ab0a6480cdfdcb4105c08ae21b",  # 2 threads
        "da81aaf4454d7b0a9c366a48bd8d078ee4bc40bfebaf41a431b9f8548f6cea50",  # 1 thread
    ),
}
"""The other exact digest of a run whose values come out of a matrix product (PowerSGD):
torch's CPU matrix products round differently on an AMD EPYC than on the machine that
wrote :data:`DIGESTS` (``tests/unit/frame_golden.py``, ``MATMUL``), and there with one
torch thread otherwise than with two (``OMP_NUM_THREADS``)."""

DIGESTS = {
    "teasq-delta": "a9a2bbbc839132aca98b61afa2467f6bd17b6bb5cc13c16efae24dd05baada26",
    "fedbuff-pruned-nesterov": "c157cafbb65065467e21433a446c140addd0e9710a62d89d3529e5debcf363c1",
    "fedasync-mix-adam-sign": "da40d9769ed762933609519754b34d39c49346178c7543f162cdc909725917d1",
    "fedbuff-adam": "2eda4c622bd59aa6de031ef029ce830d7cf1635433184e0c118a397e90ff00ea",
    "fedbuff-powersgd-momentum": "81d9b4dcf20118526633209e8bd88a7ad944fe3ed9b84cd4475c922a2f39cc7b",
    "fedbuff-dense": "f9853bf12aa8df63b14b734e6ec477cf07422f289e559bb83b9a5b34bba5ba38",
    "fedbuff-sparse": "f3f545be72b8a2e2683308e751438c1f0726f1788510e86301322f1944d2d8ad",
}
"""SHA-256 of :func:`drive` per setting, written by the engine before ``server-device``
(every tensor then on the host): CPU runs must keep these bits. Adam's was rewritten
when its root became correctly rounded: it is the digest an H100 wrote before that
change (the GPU's float32 root was already exact; the CPU's was not). ``fedbuff-adam``
was added after the H100 runs: its CUDA test has not run yet."""


class _Digest:
    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def text(self, value: object) -> None:
        self._hash.update(repr(value).encode() + b"\0")

    def tensor(self, name: str, tensor: torch.Tensor) -> None:
        host = tensor.detach().to("cpu").contiguous()
        self.text((name, str(host.dtype), tuple(host.shape)))
        self._hash.update(host.reshape(-1).view(torch.uint8).numpy().tobytes())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _reply(plan: InFlight, masks: dict[str, torch.Tensor] | None) -> bytes:
    """A device's update for ``plan``: seeded by the task's seed, encoded for real."""
    generator = torch.Generator().manual_seed(plan.seed)
    delta = {name: torch.randn(shape, generator=generator) * 0.05 for name, shape in SHAPES.items()}
    codec = UpdateCodec(plan.uplink_spec, seed=plan.seed, specs=SPECS, masks=masks)
    return codec.encode(delta)


def drive(engine: AggregationEngine, *, tasks: int = 24) -> str:
    """Run a fixed schedule of tasks through ``engine``; the digest of all it produced.

    Four devices, two tasks in flight per device at most: replies come back in an order
    that makes some stale, every fifth task is lost (its device gets a full payload
    next), and one reply is garbage (rejected, nothing changes).
    """
    digest = _Digest()
    masks: dict[str, torch.Tensor] | None = None
    in_flight: list[InFlight] = []
    for number in range(1, tasks + 1):
        plan = engine.plan_task(node_id=number % 4, number=number)
        digest.text((plan.task_id, plan.version, plan.uplink_spec, plan.downlink.kind))
        digest.text(plan.downlink.payload)
        digest.text(plan.mask)
        if plan.mask:
            masks = decode_masks(plan.mask, SPECS).masks
        in_flight.append(plan)
        if number % 5 == 0:
            engine.forget(in_flight.pop(0))
        # Replies: the newest first every third task, else the oldest (staleness).
        while len(in_flight) >= 3 or (number == tasks and in_flight):
            done = in_flight.pop(-1 if number % 3 == 0 else 0)
            payload = b"not a frame" if number == 7 else _reply(done, masks)
            staleness = engine.arrived(done, len(payload))
            verdict = engine.receive(done, payload, num_examples=10 + done.number)
            digest.text((done.task_id, staleness, verdict.status, verdict.kind, verdict.updates))
            digest.text(float(verdict.weight_sum).hex())
    _add_model(digest, engine)
    digest.text(engine.tally.bytes_up)
    digest.text(engine.tally.bytes_down)
    return digest.hexdigest()


def model_digest(engine: AggregationEngine) -> str:
    """SHA-256 of the engine's version, model and server-optimizer state."""
    digest = _Digest()
    _add_model(digest, engine)
    return digest.hexdigest()


def _add_model(digest: _Digest, engine: AggregationEngine) -> None:
    digest.text(engine.version)
    for name, tensor in engine.state.items():
        digest.tensor(name, tensor)
    optimizer = engine.optimizer.state_dict()
    digest.text((optimizer["kind"], optimizer["steps"]))
    for slot, tensors in sorted(optimizer["buffers"].items()):
        for name, tensor in sorted(tensors.items()):
            digest.tensor(f"{slot}/{name}", tensor)


def build(name: str, **kwargs: Any) -> AggregationEngine:
    return AggregationEngine(RunConfig.of(**SETTINGS[name]), initial_state(), **kwargs)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_cpu_runs_keep_the_bits_of_the_host_only_engine(name: str) -> None:
    engine = build(name)
    digest = drive(engine)
    assert engine.version >= 3, "the schedule must step the model a few times"
    assert digest in (DIGESTS[name], *MATMUL_DIGESTS.get(name, ()))


@CUDA
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_cuda_runs_write_the_same_bits(name: str) -> None:
    engine = build(name, device="cuda")
    digest = drive(engine)
    assert misplaced(engine.placement(), "cuda") == {}
    if "powersgd" not in SETTINGS[name].get("uplink_codec", ""):
        assert digest == DIGESTS[name]
        return
    # PowerSGD's factors are multiplied back on the device: the CPU's model to rounding.
    cpu = build(name)
    drive(cpu)
    assert engine.version == cpu.version
    for key, want in cpu.state.items():
        got = engine.state[key].cpu()
        if not want.is_floating_point():
            assert torch.equal(got, want)
            continue
        error = float((got - want).norm() / want.norm())
        print(f"{key}: relative error {error:.2e}")
        assert error <= 1e-4, (key, error)


# --- the run config -------------------------------------------------------------------------
def test_server_device_defaults_to_cpu_and_auto_follows_the_gpu() -> None:
    assert RunConfig().asynchronous.server_device == "cpu"
    assert RunConfig().asynchronous.server_torch_device() == torch.device("cpu")
    auto = RunConfig.of(server_device="auto").asynchronous.server_torch_device()
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert build("fedbuff-dense").device == torch.device("cpu")


@pytest.mark.parametrize("value", ["gpu", "CUDA", "cuda:", "cuda:x", "mps", "meta", ""])
def test_an_unknown_server_device_names_the_key(value: str) -> None:
    with pytest.raises(SettingsError, match=r"'server-device' must be cpu, cuda, cuda:N or auto"):
        RunConfig.of(server_device=value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this server has a GPU")
@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_this_server_lacks_is_a_settings_error_naming_the_key(value: str) -> None:
    # Nodes read the same run config and need no GPU: it parses, the engine refuses.
    config = RunConfig.of(strategy="fedbuff", server_device=value)
    with pytest.raises(SettingsError, match=r"'server-device' asks for a GPU this server lacks"):
        AggregationEngine(config, initial_state())


# --- where the state lives ------------------------------------------------------------------
def busy_engine(name: str, **kwargs: Any) -> AggregationEngine:
    """An engine driven a while, then holding an update in its buffer (``K > 1``) and a
    task in flight."""
    engine = build(name, **kwargs)
    drive(engine)
    masks = engine.pruned.masks if engine.pruned is not None else None
    for number in range(100, 100 + engine.strategy.buffer_size):
        if len(engine.buffer) > 0 or engine.strategy.buffer_size == 1:
            break
        plan = engine.plan_task(node_id=1, number=number)
        engine.arrived(plan, 0)
        engine.receive(plan, _reply(plan, masks), num_examples=10)
    assert len(engine.buffer) > 0 or engine.strategy.buffer_size == 1
    engine.plan_task(node_id=2, number=200)
    return engine


# Per setting: paths the walker must find (every part of the state the setting uses).
PARTS = {
    "teasq-delta": ["state[", "buffer._sums[", "downlink._replicas[", "downlink._full["],
    "fedbuff-pruned-nesterov": ["state[", "buffer._sums[", "optimizer._velocity[", "pruned.masks["],
    # The task's start model is the downlink's pending replica (one dict, walked once).
    "fedasync-mix-adam-sign": ["state[", "optimizer._m[", "optimizer._v[", "downlink._pending["],
    "fedbuff-powersgd-momentum": ["buffer._lowrank[", "optimizer._velocity["],
    "fedbuff-sparse": ["buffer._sparse[", "buffer._sums["],
}


@pytest.mark.parametrize("name", sorted(PARTS))
def test_every_tensor_of_the_engine_is_on_the_server_device(name: str) -> None:
    engine = busy_engine(name)
    found = engine.placement()
    for part in PARTS[name]:
        assert any(path.startswith(part) for path in found), (part, sorted(found)[:8])
    assert "state['bn.num_batches_tracked']" in found  # the untrained tensors too
    if engine.strategy.needs_start_model:
        # A task's start model lives on its record (the downlink's pending replica), not
        # in a table of the engine's: on the server device too.
        flight = engine.plan_task(node_id=3, number=201)
        assert flight.downlink.start is not None
        assert engine.downlink.holds(3) is flight.downlink.start
        assert misplaced(tensor_devices(flight), "cpu") == {}
    assert misplaced(found, "cpu") == {}


@CUDA
@pytest.mark.parametrize("name", sorted(PARTS))
def test_every_tensor_of_a_cuda_engine_is_on_the_gpu(name: str) -> None:
    engine = busy_engine(name, device="cuda")
    found = engine.placement()
    for part in PARTS[name]:
        assert any(path.startswith(part) for path in found), part
    assert misplaced(found, "cuda") == {}


def test_the_walker_names_a_tensor_left_on_another_device_in_any_part() -> None:
    engine = busy_engine("fedbuff-pruned-nesterov")
    stray = torch.empty(2, device="meta")
    engine.state["stray"] = stray
    engine.buffer._sums["stray"] = stray.clone()
    engine.optimizer._velocity["stray"] = stray.clone()  # type: ignore[attr-defined]
    assert engine.pruned is not None
    engine.pruned.masks["stray"] = stray.clone()
    engine.downlink._replicas[7] = {"stray": stray.clone()}
    engine.tally.__dict__["stray"] = [None, (stray.clone(),)]  # nested in a plain object
    assert sorted(misplaced(engine.placement(), "cpu")) == sorted(
        [
            "state['stray']",
            "buffer._sums['stray']",
            "optimizer._velocity['stray']",
            "pruned.masks['stray']",
            "downlink._replicas[7]['stray']",
            "tally.stray[1][0]",
        ]
    )


def test_the_walker_lists_host_arrays_and_follows_cycles() -> None:
    import numpy as np

    cycle: dict[str, Any] = {"array": np.zeros(3), "meta": torch.empty(1, device="meta")}
    cycle["self"] = cycle
    found = tensor_devices(cycle, name="root")
    assert found == {"root['array']": torch.device("cpu"), "root['meta']": torch.device("meta")}
    assert misplaced(found, "meta") == {"root['array']": torch.device("cpu")}


# --- checkpoints: CPU tensors, resumed on any device ----------------------------------------
def saved_checkpoint(engine: AggregationEngine, folder: Any) -> Any:
    journal = RunJournal(engine, RunRecorder(folder, "run"), lambda version, state: {})
    path = CheckpointStore(folder / "checkpoints").save(journal.checkpoint())
    return load_checkpoint(path)


def resumed(engine: AggregationEngine, checkpoint: Any, device: str) -> AggregationEngine:
    return AggregationEngine(
        engine.config,
        checkpoint.global_state,
        device=device,
        version=checkpoint.version,
        optimizer_state=checkpoint.optimizer_state,
        pruning_state=checkpoint.pruning,
    )


def test_a_checkpoint_holds_cpu_copies_and_resumes_on_another_device(tmp_path: Any) -> None:
    engine = busy_engine("fedbuff-powersgd-momentum")
    checkpoint = saved_checkpoint(engine, tmp_path)
    for name, tensor in engine.state.items():
        assert checkpoint.global_state[name].device.type == "cpu"
        assert torch.equal(checkpoint.global_state[name], tensor)
    velocity = checkpoint.optimizer_state["buffers"]["velocity"]
    assert velocity and all(t.device.type == "cpu" for t in velocity.values())
    # Placed, not computed: on the meta device every tensor of the resumed state is moved.
    on_meta = resumed(engine, checkpoint, "meta")
    found = on_meta.placement()
    assert any(path.startswith("optimizer._velocity[") for path in found)
    assert misplaced(found, "meta") == {}
    # On the host it continues the saved engine's trajectory exactly (the downlinks
    # differ: a resumed server holds no replicas, so every device gets a full model).
    again = resumed(engine, checkpoint, "cpu")
    engine.discard_buffer()
    assert model_digest(again) == model_digest(engine)
    drive(again, tasks=9)
    drive(engine, tasks=9)
    assert again.version == engine.version > checkpoint.version
    assert model_digest(again) == model_digest(engine)


@CUDA
@pytest.mark.parametrize("name", ["fedbuff-pruned-nesterov", "fedasync-mix-adam-sign"])
def test_a_checkpoint_written_on_cuda_resumes_on_cpu(name: str, tmp_path: Any) -> None:
    engine = busy_engine(name, device="cuda")
    checkpoint = saved_checkpoint(engine, tmp_path)
    assert all(t.device.type == "cpu" for t in checkpoint.global_state.values())
    host = resumed(engine, checkpoint, "cpu")
    assert misplaced(host.placement(), "cpu") == {}
    for name_, tensor in engine.state.items():
        assert torch.equal(host.state[name_], tensor.cpu())
    drive(host, tasks=6)
    assert host.version > checkpoint.version
