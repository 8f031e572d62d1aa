"""The DDP communication hook and the DeMo optimizer on real processes.

Two gloo ranks over loopback (``torch.multiprocessing`` spawn), fedsync's LeNet-5 CNN
on real Fashion-MNIST (each rank its own 32-image batches from its own slice of the
training set), a bounded number of steps. Each spawn runs several scenarios in a row
to pay the process start-up once.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from fedsync.ddp import DeMo, FedsyncHookState, FrameExchangeError, fedsync_hook
from fedsync.wire import decode_frame, encode_frame

pytestmark = pytest.mark.integration

WORLD = 2
BATCH = 32
STEPS = 120
LR = 0.02
BUCKET_MB = 0.05  # ~13k floats: LeNet-5's 62k parameters fill several buckets
SPEC = "topk:0.05+uniform:4+ef"
LOSS_MARGIN = 0.10
"""SPEC must end within 10 % of dense DDP's test loss after STEPS (measured: 1.025 vs
1.000, +2.5 %; top-k 1 % lags more at this horizon: 1.31, +31 %)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _data(data_dir: str, rank: int) -> tuple[torch.Tensor, ...]:
    from fedsync.data import load_dataset

    splits = load_dataset("fashion-mnist", data_dir)
    n = STEPS * BATCH
    x = torch.from_numpy(np.asarray(splits.train.x[rank * n : (rank + 1) * n]).copy())
    y = torch.from_numpy(np.asarray(splits.train.y[rank * n : (rank + 1) * n]).copy())
    tx = torch.from_numpy(np.asarray(splits.test.x[:1000]).copy())
    ty = torch.from_numpy(np.asarray(splits.test.y[:1000]).copy())
    return x, y, tx, ty


def _model() -> torch.nn.Module:
    from fedsync.models import build_model

    return build_model("cnn", 10, (1, 28, 28), seed=0)


def _test_loss(model: torch.nn.Module, tx: torch.Tensor, ty: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(tx), ty))


