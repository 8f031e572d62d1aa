"""Plug points by import path: the user's own model or dataset, named in the run config.

Besides fedsync's bundled names, the run-config keys ``model`` and ``dataset`` take the
import path of a callable, ``"package.module:name"`` (the colon tells the two apart: no
bundled name has one)::

    model = "mypkg.nets:make_net"        # make_net(input_shape, num_classes) -> nn.Module
    dataset = "mypkg.data:load_splits"   # load_splits(*, seed, data_dir) -> DatasetSplits

The path is resolved by *import*, in every process that needs the object: the
ServerApp, each ClientApp (a Ray worker of the simulation, a SuperNode of a deployment)
and the command line tools each import the module themselves, so nothing is registered
and only the string travels with the run config. The module must therefore be importable
wherever the app runs (installed, or on ``PYTHONPATH``).

Every failure is a :class:`PluginError`, a :class:`ValueError` like
:class:`fedsync.config.SettingsError`, with a subclass per cause.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "SEPARATOR",
    "PluginAttributeError",
    "PluginError",
    "PluginImportError",
    "PluginNotCallableError",
    "PluginPathError",
    "PluginSignatureError",
    "check_signature",
    "import_submodules",
    "is_import_path",
    "load_callable",
    "load_object",
]

SEPARATOR = ":"
"""Between the module and the object it holds: ``package.module:name``."""


class PluginError(ValueError):
    """An import path in the run config that does not give a usable object."""


class PluginPathError(PluginError):
    """Not of the form ``package.module:name``."""


class PluginImportError(PluginError):
    """The module cannot be imported (not installed, not on the path, or failing)."""


class PluginAttributeError(PluginError):
    """The module imports but holds no such name."""


class PluginNotCallableError(PluginError):
    """The name exists but is not a function or class."""


class PluginSignatureError(PluginError):
    """The callable cannot be called the way fedsync calls it."""


def is_import_path(name: str) -> bool:
    """Whether a ``model`` or ``dataset`` value is an import path rather than a bundled
    name (it has a ``:``; no bundled name does)."""
    return SEPARATOR in name


def _dotted(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def load_object(path: str, what: str) -> Callable[..., Any]:
    """Import ``package.module:name`` and return the callable it names.

    ``name`` may be dotted (``module:Class.factory``). The module is imported in the
    calling process (Python caches it, so a second call is a dictionary look-up).

    Parameters
    ----------
    path : str
        The import path; surrounding spaces are ignored.
    what : str
        What the object is for (``"model"``, ``"dataset"``), to start error messages.

    Returns
    -------
    callable
        The object, checked to be callable.

    Raises
    ------
    PluginPathError
        ``path`` is not ``package.module:name``.
    PluginImportError
        The module cannot be imported; the message names it and the error it raised.
    PluginAttributeError
        The module has no such name (the message suggests close ones).
    PluginNotCallableError
        The name is not callable.
    """
    text = path.strip()
    module_name, sep, attribute = text.partition(SEPARATOR)
    if not sep or not _dotted(module_name) or not _dotted(attribute):
        raise PluginPathError(
            f"{what} {path!r} is not an import path: expected 'package.module:name' "
            "(dotted Python names, one ':')"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        # Anything the module raises while importing is reported the same way: a missing
        # package, a syntax error, a failing top-level statement.
        raise PluginImportError(
            f"{what} {path!r}: cannot import module {module_name!r} "
            f"({type(err).__name__}: {err}); it must be importable (installed, or on "
            "PYTHONPATH) in every process that runs the app"
        ) from err
    target: Any = module
    found: list[str] = []
    for part in attribute.split("."):
        if not hasattr(target, part):
            owner = f"{module_name}:{'.'.join(found)}" if found else module_name
            names = [name for name in dir(target) if not name.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginAttributeError(
                f"{what} {path!r}: {owner!r} has no attribute {part!r}{hint}"
            )
        target = getattr(target, part)
        found.append(part)
    if not callable(target):
        raise PluginNotCallableError(
            f"{what} {path!r} is a {type(target).__name__}, not a function or class"
        )
    function: Callable[..., Any] = target
    return function


def check_signature(
    function: Callable[..., Any], path: str, what: str, call: str, *args: Any, **kwargs: Any
) -> None:
    """Check that ``function(*args, **kwargs)`` matches its signature, without calling it.

    Parameters
    ----------
    function : callable
        What :func:`load_object` returned.
    path, what : str
        As given to :func:`load_object`, for the message.
    call : str
        How fedsync calls it, in words (``"factory(input_shape, num_classes)"``).
    *args, **kwargs
        Sample arguments of that call.

    Raises
    ------
    PluginSignatureError
        The arguments do not bind. A callable whose signature Python cannot read
        (some built-ins) passes.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        raise PluginSignatureError(
            f"{what} {path!r} cannot be called as {call}: {err} (its signature: {signature})"
        ) from err


def load_callable(path: str, what: str, call: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """:func:`load_object`, then :func:`check_signature` with the sample arguments.

    The signature of a given object is read once per process (a ClientApp asks for its
    model and data every task); the import itself is a ``sys.modules`` lookup after the
    first, and a module imported afresh gives a new object, checked again.

    Raises
    ------
    PluginError
        As those two do.
    """
    loaded = load_object(path, what)
    _check_once(loaded, path, what, call, args, tuple(sorted(kwargs.items())))
    return loaded


@functools.lru_cache(maxsize=64)
def _check_once(
    function: Callable[..., Any],
    path: str,
    what: str,
    call: str,
    args: tuple[Any, ...],
    kwargs: tuple[tuple[str, Any], ...],
) -> None:
    check_signature(function, path, what, call, *args, **dict(kwargs))


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of a package's folder (its ``__path__``), so that a new file
    there registers what it defines (a strategy by subclassing, a codec stage by
    ``@register()``) without a line elsewhere."""
    for module in pkgutil.iter_modules(list(path)):
        importlib.import_module(f"{package}.{module.name}")
