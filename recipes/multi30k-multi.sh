#!/usr/bin/env bash
# Multi30k, one model for several directions (de, en, fr): prepare --lang-pairs -> train -> for each direction:
# the length penalty on valid, test2016 with beam 5 and --tgt-lang, scores -> one recorded row per direction.
#
#   recipes/multi30k-multi.sh [SIZE] [OUT]      e.g. recipes/multi30k-multi.sh cpu-long
#
# SIZE: cpu, cpu-long or full, the bilingual recipe's config (recipes/multi30k.sh) with one joint BPE vocabulary
# (BPE, default 8000: three languages in one table, the tags >>de<< >>en<< >>fr<< added to it) and a training budget
# that leaves the whole recipe within the size's (MINUTES: training minutes, default 39 for cpu-long, 10 for cpu:
# prepare, six directions' length penalties and test2016 took 4.3 minutes on a 2-core AMD EPYC).
# PAIRS: the directions trained (default all six); ZERO_SHOT: directions scored without being trained (e.g.
# "de-fr,fr-de" with PAIRS=de-en,en-de,en-fr,fr-en): the length penalty of the trained directions' mean is used.
# NAME (default multi30k-multi, or multi30k-multi-zs with ZERO_SHOT) names the rows; TRAIN_ARGS and SEED as in
# multi30k.sh. Rows: benchmarks/results/recipes.md, "one multilingual model".
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-cpu-long}
PAIRS=${PAIRS:-de-en,en-de,de-fr,fr-de,en-fr,fr-en}
ZERO_SHOT=${ZERO_SHOT:-}
OUT=${2:-runs/multi30k-multi-$SIZE${ZERO_SHOT:+-zs}}
DATA=${DATA:-../shared/data}
D=$DATA/multi30k
# cpu-long: without the bilingual config's R-Drop, which halves the steps (a step is two passes): six directions share
# them already (about 1,350 a direction, their valid BLEU still rising), and R-Drop was not tried on this recipe
case $SIZE in cpu) CONFIG=recipes/multi30k-cpu.yaml MINUTES=${MINUTES:-10} ;;
  cpu-long) CONFIG=recipes/multi30k-cpu-long.yaml MINUTES=${MINUTES:-39} TRAIN_ARGS="--set train.rdrop=0 ${TRAIN_ARGS:-}" ;;
  full) CONFIG=recipes/multi30k.yaml MINUTES=${MINUTES:-0} ;;
  *) echo "error: SIZE must be cpu, cpu-long or full, got '$SIZE'" >&2; exit 2 ;; esac
BPE=${BPE:-8000}
SEED=${SEED:-1}
[ "$SEED" = 1 ] && OTHER_SEED=() || OTHER_SEED=(--seed "$SEED")
NAME=${NAME:-multi30k-multi${ZERO_SHOT:+-zs}}
[ "$MINUTES" = 0 ] && BUDGET=() || BUDGET=(--set "train.max_minutes=$MINUTES")
for lang in de en fr; do
  [ -f "$D/train.$lang" ] || { echo "error: $D/train.$lang not found; set DATA" >&2; exit 1; }
done
mkdir -p "$OUT"

echo "== prepare: $PAIRS, one joint BPE ($BPE) and a tag per target language" >&2
tfcli prepare --lang-pairs "$PAIRS" --train-prefix "$D/train" --valid-prefix "$D/valid" --tokenizer bpe \
  --vocab-size "$BPE" --joint-vocab -o "$OUT/prep"

echo "== train: $CONFIG, $MINUTES minutes" >&2
[ -d "$OUT/run" ] && RESUME=(-o "$OUT/run" --resume) TIMED=(--resumed) || RESUME=(-o "$OUT/run") TIMED=()
tfcli train "$OUT/prep" "${RESUME[@]}" --config "$CONFIG" --seed "$SEED" "${BUDGET[@]}" ${TRAIN_ARGS:-} >/dev/null
CKPT="$OUT/run"
for avg in "$OUT"/run/checkpoints/avg-last*; do [ -d "$avg" ] && CKPT=$avg; done

score() {  # DIR SRC TGT ALPHA: translate test2016, score it as multi30k.sh does
  local dir=$1 s=$2 t=$3 alpha=$4
  tfcli translate -m "$CKPT" --tgt-lang "$t" --beam-size 5 --len-penalty "$alpha" "$D/test2016.$s" -o "$dir/test2016.hyp.$t"
  tfcli eval "$dir/test2016.hyp.$t" -r "$D/test2016.$t" --metrics bleu,chrf --json > "$dir/sacrebleu.json"
  sacremoses -l "$t" -j 1 tokenize < "$dir/test2016.hyp.$t" > "$dir/test2016.hyp.tok.$t"
  sacremoses -l "$t" -j 1 tokenize < "$D/test2016.$t" > "$dir/test2016.ref.tok.$t"
  tfcli eval "$dir/test2016.hyp.tok.$t" -r "$dir/test2016.ref.tok.$t" --metrics bleu --tokenize none --json > "$dir/tokbleu.json"
  tfcli eval "$dir/test2016.hyp.tok.$t" -r "$dir/test2016.ref.tok.$t" --metrics bleu --tokenize none --lowercase \
    --json > "$dir/tokbleu-lc.json"
  echo "$alpha" > "$dir/len_penalty.txt"
  ln -sfn ../run "$dir/run"  # the one training run, which each direction's row reads
}

ALPHAS=()
for pair in ${PAIRS//,/ }; do
  s=${pair%-*} t=${pair#*-} dir=$OUT/$pair
  mkdir -p "$dir"
  echo "== $pair: the length penalty on valid, then test2016" >&2
  : > "$dir/valid_len_penalty.tsv.tmp"
  while :; do
    alpha=$(python3 recipes/len_penalty.py next "$dir/valid_len_penalty.tsv.tmp")
    [ -n "$alpha" ] || break
    bleu=$(tfcli eval --model "$CKPT" --translate "$D/valid.$s" --tgt-lang "$t" -r "$D/valid.$t" --beam-size 5 \
      --len-penalty "$alpha" --metrics bleu --score-only)
    printf '%s\t%s\n' "$alpha" "$bleu" >> "$dir/valid_len_penalty.tsv.tmp"
  done
  mv "$dir/valid_len_penalty.tsv.tmp" "$dir/valid_len_penalty.tsv"
  alpha=$(python3 recipes/len_penalty.py best "$dir/valid_len_penalty.tsv")
  ALPHAS+=("$alpha")
  score "$dir" "$s" "$t" "$alpha"
done
MEAN_ALPHA=$(python3 -c "import sys; a = [float(x) for x in sys.argv[1:]]; print(f'{sum(a) / len(a):g}')" "${ALPHAS[@]}")
for pair in ${ZERO_SHOT//,/ }; do
  s=${pair%-*} t=${pair#*-} dir=$OUT/$pair
  mkdir -p "$dir"
  echo "== $pair (zero-shot): test2016 with the trained directions' mean length penalty $MEAN_ALPHA" >&2
  score "$dir" "$s" "$t" "$MEAN_ALPHA"
done
for pair in ${PAIRS//,/ } ${ZERO_SHOT//,/ }; do
  python3 benchmarks/recipe_results.py record multi30k "$OUT/$pair" --pair "$pair" --size "$SIZE" --checkpoint "$CKPT" \
    --name "$NAME-$pair" --train-args "${BUDGET[*]} ${TRAIN_ARGS:-}" "${OTHER_SEED[@]}" --len-penalty "$(cat "$OUT/$pair/len_penalty.txt")" \
    --wall-s "$SECONDS" "${TIMED[@]}"
done
