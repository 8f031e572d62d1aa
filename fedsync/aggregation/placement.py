"""Where a server's state lives: every tensor an object holds, by path, with its device.

The engine keeps its whole state on one device (``server-device``); a tensor left on
another one is a silent copy across the bus at every step, or a second copy of the
model. :func:`tensor_devices` makes that checkable: it walks an object's attributes,
mappings, sequences and sets (each object once, never into functions, methods or
modules) and
lists every tensor it reaches by the path it took (``buffer._sums['w']``), with its
device. A NumPy array counts as host memory (``cpu``). :func:`misplaced` keeps the
entries that are not on the expected device.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Mapping

import numpy as np
import torch

__all__ = ["canonical_device", "misplaced", "tensor_devices"]

_LEAVES = (str, bytes, bytearray, memoryview, int, float, complex, bool, type(None), enum.Enum)
_OPAQUE = (
    types.ModuleType,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    type,
    torch.device,
    torch.dtype,
    torch.Generator,
)


def canonical_device(device: str | torch.device) -> torch.device:
    """``device`` with the index a tensor placed there reports (``cuda`` -> ``cuda:0``,
    the current CUDA device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def tensor_devices(
    root: object, *, name: str = "", skip: Callable[[object], bool] | None = None
) -> dict[str, torch.device]:
    """The device of every tensor reachable from ``root``, by path.

    Parameters
    ----------
    root : object
        Where to start (an engine, a mapping of its parts, ...).
    name : str
        The path prefix of ``root``.
    skip : callable, optional
        Objects it returns true for are not entered (their tensors are not listed).

    Returns
    -------
    dict of str to torch.device
        Path -> device; a tensor reached by two paths is listed under both (every other
        object is entered once).
    """
    found: dict[str, torch.device] = {}
    seen: set[int] = set()
    stack: list[tuple[str, object]] = [(name, root)]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            found[path] = obj.device
            continue
        if isinstance(obj, np.ndarray):
            found[path] = torch.device("cpu")
            continue
        if isinstance(obj, _LEAVES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _OPAQUE) or (skip is not None and skip(obj)):
            continue
        children: list[tuple[str, object]]
        if isinstance(obj, Mapping):
            children = [(f"{path}[{key!r}]", value) for key, value in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
            children = [(f"{path}[{i}]", value) for i, value in enumerate(items)]
        else:
            attributes = dict(getattr(obj, "__dict__", {}))
            for slot in _slots(type(obj)):
                if hasattr(obj, slot):
                    attributes[slot] = getattr(obj, slot)
            children = [(f"{path}.{key}" if path else key, v) for key, v in attributes.items()]
        stack.extend(reversed(children))
    return found


def misplaced(
    found: Mapping[str, torch.device], device: str | torch.device
) -> dict[str, torch.device]:
    """The entries of :func:`tensor_devices` output that are not on ``device``."""
    expected = canonical_device(device)
    return {path: where for path, where in found.items() if canonical_device(where) != expected}


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [slot for slot in names if slot not in ("__dict__", "__weakref__")]
