#!/usr/bin/env bash
# The study's verdicts on other class-disjoint splits of small1 (issue 42): the tuned settings of
# docs/study/tune (chosen on split 0's validation classes) re-run on the splits drawn with
# split.class_disjoint_split.seed = 1, 2, 3, all eight methods, 5 paired seeds (1-5), and the two
# decided claims (batch_size, rll_margin_tn) on split 1. Every step is resumable: rerun the same
# command after an interruption (`compare --resume` reuses finished runs and continues
# interrupted ones); each finished step's small outputs (json, md, csv, png; never checkpoints)
# are copied to docs/study/splits/<step>/. This is the published study's record (docs/results.md
# names this command); for any other config, `pml-rank study CONFIG --splits K --seeds S` runs
# the tuning, the splits and the pooled report in one resumable command. Run from the
# repository root:
#   scripts/run_splits.sh                 # every step, in order
#   scripts/run_splits.sh seed2 claims1   # chosen steps: seed1 | seed2 | seed3 |
#                                         #   claims1 (batch_size + rll_margin_tn on split 1)
# Environment: PML_RANK_DATA (default ../shared/data), OUT (default runs/splits), JOBS (default
# 2), SEEDS (default 5), PYTHON (default .venv/bin/python if present). One torch thread per run.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_ROOT=${PML_RANK_DATA:-../shared/data}
OUT=${OUT:-runs/splits}
JOBS=${JOBS:-2}
SEEDS=${SEEDS:-5}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
STEPS=("$@")
if [ ${#STEPS[@]} -eq 0 ]; then STEPS=(seed1 seed2 claims1 seed3); fi

cli() { "$PYTHON" -m pml_rank_plugins "$@"; }

publish() {  # publish RUN_DIR DOCS_DIR: the small outputs of a finished compare
  mkdir -p "$2"
  find "$1" -maxdepth 1 -type f \( -name '*.json' -o -name '*.md' -o -name '*.csv' \
    -o -name '*.png' \) ! -name '.*' -exec cp {} "$2/" \;
}

step() {
  case "$1" in
    seed[1-9])
      k=${1#seed}
      cli compare studies/omniglot --data-root "$DATA_ROOT" --tuned docs/study/tune \
        --seeds "$SEEDS" --set "split.class_disjoint_split.seed=$k" --allow-budget-change \
        --jobs "$JOBS" --resume --out "$OUT/seed$k"
      publish "$OUT/seed$k" "docs/study/splits/seed$k" ;;
    claims[1-9])
      k=${1#claims}
      for claim in rll_margin_tn batch_size; do
        cli compare "claims/$claim" --data-root "$DATA_ROOT" --seeds "$SEEDS" \
          --set "split.class_disjoint_split.seed=$k" --jobs "$JOBS" --resume \
          --out "$OUT/claims$k/$claim"
        publish "$OUT/claims$k/$claim" "docs/study/splits/claims$k/$claim"
      done ;;
    *) echo "run_splits.sh: unknown step $1 (seedK, claimsK)" >&2; exit 2 ;;
  esac
}

for s in "${STEPS[@]}"; do
  echo "=== $s: start $(date -u +%FT%TZ)"
  t0=$(date +%s)
  step "$s"
  echo "=== $s: done $(date -u +%FT%TZ) in $(( $(date +%s) - t0 )) s"
done
