"""Where a CUDA device's float bits leave the CPU's: an op survey and an engine trace.

Run on a CUDA machine::

    python -m benchmarks.gpu_rounding [SETTING ...]

``op survey``
    the same float32 inputs through elementwise ops and reductions the server and the
    codecs use, on the CPU and on the GPU: how many results differ in any bit. An H100
    (``benchmarks/results/gpu-h100/rounding_survey.txt``) differed in ``sqrt`` (torch's
    CPU float32 root is the inexact one), division by a host scalar (CUDA multiplies by the
    reciprocal), ``addcmul`` with a value (a fused multiply-add) and reductions.
``engine trace``
    for each named setting of ``tests/unit/test_server_device.py`` (default: those with
    Adam or PowerSGD), the first server-optimizer step whose inputs or outputs differ
    between a CPU and a CUDA engine, with the largest difference.

Needs a CUDA device, and pytest and the repository root (the engine trace reuses the test's
schedule); a diagnostic, not a check (``gpu_check``'s tests are the check). The committed
survey was written by its first version, with the same ops and another print format.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from fedsync.aggregation import server_optimizer as so

Ops = dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]]

OPS: Ops = {
    "add alpha": lambda a, b, c: a.clone().add_(b, alpha=0.1),
    "mul scalar": lambda a, b, c: a * 0.9,
    "mul_ then add alpha": lambda a, b, c: a.clone().mul_(0.9).add_(b, alpha=0.1),
    "addcmul value": lambda a, b, c: a.clone().addcmul_(b, b, value=0.001),
    "addcmul sign": lambda a, b, c: (
        c.clone().mul_(0.99).addcmul_(torch.sign(b), torch.sign(b), value=0.01)
    ),
    "mul+add": lambda a, b, c: a.clone().mul_(0.999).add_((b * b).mul_(0.001)),
    "div tensor": lambda a, b, c: a / c,
    "div python scalar": lambda a, b, c: a / 3.7,
    "div 0-dim cpu tensor": lambda a, b, c: a / torch.tensor(3.7),
    "sqrt": lambda a, b, c: c.sqrt(),
    "sqrt + tau": lambda a, b, c: c.sqrt() + 1e-3,
    "adam direction": lambda a, b, c: a / (c.sqrt() + 1e-3),
    "mul bias corr": lambda a, b, c: a * 0.123456789,
    "lerp": lambda a, b, c: torch.lerp(a, b, 0.3),
    "index_add alpha": lambda a, b, c: a.clone().index_add_(
        0, torch.arange(0, a.numel(), 3, device=a.device), b[::3].contiguous(), alpha=0.37
    ),
    "where div": lambda a, b, c: torch.where(c > 0.7, a / c.clamp_min(1e-30), 0.0),
    "sign": lambda a, b, c: torch.sign(a),
    "sum": lambda a, b, c: a.sum().reshape(1),
    "norm": lambda a, b, c: a.norm().reshape(1),
}


def op_survey(n: int = 100_003) -> dict[str, int]:
    """Per op, how many of its float32 results differ in any bit between CPU and CUDA."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    c = torch.rand(n, generator=g) + 0.5
    out = {}
    for name, fn in OPS.items():
        x = fn(a, b, c)
        y = fn(a.cuda(), b.cuda(), c.cuda()).cpu()
        out[name] = int((x.view(torch.int32) != y.view(torch.int32)).sum())
    return out


def _trace(device: str, name: str) -> list[tuple[Any, ...]]:
    # The settings and schedule of the test that found the difference (not type-checked).
    t: Any = importlib.import_module("tests.unit.test_server_device")

    records: list[tuple[Any, ...]] = []
    step, direction = so.ServerOptimizer.step, so.ServerAdam._direction

    def host(tensors: Any) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in tensors.items()}

    def traced_step(self: Any, params: Any, update: Any) -> None:
        before, delta = host(params), host(update)
        step(self, params, update)
        records.append(("step", before, delta, host(params)))

    def traced_direction(self: Any, key: str, delta: torch.Tensor) -> torch.Tensor:
        out = direction(self, key, delta)
        records.append(
            ("direction", key, delta.cpu(), self._m[key].cpu(), self._v[key].cpu(), out.cpu())
        )
        return out

    setattr(so.ServerOptimizer, "step", traced_step)  # noqa: B010 - a traced copy
    setattr(so.ServerAdam, "_direction", traced_direction)  # noqa: B010
    try:
        t.drive(t.build(name, device=device))
    finally:
        setattr(so.ServerOptimizer, "step", step)  # noqa: B010
        setattr(so.ServerAdam, "_direction", direction)  # noqa: B010
    return records


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        torch.equal(a.view(torch.int32), b.view(torch.int32))
        if a.dtype == torch.float32
        else torch.equal(a, b)
    )


def engine_trace(name: str) -> str:
    """The first server-optimizer record where a CUDA engine's bits leave the CPU's."""
    cpu, gpu = _trace("cpu", name), _trace("cuda", name)
    for i, (a, b) in enumerate(zip(cpu, gpu, strict=True)):
        if a[0] == "step":
            inputs = all(_same(a[1][k], b[1][k]) and _same(a[2][k], b[2][k]) for k in a[1])
            if inputs and all(_same(a[3][k], b[3][k]) for k in a[3]):
                continue
            worst = max(a[2], key=lambda k: float((a[2][k] - b[2][k]).abs().max()))
            diff = float((a[2][worst] - b[2][worst]).abs().max())
            return (
                f"{name}: record {i}: step inputs equal {inputs}; "
                f"update {worst} differs by up to {diff:.3g}"
            )
        labels = ("delta", "m", "v", "direction")
        equal = [_same(x, y) for x, y in zip(a[2:], b[2:], strict=True)]
        if not all(equal):
            first = labels[equal.index(False)]
            flags = dict(zip(labels, equal, strict=True))
            return f"{name}: record {i} ({a[1]}): first differing: {first}; equal {flags}"
    return f"{name}: {len(cpu)} records, all equal"


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "settings", nargs="*", default=["fedasync-mix-adam-sign", "fedbuff-powersgd-momentum"]
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()} torch {torch.__version__}")
    for name, count in op_survey().items():
        print(f"op {name:24s} differs in {count} of 100003 values")
    for name in args.settings:
        print(engine_trace(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
