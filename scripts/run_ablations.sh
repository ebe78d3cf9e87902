#!/usr/bin/env bash
# Reproduce docs/ablations.md: each claim's settings over the same seeds (paired), one claim at
# a time, sequentially, one torch thread. Run from the repository root:
#   scripts/run_ablations.sh                          # all five claims, 5 seeds each
#   scripts/run_ablations.sh fastap_bins batch_size   # a subset
#   SEEDS=10 scripts/run_ablations.sh rll_query_weighting   # claim 6, at the study budget (its header)
# Environment: PML_RANK_DATA, the data root holding omniglot/images_background_small1.zip
# (default ../shared/data; passed as --data-root), OMNIGLOT_ZIP (optional: that zip anywhere else,
# passed as --set dataset.OmniglotDataset.path=...), SEEDS (default 5), OUT (default
# runs/ablations), PYTHON (default python), and RESUME=1 to reuse finished runs (adds --resume:
# finished runs are read back, not retrained).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_ROOT=${PML_RANK_DATA:-../shared/data}
SEEDS=${SEEDS:-5}
OUT=${OUT:-runs/ablations}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
CLAIMS=("$@")
if [ ${#CLAIMS[@]} -eq 0 ]; then
  CLAIMS=(hard_vs_random map_q_vs_t rll_margin_tn fastap_bins batch_size rll_query_weighting)
fi
EXTRA=()
if [ "${RESUME:-0}" = 1 ]; then EXTRA+=(--resume); fi
if [ -n "${OMNIGLOT_ZIP:-}" ]; then EXTRA+=(--set "dataset.OmniglotDataset.path=$OMNIGLOT_ZIP"); fi
for claim in "${CLAIMS[@]}"; do
  echo "=== $claim: start $(date -u +%FT%TZ)"
  t0=$(date +%s)
  "$PY" -m pml_rank_plugins compare "ablations/$claim" --data-root "$DATA_ROOT" \
    --seeds "$SEEDS" --out "$OUT/$claim" \
    ${EXTRA[@]+"${EXTRA[@]}"}
  echo "=== $claim: done $(date -u +%FT%TZ) in $(( $(date +%s) - t0 )) s"
done
