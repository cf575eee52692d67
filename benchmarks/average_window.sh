#!/usr/bin/env bash
# How many checkpoints to average, chosen on valid: for each K, `tfcli average-checkpoints RUN --last K`, then beam 5
# on the valid split at length penalties 1.0, 1.4 and 1.8 (sacreBLEU). RUN must have kept at least the largest K
# (train.keep_last). test2016 is never read.
#
#   benchmarks/average_window.sh RUN SRC TGT K...     e.g. benchmarks/average_window.sh runs/x/run en de 3 5 8 16
#
# Writes benchmarks/results/average_window.md (OUT=FILE: elsewhere). The data comes from $DATA (../shared/data).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:?usage: benchmarks/average_window.sh RUN SRC TGT K...}; SRC=${2:?}; TGT=${3:?}; shift 3
D=${DATA:-../shared/data}/multi30k
OUT=${OUT:-benchmarks/results/average_window.md}
CPU=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from common import cpu_name; print(cpu_name())")
rows=()
for K in "$@"; do
  tfcli average-checkpoints "$RUN" --last "$K" -q -f >/dev/null
  row="| $K"
  for A in 1.0 1.4 1.8; do
    row+=" | $(tfcli eval --model "$RUN/checkpoints/avg-last$K" --translate "$D/valid.$SRC" -r "$D/valid.$TGT" \
      --beam-size 5 --len-penalty "$A" --metrics bleu --score-only)"
  done
  rows+=("$row |")
done
{
  echo "# Checkpoint averaging: the last K checkpoints of one run, valid sacreBLEU (beam 5)"
  echo
  echo "\`benchmarks/average_window.sh $RUN $SRC $TGT $*\` ($SRC->$TGT, $CPU, $(nproc) cores, $(date -u +%F)): the run's"
  echo "config is in $RUN/config.yaml. Written by benchmarks/average_window.sh; test2016 is never read."
  echo
  echo "| last K | length penalty 1.0 | 1.4 | 1.8 |"
  echo "| ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
} > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
cat "$OUT"
