#!/usr/bin/env bash
# Multi30k (task 1, test2016) from raw text to a score: prepare -> train (-> average, full size) -> translate
# (beam 5) -> eval.
#
#   recipes/multi30k.sh SRC TGT [SIZE] [OUT]      e.g. recipes/multi30k.sh de en cpu
#
# SRC/TGT: two of de, en, fr. SIZE: cpu (recipes/multi30k-cpu.yaml: at most 15 minutes on a 2-core CPU, the whole
# recipe), cpu-long (recipes/multi30k-cpu-long.yaml: at most 45 minutes) or full (recipes/multi30k.yaml, 3+3 layers
# x 256, for a GPU). The CPU sizes train on a wall-clock budget (train.max_minutes): the step count is planned from
# the machine's measured speed and written to the log, so a faster machine trains longer, a slower one less.
# OUT defaults to runs/multi30k-SRC-TGT-SIZE. Variants, each recorded under its own name beside the recipe's row:
# TRAIN_ARGS (extra `tfcli train` arguments, e.g. "--set train.lr=0.001"), SEED (default 1), VOCAB (joint: one BPE
# vocabulary for both sides, with one embedding table; separate: one a side; default: the size's own, below), BPE
# (its size; default 8000 joint, 5000 separate), LOWERCASE=1 (`prepare --lowercase`: trained on lowercased text, as
# the en->de anchor was; every score of the variant is then lowercased, its signatures say so).
# MODEL=decoder (or decoder-prefix) trains a decoder-only translator instead (recipes/multi30k-decoder-SIZE.yaml, the
# encoder-decoder's parameter count; one joint vocabulary; decoder-prefix: attention both ways over the source), its
# figures recorded as multi30k-MODEL-SRC-TGT.
# For recipes/distill.sh: DISTILLED (a file of target sentences line-aligned with train.SRC, trained on in place of
# train.TGT; with ORIGINAL=1 beside it), CONFIG (another config than the size's) and NAME (the name the figures are
# recorded under; default multi30k-SRC-TGT).
# The data comes from $DATA (default ../shared/data), never from the repository. Scores: sacreBLEU (cased,
# 13a, detokenised; the default signature), chrF2, and tokenised BLEU (both sides Moses-tokenised with sacremoses,
# then BLEU without further tokenisation, as fairseq reports it), and the same lowercased. OUT/result.json holds the figures, signatures,
# training time and hardware; benchmarks/recipe_results.py collects them into benchmarks/results/recipes.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:?usage: recipes/multi30k.sh SRC TGT [cpu|cpu-long|full] [OUT]}
TGT=${2:?usage: recipes/multi30k.sh SRC TGT [cpu|cpu-long|full] [OUT]}
SIZE=${3:-cpu}
OUT=${4:-runs/multi30k-$SRC-$TGT-$SIZE}
DATA=${DATA:-../shared/data}
D=$DATA/multi30k
# the vocabulary, each size's own. The CPU sizes: one BPE of 5,000 a side, which makes the output layer and the loss
# (the largest costs of a step at their model size) 5/8 of a joint 8,000's, of which de->en's target side used only
# 4,245 tokens; on valid (de-en, the cpu budget, fp32, benchmarks/results/ablations.md) 1.15x the steps and +1.43
# beam-5 sacreBLEU. full: a joint 8,000.
case $SIZE in cpu) SIZE_CONFIG=recipes/multi30k-cpu.yaml OWN_VOCAB=separate ;;
  cpu-long) SIZE_CONFIG=recipes/multi30k-cpu-long.yaml OWN_VOCAB=separate ;;
  full) SIZE_CONFIG=recipes/multi30k.yaml OWN_VOCAB=joint ;;
  *) echo "error: SIZE must be cpu, cpu-long or full, got '$SIZE'" >&2; exit 2 ;; esac
MODEL=${MODEL:-encoder-decoder}
case $MODEL in encoder-decoder) ;;
  decoder|decoder-prefix) SIZE_CONFIG=recipes/multi30k-decoder-$SIZE.yaml VOCAB=${VOCAB:-joint}
    NAME=${NAME:-multi30k-$MODEL-$SRC-$TGT}
    [ -f "$SIZE_CONFIG" ] || { echo "error: MODEL=$MODEL has no $SIZE size ($SIZE_CONFIG); use cpu-long" >&2; exit 2; }
    [ "$MODEL" = decoder-prefix ] && TRAIN_ARGS="--set model.prefix_attention=true${TRAIN_ARGS:+ $TRAIN_ARGS}" ;;
  *) echo "error: MODEL must be encoder-decoder, decoder or decoder-prefix, got '$MODEL'" >&2; exit 2 ;; esac
CONFIG=${CONFIG:-$SIZE_CONFIG}
VOCAB=${VOCAB:-$OWN_VOCAB}
case $VOCAB in separate) OWN_BPE=5000 ;; joint) OWN_BPE=8000 ;;
  *) echo "error: VOCAB must be joint or separate, got '$VOCAB'" >&2; exit 2 ;; esac
