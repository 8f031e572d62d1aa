"""Whether Triton can run here, and how every kernel in this package is launched.

Kept apart from the kernels so that importing :mod:`fedsync.kernels.triton` never needs
Triton: the kernel modules import ``triton`` at the top and are only imported when
:data:`HAVE_TRITON` is true.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

__all__ = [
    "HAVE_TRITON",
    "TRITON_ERROR",
    "interpreting",
    "kernels_interpreted",
    "launch_options",
    "runs_on",
]


def _probe() -> tuple[bool, str | None]:
    """Whether Triton is installed, without importing it.

    Importing Triton decorates its standard library (``tl.sum``, ``tl.cumsum``) for
    the interpreter or the compiler once and for all, by ``TRITON_INTERPRET`` at that
    moment; so this package defers the import to the first kernel use, and a test
    that sets the variable before it gets interpreted kernels throughout.
    """
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if spec is None:
        return False, "ModuleNotFoundError: No module named 'triton'"
    return True, None


HAVE_TRITON, TRITON_ERROR = _probe()


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET=1``: kernels run in numpy on CPU tensors (tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def runs_on(x: torch.Tensor | torch.device) -> bool:
    """Whether the Triton kernels can serve a tensor on this device.

    CUDA tensors with Triton installed; CPU tensors only under the interpreter.
    """
    if not HAVE_TRITON:
        return False
    device = x if isinstance(x, torch.device) else x.device
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreting()


def launch_options() -> dict[str, Any]:
    """Compile options every launch passes.

    ``enable_fp_fusion=False``: Triton contracts ``a * b + c`` into one FMA by
    default, which rounds once where the CPU rounds twice; every kernel here that
    multiplies and then adds must round like the CPU, so none may fuse. (The
    interpreter ignores compile options and rounds each op, like the CPU.)
    """
    return {"enable_fp_fusion": False}


def kernels_interpreted() -> bool:
    """Whether this process's kernels were built for the interpreter.

    ``triton.jit`` reads ``TRITON_INTERPRET`` when a function is decorated, so what
    counts is the variable's value when Triton (whose ``tl.sum`` is a jit function)
    and :mod:`fedsync.kernels.triton.select` were first imported; tests set it before that.
    """
    if not HAVE_TRITON:
        return False
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    from fedsync.kernels.triton import select

    # Both ours and Triton's own library functions (tl.sum is a jit function too).
    return isinstance(select._select_regions, InterpretedFunction) and isinstance(
        tl.standard.sum, InterpretedFunction
    )
