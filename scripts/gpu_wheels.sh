#!/usr/bin/env bash
# make gpu-wheels: downloads, here (PyPI reachable), the wheels a bare GPU machine needs beyond its
# torch image, for that machine's Python, into a git-ignored folder that a device call carries:
#   scripts/gpu_wheels.sh [--print] [--python-version 3.12] [--dest .device-wheels]
# The image has torch, numpy, scipy, statsmodels, matplotlib, pytest, pytest-xdist, hypothesis,
# tensorboard, pyyaml and tqdm; torchvision must match the image's torch and is not carried (the
# kit's environment part names it when it is missing). scripts/gpu_check.sh installs these wheels
# (pip --no-index --no-deps) when a runtime dependency is missing (scripts/gpu_check_deps.py).
# faiss-cpu is carried: faiss-gpu (faiss-gpu-cu12, a 135 MB wheel plus the CUDA 12 runtime) does
# not fit a 64 MiB carry; where a network exists: pip uninstall -y faiss-cpu && pip install
# faiss-gpu-cu12. --print: the pip command, nothing downloaded. About 40 MB.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
dest="$root/.device-wheels"
pyversion=3.12
dry=0
while [ $# -gt 0 ]; do
    case "$1" in
        --print) dry=1 ;;
        --dest) dest="$2"; shift ;;
        --python-version) pyversion="$2"; shift ;;
        *) echo "gpu_wheels.sh: unknown argument $1 (--print, --dest DIR, --python-version X.Y)" >&2; exit 2 ;;
    esac
    shift
done
# the runtime dependencies (pyproject) missing from the image, with what they need in turn:
# optuna -> sqlalchemy, alembic, colorlog (alembic -> mako; sqlalchemy -> greenlet); PML ->
# scikit-learn -> joblib, threadpoolctl, narwhals
packages=(
    "pytorch-metric-learning==2.9.0" record-keeper faiss-cpu
    optuna sqlalchemy alembic colorlog mako greenlet
    scikit-learn joblib threadpoolctl narwhals
)
cmd=("$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyversion"
     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" "${packages[@]}")
if [ "$dry" = 1 ]; then
    printf '%q ' "${cmd[@]}"; echo
    exit 0
fi
mkdir -p "$dest"
"${cmd[@]}"
du -sh "$dest"
ls "$dest"