[ "$VOCAB" = "$OWN_VOCAB" ] && OTHER_VOCAB=() || OTHER_VOCAB=(--vocab "$VOCAB")
# the BPE size (a joint 4,000 was behind a joint 8,000 on valid at the cpu budget: benchmarks/results/ablations.md)
BPE=${BPE:-$OWN_BPE}
[ "$BPE" = "$OWN_BPE" ] && OTHER_BPE=() || OTHER_BPE=(--bpe "$BPE")
SEED=${SEED:-1}
[ "$SEED" = 1 ] && OTHER_SEED=() || OTHER_SEED=(--seed "$SEED")
LOWERCASE=${LOWERCASE:-0}
[ "$LOWERCASE" = 1 ] && LC=(--lowercase) || LC=()
[ -f "$D/train.$SRC" ] && [ -f "$D/train.$TGT" ] || { echo "error: $D/train.$SRC or $D/train.$TGT not found; set DATA" >&2; exit 1; }
mkdir -p "$OUT"
TRAIN_SRC=$D/train.$SRC TRAIN_TGT=$D/train.$TGT
if [ -n "${DISTILLED:-}" ]; then  # a student: the teacher's translations (beside the references with ORIGINAL=1)
  TRAIN_TGT=$DISTILLED
  if [ "${ORIGINAL:-0}" = 1 ]; then
    cat "$D/train.$SRC" "$D/train.$SRC" > "$OUT/train.$SRC" && cat "$D/train.$TGT" "$DISTILLED" > "$OUT/train.$TGT"
    TRAIN_SRC=$OUT/train.$SRC TRAIN_TGT=$OUT/train.$TGT
  fi
fi

echo "== prepare: BPE ($BPE, $VOCAB), memory-mapped ids" >&2
tfcli prepare --src "$TRAIN_SRC" --tgt "$TRAIN_TGT" --valid-src "$D/valid.$SRC" --valid-tgt "$D/valid.$TGT" \
  --test-src "$D/test2016.$SRC" --test-tgt "$D/test2016.$TGT" --tokenizer bpe --vocab-size "$BPE" --"$VOCAB"-vocab \
  "${LC[@]}" -o "$OUT/prep"

echo "== train: $CONFIG" >&2
# a stopped recipe picks up where it was (the resumed run is the uninterrupted one, bit for bit); its whole-recipe
# time is then not one run's, so it is recorded as resumed instead
[ -d "$OUT/run" ] && RESUME=(-o "$OUT/run" --resume) TIMED=(--resumed) || RESUME=(-o "$OUT/run") TIMED=()
tfcli train "$OUT/prep" "${RESUME[@]}" --config "$CONFIG" --seed "$SEED" ${TRAIN_ARGS:-} >/dev/null

CKPT="$OUT/run"  # its best checkpoint, or the average of the last ones where the config asks for one
for avg in "$OUT"/run/checkpoints/avg-last*; do [ -d "$avg" ] && CKPT=$avg; done
# the length penalty is chosen on the valid split (sacreBLEU with beam 5): 1.0, 1.4 and 1.8 first, then outward while
# the best is at an end (recipes/len_penalty.py); test2016 is translated once, with it
: > "$OUT/valid_len_penalty.tsv.tmp"
while :; do
  alpha=$(python3 recipes/len_penalty.py next "$OUT/valid_len_penalty.tsv.tmp")
  [ -n "$alpha" ] || break
  bleu=$(tfcli eval --model "$CKPT" --translate "$D/valid.$SRC" -r "$D/valid.$TGT" --beam-size 5 --len-penalty "$alpha" \
    --metrics bleu --score-only "${LC[@]}")
  echo "   valid, beam 5, length penalty $alpha: sacreBLEU $bleu" >&2
  printf '%s\t%s\n' "$alpha" "$bleu" >> "$OUT/valid_len_penalty.tsv.tmp"
done
BEST_ALPHA=$(python3 recipes/len_penalty.py best "$OUT/valid_len_penalty.tsv.tmp")
mv "$OUT/valid_len_penalty.tsv.tmp" "$OUT/valid_len_penalty.tsv"  # length penalty, valid sacreBLEU: recorded
echo "$BEST_ALPHA" > "$OUT/len_penalty.txt"
echo "== translate: test2016 with beam 5 and length penalty $BEST_ALPHA, from $CKPT" >&2
tfcli translate -m "$CKPT" --beam-size 5 --len-penalty "$BEST_ALPHA" "$D/test2016.$SRC" -o "$OUT/test2016.hyp.$TGT"

echo "== eval" >&2
tfcli eval "$OUT/test2016.hyp.$TGT" -r "$D/test2016.$TGT" --metrics bleu,chrf --json "${LC[@]}" > "$OUT/sacrebleu.json"
sacremoses -l "$TGT" -j 1 tokenize < "$OUT/test2016.hyp.$TGT" > "$OUT/test2016.hyp.tok.$TGT"
sacremoses -l "$TGT" -j 1 tokenize < "$D/test2016.$TGT" > "$OUT/test2016.ref.tok.$TGT"
tfcli eval "$OUT/test2016.hyp.tok.$TGT" -r "$OUT/test2016.ref.tok.$TGT" --metrics bleu --tokenize none --json "${LC[@]}" \
  > "$OUT/tokbleu.json"
# the anchors' metric: lowercased tokenised BLEU (de->en: bentrevett/pytorch-seq2seq, whose tokens are spaCy's; en->de:
# fairseq transformer_tiny of Wu et al. 2021, trained and scored on lowercased Moses-tokenised text)
tfcli eval "$OUT/test2016.hyp.tok.$TGT" -r "$OUT/test2016.ref.tok.$TGT" --metrics bleu --tokenize none --lowercase \
  --json > "$OUT/tokbleu-lc.json"
python3 benchmarks/recipe_results.py record multi30k "$OUT" --pair "$SRC-$TGT" --size "$SIZE" --checkpoint "$CKPT" \
  ${NAME:+--name "$NAME"} \
  --train-args "${TRAIN_ARGS:-}" "${OTHER_VOCAB[@]}" "${OTHER_BPE[@]}" "${OTHER_SEED[@]}" "${LC[@]}" \
  --len-penalty "$BEST_ALPHA" --wall-s "$SECONDS" "${TIMED[@]}"  # the whole recipe's time
