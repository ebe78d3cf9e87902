#!/usr/bin/env bash
# Reproduce docs/ablations.md: each claim's settings over the same seeds (paired), one claim at
# a time, sequentially, one torch thread. Run from the repository root:
#   scripts/run_ablations.sh                          # all five claims, 5 seeds each
#   scripts/run_ablations.sh fastap_bins batch_size   # a subset
# Environment: OMNIGLOT_ZIP (default ../shared/data/omniglot/images_background_small1.zip),
# SEEDS (default 5), OUT (default runs/ablations), PYTHON (default python), and RESUME=1 to reuse
# finished runs (adds --resume: finished runs are read back, not retrained).
set -euo pipefail
cd "$(dirname "$0")/.."
ZIP=${OMNIGLOT_ZIP:-../shared/data/omniglot/images_background_small1.zip}
SEEDS=${SEEDS:-5}
OUT=${OUT:-runs/ablations}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
CLAIMS=("$@")
if [ ${#CLAIMS[@]} -eq 0 ]; then
  CLAIMS=(hard_vs_random map_q_vs_t rll_margin_tn fastap_bins batch_size)
fi
EXTRA=()
if [ "${RESUME:-0}" = 1 ]; then EXTRA+=(--resume); fi
for claim in "${CLAIMS[@]}"; do
  echo "=== $claim: start $(date -u +%FT%TZ)"
  t0=$(date +%s)
  "$PY" -m pml_rank_plugins.cli compare "pml_rank_plugins/experiment/configs/ablations/$claim.yaml" \
    --seeds "$SEEDS" --out "$OUT/$claim" --set "dataset.OmniglotDataset.path=$ZIP" \
    ${EXTRA[@]+"${EXTRA[@]}"}
  echo "=== $claim: done $(date -u +%FT%TZ) in $(( $(date +%s) - t0 )) s"
done
