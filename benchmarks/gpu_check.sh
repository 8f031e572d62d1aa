#!/usr/bin/env bash
# Every GPU check in one command (benchmarks/gpu_check.py), for a GPU machine lent for
# a few minutes that has torch and Triton but not Flower, and no package index.
#
#   benchmarks/gpu_check.sh --fetch-wheels     # here: the wheels of benchmarks/gpu_wheels.txt
#                                              # for Python 3.12 / manylinux x86-64, into .whl/
#   benchmarks/gpu_check.sh OUT [ARGS...]      # there, from the repository root: install .whl/
#                                              # into /tmp/site, then gpu_check --out OUT ARGS
#   benchmarks/gpu_check.sh OUT --device cpu   # the dry run, on any machine
#
# FEDSYNC_COMMIT names the commit the tree was copied from (a copy without .git);
# FEDSYNC_GPU_WHEELS the wheel folder (default .whl); PYTHON the interpreter (python3).
set -u
python=${PYTHON:-python3}
if [ "${1:-}" != "--fetch-wheels" ]; then
    case "${1:-}" in
        "" | -*) echo "usage: benchmarks/gpu_check.sh OUT [ARGS...] | --fetch-wheels" >&2; exit 2 ;;
    esac
    mkdir -p -- "$1" && out=$(cd -- "$1" && pwd) || exit 1  # OUT as given, before the cd
    shift
fi
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--fetch-wheels" ]; then
    exec "$python" -m pip download --isolated --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        --platform manylinux_2_5_x86_64 \
        -d .whl -r benchmarks/gpu_wheels.txt
fi
wheels=${FEDSYNC_GPU_WHEELS:-.whl}
if ls "$wheels"/*.whl >/dev/null 2>&1; then
    # On PYTHONPATH, so these versions come before the image's own copies of the same
    # packages; a failure is reported by the steps that need Flower, and the kernel steps
    # still run.
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$wheels"/*.whl || echo "installing the carried wheels failed" >&2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    export PATH=/tmp/site/bin:$PATH
fi
exec "$python" -m benchmarks.gpu_check --out "$out" "$@"
