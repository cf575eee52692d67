#!/usr/bin/env bash
# Tiny Shakespeare character-level LM, nanoGPT's split (the last 10% of the characters is validation):
# prepare -> train -> validation loss -> a sample.
#
#   recipes/shakespeare.sh [SIZE] [OUT]      SIZE: cpu (nanoGPT's CPU shapes, recipes/shakespeare-char-cpu.yaml,
#                                            a few minutes on 2 cores) or full (baby GPT, recipes/shakespeare-char.yaml,
#                                            for a GPU). OUT defaults to runs/shakespeare-char-SIZE.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-cpu}
OUT=${2:-runs/shakespeare-char-$SIZE}
DATA=${DATA:-../shared/data}
# a 500-character sample: past the model's context (64 or 256 characters) it slides, as nanoGPT's sample.py does
SAMPLE=500
case $SIZE in cpu) CONFIG=recipes/shakespeare-char-cpu.yaml ;; full) CONFIG=recipes/shakespeare-char.yaml ;;
  *) echo "error: SIZE must be cpu or full, got '$SIZE'" >&2; exit 2 ;; esac
[ -f "$DATA/tinyshakespeare/input.txt" ] || { echo "error: $DATA/tinyshakespeare/input.txt not found; set DATA" >&2; exit 1; }
mkdir -p "$OUT"

echo "== prepare: characters, the whole file as one stream, last 10% as validation" >&2
tfcli prepare --train "$DATA/tinyshakespeare/input.txt" --mono-mode document --tokenizer char --valid-ratio 0.1 \
  -o "$OUT/prep"

echo "== train: $CONFIG" >&2
[ -d "$OUT/run" ] && RESUME=(-o "$OUT/run" --resume) || RESUME=(-o "$OUT/run")
tfcli train "$OUT/prep" "${RESUME[@]}" --config "$CONFIG" --seed "${SEED:-1}" ${TRAIN_ARGS:-} >/dev/null

echo "== eval: validation loss of the best checkpoint, then a sample" >&2
tfcli eval --model "$OUT/run" --data "$OUT/prep" --split valid --json > "$OUT/ppl.json"
tfcli generate -m "$OUT/run" "ROMEO:" --max-new-tokens $SAMPLE --top-k 40 --seed 1 | tee "$OUT/sample.txt"
python3 benchmarks/recipe_results.py record lm "$OUT" --name shakespeare-char --size "$SIZE" --ppl "$OUT/ppl.json" \
  --train-args "${TRAIN_ARGS:-}"
