#!/usr/bin/env bash
# The fair comparison on Omniglot (issue 27; configs/studies/omniglot.yaml), phase by phase.
# Every phase is resumable: rerun the same command after an interruption (a killed `tune`
# continues its studies, marking the interrupted trial failed; `compare --resume` reuses
# finished runs and continues interrupted ones). The published study's record; for any other
# config `pml-rank study CONFIG` runs tune, the tuned settings on several class splits and the
# pooled report in one resumable command. Run from the repository root:
#   scripts/run_study.sh                    # every phase, in order
#   scripts/run_study.sh probe              # one phase: probe | tune | tuned | defaults | claims
#                                           #   | publish
#   scripts/run_study.sh snapshot           # before a session ends: the tuning state into docs/
# Phases:
#   probe     convergence probe: 3 methods x 3 seeds, up to 60 epochs, patience 10, no test split
#   tune      30 TPE trials per method (the config's tune section), --jobs 2
#   tuned     the best setting of each method, 10 seeds (seeds 1-10), test at the best epoch
#   defaults  each method at its default setting on the same 10 seeds (paired with `tuned`)
#   claims    the papers' six claims at this budget (claim 4's class balancing again, at batch 88,
#             in class_balancing: at batch 80 it is a no-op), each from its loss's tuned setting
#             (configs/claims/*.yaml; 10 paired seeds, 1-10); CLAIMS="a b" runs a subset. A
#             setting whose config equals a tuned run's in every key but its name is copied from
#             OUT/tuned, not trained again (scripts/study_reuse.py; 4 settings x 10 seeds)
#   publish   copy the small outputs (json, md, csv, figures; never checkpoints) to docs/study/
#   snapshot  copy runs/study/tune/tune.db to docs/study/tune/tune.db (consistent, running trials
#             marked failed in the copy) so a later session continues the studies; `tune` restores
#             it by itself when runs/study/tune/tune.db is missing (scripts/study_snapshot.py)
# Environment: PML_RANK_DATA (default ../shared/data), OUT (default runs/study), JOBS (default
# 2), PYTHON (default .venv/bin/python if present, else python). One torch thread per run.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_ROOT=${PML_RANK_DATA:-../shared/data}
OUT=${OUT:-runs/study}
JOBS=${JOBS:-2}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
CONFIG=studies/omniglot
PROBE_METHODS="plugin FastAP,plugin RankedList,PML Contrastive"
PHASES=("$@")
if [ ${#PHASES[@]} -eq 0 ]; then PHASES=(probe tune tuned defaults claims publish); fi
ALL_CLAIMS="hard_vs_random map_q_vs_t rll_margin_tn rll_query_weighting fastap_bins batch_size class_balancing"
CLAIMS=${CLAIMS:-$ALL_CLAIMS}

cli() { "$PYTHON" -m pml_rank_plugins "$@"; }

phase() {
  case "$1" in
    probe)
      # configs/omniglot.yaml: the study's data, trunk, sampler and batch at default settings
      cli compare omniglot --data-root "$DATA_ROOT" --methods "$PROBE_METHODS" --seeds 3 \
        --jobs "$JOBS" --resume --out "$OUT/probe" \
        --set trainer.num_epochs=60 --set eval.patience=10 --set 'eval.test=[]' ;;
    tune)
      "$PYTHON" scripts/study_snapshot.py restore "$OUT" docs/study
      cli tune "$CONFIG" --data-root "$DATA_ROOT" --jobs "$JOBS" --out "$OUT/tune" ;;
    snapshot)
      "$PYTHON" scripts/study_snapshot.py snapshot "$OUT" docs/study ;;
    tuned)
      cli compare "$CONFIG" --data-root "$DATA_ROOT" --tuned "$OUT/tune" --seeds 10 \
        --jobs "$JOBS" --resume --out "$OUT/tuned" ;;
    defaults)
      # seed=1: the tuned runs use seeds 1-10 (the tuning seed 0 + 1 + i), so the pairs match
      cli compare "$CONFIG" --data-root "$DATA_ROOT" --seeds 10 --set seed=1 \
        --jobs "$JOBS" --resume --out "$OUT/defaults" ;;
    claims)
      for claim in $CLAIMS; do
        echo "=== claim $claim: start $(date -u +%FT%TZ)"
        # a setting that is, key for key, a tuned run (e.g. M=80 (tuned)) reuses that run
        "$PYTHON" scripts/study_reuse.py "$OUT/tuned" "claims/$claim" "$OUT/claims/$claim" \
          --seeds 10 --data-root "$DATA_ROOT"
        cli compare "claims/$claim" --data-root "$DATA_ROOT" --seeds 10 --jobs "$JOBS" --resume \
          --out "$OUT/claims/$claim"
      done ;;
    publish)
      for part in probe tune tuned defaults $(cd "$OUT" && ls -d claims/* 2>/dev/null); do
        [ -d "$OUT/$part" ] || continue
        mkdir -p "docs/study/$part"
        find "$OUT/$part" -maxdepth 1 -type f \( -name '*.json' -o -name '*.md' -o -name '*.csv' \
          -o -name '*.png' \) ! -name '.*' -exec cp {} "docs/study/$part/" \;
      done
      "$PYTHON" scripts/study_report.py "$OUT" docs/study ;;
    *) echo "run_study.sh: unknown phase $1 (probe, tune, tuned, defaults, claims, publish," \
         "snapshot)" >&2
       exit 2 ;;
  esac
}

for p in "${PHASES[@]}"; do
  echo "=== $p: start $(date -u +%FT%TZ)"
  t0=$(date +%s)
  phase "$p"
  echo "=== $p: done $(date -u +%FT%TZ) in $(( $(date +%s) - t0 )) s"
done
