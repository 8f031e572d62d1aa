"""Where fedsync leans on a Flower version's internals: one module per Flower version.

:mod:`fedsync.compat.flower139` is the only place in fedsync that imports Flower's
internal modules or reaches its private names (``tests/unit/test_flower_compat.py``
checks it); its docstring defines the public API every other module keeps to.
"""
