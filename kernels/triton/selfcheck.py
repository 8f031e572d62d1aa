"""Check the compiled Triton kernels on a real device against the CPU path.

Run on a machine with a GPU (``python -m fedsync.kernels.triton.selfcheck``); the unit tests
check the same contracts with the interpreter, this checks what the compiler made
of them: FMA contraction, approximate division, reduction order, atomics. Exit
status 0 when every comparison is bit-identical, 1 otherwise (each mismatch is
printed). ``tests/unit/test_triton_gpu.py`` runs it in a subprocess.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

__all__ = ["main", "run_checks"]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def run_checks(device: str = "cuda", n: int = 1_000_003, seed: int = 0) -> list[str]:
    """Run every comparison on ``device``; return the names of those that differ."""
    from fedsync.kernels import bitpack
    from fedsync.kernels import index_coding as cpu_index
    from fedsync.kernels import ordered_sums as ordered
    from fedsync.kernels import quantize as cpu_q
    from fedsync.kernels import select as cpu_s
    from fedsync.kernels.triton import pack, quantize, reduce, scatter, select

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp(rng.standard_normal(n))).astype(np.float32)
    x[: n // 50] = rng.choice(np.array([0.0, -0.0], dtype=np.float32), n // 50)
    xd = torch.from_numpy(x).to(device)
    host = lambda t: t.detach().cpu().numpy()  # noqa: E731
    failures: list[str] = []

    def check(name: str, fn: Callable[[], bool]) -> None:
        ok = bool(fn())
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
        if not ok:
            failures.append(name)

    for t, limit in ((2.5, None), (3.0, n // 100), (4.0, n // 1000), (2.0, 10)):

        def sel(t: float = t, limit: int | None = limit) -> bool:
            got = select.threshold_select(xd, t, limit)
            ref = cpu_s.threshold_select(x, t, limit)
            if got.count != ref.count:
                return False
            if ref.indices is None:
                return got.indices is None
            assert got.indices is not None and got.values is not None
            assert ref.values is not None
            return _same(host(got.indices), ref.indices) and _same(host(got.values), ref.values)

        check(f"threshold_select t={t} limit={limit}", sel)

    def topk_ok(k: int) -> bool:
        return _same(host(select.exact_topk(xd, k)), cpu_s.exact_topk(x, k))

    for k in (10, n // 1000, n // 100, n // 5):
        check(f"exact_topk k={k}", partial(topk_ok, k))
    check(
        "threshold sample (cache lines)",
        lambda: _same(
            host(select.sample_positions(xd, 10_000, 99)[0]),
            cpu_s.sample_positions(n, 10_000, 99),
        ),
    )
    # Seed 1 too: the compiler turns an integer argument equal to 1 into a constant
    # unless the kernel says not to (``do_not_specialize``); the interpreter never does.
    for seed in (99, 1):
        check(
            f"stratified sample seed={seed}",
            partial(
                lambda seed: _same(
                    host(select.stratified_positions(xd, 10_000, seed)[0]),
                    cpu_s.stratified_positions(n, 10_000, seed),
                ),
                seed,
            ),
        )
    check("abs_moments", lambda: reduce.abs_moments(xd) == ordered.ordered_abs_moments(x))
    kept = x[np.abs(x) > 2.0]
    kd = torch.from_numpy(kept).to(device)
    for bits, chunk in ((8, 1024), (4, 1024), (2, 100), (1, 64)):

        def uni(bits: int = bits, chunk: int = chunk) -> bool:
            got = quantize.uniform_quantize(kd, bits, chunk)
            ref = cpu_q.uniform_quantize(kept, bits, chunk)
            back = quantize.uniform_dequantize(*got, chunk)
            return all(_same(host(g), r) for g, r in zip(got, ref, strict=True)) and _same(
                host(back), cpu_q.uniform_dequantize(*ref, chunk)
            )

        check(f"uniform bits={bits} chunk={chunk}", uni)
    for levels, seed in ((7, 123456789), (127, 1), (1000, 123456789)):

        def qsgd(levels: int = levels, seed: int = seed) -> bool:
            codes, norms = quantize.qsgd_quantize(kd, levels, 512, seed)
            ref_codes, ref_norms = cpu_q.qsgd_quantize(kept, levels, 512, seed)
            got = host(codes)
            got = got.view(np.uint16) if got.dtype == np.int16 else got
            return _same(got, ref_codes) and _same(host(norms), ref_norms)

        check(f"qsgd levels={levels} seed={seed}", qsgd)
    for seed in (5, 1):
        check(
            f"ternary seed={seed}",
            partial(
                lambda seed: all(
                    _same(np.asarray(host(a) if isinstance(a, torch.Tensor) else a), np.asarray(b))
                    for a, b in zip(
                        quantize.ternary_quantize(kd, seed),
                        cpu_q.ternary_quantize(kept, seed),
                        strict=True,
                    )
                ),
                seed,
            ),
        )
    check(
        "sign",
        lambda: all(
            _same(np.asarray(host(a) if isinstance(a, torch.Tensor) else a), np.asarray(b))
            for a, b in zip(quantize.sign_quantize(kd), cpu_q.sign_quantize(kept), strict=True)
        ),
    )
    codes = rng.integers(0, 1 << 13, 100_001).astype(np.uint16)

    def pack_ok(width: int) -> bool:
        c = codes & ((1 << width) - 1)
        packed = pack.pack_bits(torch.from_numpy(c.astype(np.int64)).to(device), width)
        return _same(host(packed), bitpack.pack_bits(c, width))

    for width in (1, 4, 8, 13):
        check(f"pack width={width}", partial(pack_ok, width))
    idx = np.flatnonzero(np.abs(x) > 2.5).astype(np.int64)
    idd = torch.from_numpy(idx).to(device)
    m = idx.shape[0]
    bitmap = np.zeros((n + 7) // 8, dtype=np.uint8)
    cpu_index.bitmap_encode(idx, bitmap)
    check("bitmap", lambda: _same(host(pack.bitmap_encode(idd, n)), bitmap))
    low = bitpack.pack_bits((idx & 63).astype(np.uint64), 6)
    high = np.zeros((m + ((n - 1) >> 6) + 7) // 8, dtype=np.uint8)
    cpu_index.ef_encode_high(idx, 6, high)
    check(
        "elias_fano",
        lambda: _same(host(pack.elias_fano_encode(idd, n, 6)), np.concatenate([low, high])),
    )
    rice = np.zeros((m * 7 + int(cpu_index.rice_shift_sum(idx, 6)) + 7) // 8, dtype=np.uint8)
    cpu_index.rice_encode(idx, 6, rice)
    check("rice", lambda: _same(host(pack.rice_encode(idd, 6)), rice))

    def scatter_check() -> bool:
        acc = torch.zeros(n, device=device)
        ref = torch.zeros(n)
        for u in range(20):
            k = int(rng.integers(1, n // 10))
            pos = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
            vals = rng.standard_normal(k).astype(np.float32)
            w = float(rng.random())
            scatter.scatter_add_(
                acc, torch.from_numpy(pos).to(device), torch.from_numpy(vals).to(device), w
            )
            ref.index_add_(0, torch.from_numpy(pos), torch.from_numpy(vals), alpha=w)
            del u
        return torch.equal(acc.cpu(), ref)

    check("scatter_add (20 updates)", scatter_check)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=1_000_003)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    failures = run_checks(args.device, args.n)
    print(f"{len(failures)} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
