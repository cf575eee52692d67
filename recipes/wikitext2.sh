#!/usr/bin/env bash
# WikiText-2 as held-out evaluation: word-level perplexity of a language model on the test set.
# shared/data has WikiText-2 valid and test only (no train), so this recipe trains a small byte-level BPE LM on
# valid (its last 10% held out for early stopping) and scores test; it is an example of `tfcli eval`'s word-level
# perplexity (exp(total NLL / 245,569 words), WikiText's count: whitespace words + one <eos> per line), not a
# WikiText-2 benchmark result, which needs the train split. Any other LM's checkpoint can be scored the same way:
#   tfcli prepare --test $DATA/wikitext-2/test.txt --keep-empty --tokenizer-from LM_RUN -o prep/wt2
#   tfcli eval --model LM_RUN --data prep/wt2 --split test
#
#   recipes/wikitext2.sh [OUT]      OUT defaults to runs/wikitext2-cpu
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/wikitext2-cpu}
DATA=${DATA:-../shared/data}
W=$DATA/wikitext-2
[ -f "$W/valid.txt" ] && [ -f "$W/test.txt" ] || { echo "error: $W/valid.txt or test.txt not found; set DATA" >&2; exit 1; }
mkdir -p "$OUT"

echo "== prepare: byte-level BPE (8000) trained on valid.txt; empty lines kept (each is one </s>)" >&2
tfcli prepare --train "$W/valid.txt" --valid-ratio 0.1 --test "$W/test.txt" --keep-empty --tokenizer bytelevel \
  --vocab-size 8000 -o "$OUT/prep"

echo "== train: recipes/wikitext2-cpu.yaml" >&2
[ -d "$OUT/run" ] && RESUME=(-o "$OUT/run" --resume) || RESUME=(-o "$OUT/run")
tfcli train "$OUT/prep" "${RESUME[@]}" --config recipes/wikitext2-cpu.yaml --seed "${SEED:-1}" >/dev/null

echo "== eval: test perplexity, per token and per word" >&2
tfcli eval --model "$OUT/run" --data "$OUT/prep" --split test
tfcli eval --model "$OUT/run" --data "$OUT/prep" --split test --json > "$OUT/ppl.json"
python3 benchmarks/recipe_results.py record lm "$OUT" --name wikitext2-test --size cpu --ppl "$OUT/ppl.json"