def _train(
    data: tuple[torch.Tensor, ...], spec: str | None, steps: int | None = None, **fault: Any
) -> tuple[torch.nn.Module, FedsyncHookState | None, list[dict[str, Any]]]:
    x, y, _, _ = data
    steps = STEPS if steps is None else steps
    model = DDP(_model(), bucket_cap_mb=BUCKET_MB)
    state = None
    if spec is not None:
        state = FedsyncHookState(spec=spec, seed=5, outgoing=fault.get("outgoing"))
        model.register_comm_hook(state, fedsync_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    log: list[dict[str, Any]] = []
    for step in range(steps):
        xb, yb = x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
        if fault.get("nan_at") == step and dist.get_rank() == 1:
            xb = xb.clone()
            xb[0, 0, 0, 0] = float("nan")
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        if state is not None:
            stats = state.compression_stats()
            log.append(
                {
                    "sent": list(stats.bucket_payload_bytes),
                    "payload": stats.payload_bytes,
                    "received": [list(e.received_lengths) for e in state.last_step_exchanges()],
                }
            )
    return model.module, state, log


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _worker(rank: int, port: int, scenario: str, data_dir: str, out: str) -> None:
    import numba

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    numba.set_num_threads(1)  # two ranks share the CI box; numba's pool would spin on both
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    result: dict[str, Any] = {}
    try:
        data = _data(data_dir, rank)
        if scenario == "train":
            _scenario_train(data, result)
        else:
            _scenario_faults(data, result)
    except Exception:
        result["crash"] = traceback.format_exc()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        # A step that failed inside the hook leaves DDP reducers (holding the Python hook
        # state) and gloo work in reference cycles; collected at interpreter shutdown, a
        # gloo thread that needs the GIL then aborts the process (seen once on CI as
        # "terminate called without an active exception", SIGABRT). Collect them now.
        gc.collect()
        dist.destroy_process_group()
    # The result is on disk and the group is down: leave without interpreter teardown.
    os._exit(0)


def _scenario_train(data: tuple[torch.Tensor, ...], result: dict[str, Any]) -> None:
    _, _, tx, ty = data
    # 1. none+fp32 through the hook vs DDP's built-in all-reduce, step for step.
    dense, _, _ = _train(data, None, steps=8)
    hooked, _, _ = _train(data, "none+fp32", steps=8)
    result["identical"] = bool(torch.equal(_flat(dense), _flat(hooked)))
    result["max_diff"] = float((_flat(dense) - _flat(hooked)).abs().max())
    # 2. loss after STEPS: dense DDP vs the compressed hook; bytes as exchanged.
    dense, _, _ = _train(data, None)
    result["dense_loss"] = _test_loss(dense, tx, ty)
    sparse, state, log = _train(data, SPEC)
    assert state is not None
    result["topk_loss"] = _test_loss(sparse, tx, ty)
    result["log"] = log
    result["stats"] = state.compression_stats().as_dict()
    result["params"] = _flat(sparse).tolist()[:2000]
    # 3. DeMo optimizer (no DDP): replicas stay equal, loss falls.
    model = _model()
    x, y, _, _ = data
    with torch.no_grad():  # start rank 1 elsewhere: DeMo's broadcast must align it
        for p in model.parameters():
            p.add_(float(dist.get_rank()))
    opt = DeMo(model.parameters(), lr=0.002, beta=0.9, k=8, chunk=64)
    result["demo_initial_loss"] = _test_loss(model, tx, ty) if dist.get_rank() == 0 else None
    for step in range(STEPS):
        opt.zero_grad()
        xb, yb = x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    result["demo_loss"] = _test_loss(model, tx, ty)
    result["demo_params"] = _flat(model).tolist()[:2000]
    result["demo_stats"] = opt.compression_stats().as_dict()
    result["demo_spec"] = opt.spec


def _flip(payload: bytes) -> bytes:
    out = bytearray(payload)
    out[len(out) // 2] ^= 0x10
    return bytes(out)


def _nan_frame(payload: bytes) -> bytes:
    codec, tensors = decode_frame(payload)
    codes = tensors[0].values.codes.copy()
    codes[3] = np.float32(np.nan).view(np.uint32)
    tensors[0].values.codes = codes
    return encode_frame(codec, tensors)  # a well-formed frame (right CRC) holding a NaN


def _scenario_faults(data: tuple[torch.Tensor, ...], result: dict[str, Any]) -> None:
    rank = dist.get_rank()
    cases: dict[str, dict[str, Any]] = {
        "corrupt": {"outgoing": _flip if rank == 1 else None},
        "nan_frame": {"outgoing": _nan_frame if rank == 1 else None},
        "nan_grad": {"nan_at": 2},
    }
    for name, fault in cases.items():
        try:
            _train(data, "none+fp32", steps=4, **fault)
        except Exception as exc:  # DDP re-raises the hook's error from backward()
            result[name] = f"{type(exc).__name__}: {exc}"
        else:
            result[name] = None


def _spawn(scenario: str, data_dir: Path, tmp_path: Path) -> list[dict[str, Any]]:
    mp.spawn(_worker, args=(_free_port(), scenario, str(data_dir), str(tmp_path)), nprocs=WORLD)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, res in enumerate(results):
        assert "crash" not in res, f"rank {r}:\n{res['crash']}"
    return results


@pytest.mark.timeout(300)
def test_hook_and_demo_train_on_fashion_mnist(shared_data_dir: Path, tmp_path: Path) -> None:
    results = _spawn("train", shared_data_dir, tmp_path)
    for res in results:
        # Two ranks: DDP scales each gradient by 1/2 and sums; the hook sums the two
        # decoded fp32 frames and divides by 2. Halving is exact and a two-term sum is
        # commutative, so the parameters are bit for bit the same.
        assert res["identical"], res["max_diff"]
    r0, r1 = results
    assert r0["params"] == r1["params"]  # the replicas agree exactly
    assert r0["topk_loss"] <= r0["dense_loss"] * (1 + LOSS_MARGIN), (
        r0["topk_loss"],
        r0["dense_loss"],
    )
    # Exact bytes: what each rank reports sending is what every rank received from it.
    for step in range(STEPS):
        for sender, res in enumerate(results):
            sent = res["log"][step]["sent"]
            assert sum(sent) == res["log"][step]["payload"]
            for receiver in results:
                got = [lengths[sender] for lengths in receiver["log"][step]["received"]]
                assert got == sent
    assert r0["stats"]["buckets"] > 1 and r0["stats"]["compression_ratio"] > 20
    # DeMo: equal replicas (rank 1 started elsewhere), the loss fell, real bytes.
    assert r0["demo_params"] == r1["demo_params"]
    assert r0["demo_loss"] < 0.75 * r0["demo_initial_loss"], (
        r0["demo_loss"],
        r0["demo_initial_loss"],
    )
    assert r0["demo_spec"] == "dct:8+fp32+demo:0.9"
    assert 0 < r0["demo_stats"]["payload_bytes"] < r0["demo_stats"]["dense_bytes"] / 4


@pytest.mark.timeout(300)
def test_bad_frames_fail_every_rank_naming_rank_and_bucket(
    shared_data_dir: Path, tmp_path: Path
) -> None:
    results = _spawn("faults", shared_data_dir, tmp_path)
    for case, why in (
        ("corrupt", "ChecksumMismatch"),
        ("nan_frame", "NonFiniteUpdate"),
        ("nan_grad", "could not encode"),
    ):
        for res in results:
            message = res[case]
            assert message is not None, f"{case}: a rank went on silently"
            assert "rank 1" in message and "bucket" in message and why in message, message
    assert FrameExchangeError.__name__  # the type the hook raises (DDP re-raises its text)
