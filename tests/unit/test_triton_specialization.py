"""Kernels keep an integer argument a tensor when they call its methods.

Compiled for a GPU, Triton turns an integer argument that equals 1 into a constant (a
plain Python int) unless the kernel names it in ``do_not_specialize``; ``seed.to(...)``
then fails to compile for ``seed == 1``. The interpreter the other tests run never
specializes, so this reads the kernels' source instead: every scalar argument whose
methods a kernel calls must be named there. (A GPU run found it: the stratified
sample failed to compile with seed 1.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNELS = sorted((Path(__file__).resolve().parents[2] / "kernels" / "triton").glob("*.py"))


def _jit(decorator: ast.expr) -> ast.expr | None:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return decorator if isinstance(target, ast.Attribute) and target.attr == "jit" else None


def _kernels(path: Path) -> list[tuple[ast.FunctionDef, set[str]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if _jit(decorator) is None:
                continue
            named: set[str] = set()
            if isinstance(decorator, ast.Call):
                for keyword in decorator.keywords:
                    if keyword.arg == "do_not_specialize":
                        named = set(ast.literal_eval(keyword.value))
            found.append((node, named))
    return found


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.name)
def test_scalar_arguments_whose_methods_are_called_are_not_specialized(path: Path) -> None:
    for kernel, named in _kernels(path):
        scalars = {
            a.arg
            for a in kernel.args.args
            if not a.arg.endswith("_ptr")
            and not (a.annotation is not None and "constexpr" in ast.unparse(a.annotation))
        }
        called = {
            sub.value.id
            for sub in ast.walk(kernel)
            if isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id in scalars
        }
        assert called <= named, f"{path.name}:{kernel.name}: add {sorted(called - named)}"


def test_the_check_sees_the_kernels() -> None:
    assert sum(len(_kernels(p)) for p in KERNELS) >= 20
