#!/usr/bin/env bash
# The GPU validation kit (issue 31): scripts/gpu_check.sh [--device cuda|cpu] [--tiny] --out OUT
# writes OUT/gpu_check.md and OUT/gpu_check.json (see scripts/gpu_check.py). Uses the
# repository's .venv when there is one, else python3 from PATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$root/scripts/gpu_check.py" "$@"
