#!/usr/bin/env bash
# The main job, end to end, on the embedded corpus (data/numbers: English -> French number words, made by
# data/make_numbers.py): prepare -> train -> translate -> eval. Needs no download; a few minutes on a CPU.
# Usage: recipes/demo.sh [OUT_DIR]     (default: demo/)
# Its figures (BLEU, chrF, wall time, machine) are recorded in benchmarks/results/recipes.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-demo}
D=data/numbers
# other work on the machine as the demo starts: the cores it kept busy over a second (as tfcli chooses its threads)
BUSY=$(python3 -c "from tfcli.cli.process import busy_cores; print(f'{busy_cores(1.0):.2f}')" 2>/dev/null || echo "")
mkdir -p "$OUT"

echo "== prepare: clean, train a joint BPE tokenizer, write memory-mapped ids" >&2
tfcli prepare --src $D/train.en --tgt $D/train.fr --valid-src $D/valid.en --valid-tgt $D/valid.fr \
  --test-src $D/test.en --test-tgt $D/test.fr --tokenizer bpe --vocab-size 1000 --joint-vocab -o "$OUT/prep"

echo "== train: a 3+3-layer Transformer (recipes/demo.yaml)" >&2
rm -rf "$OUT/run"  # the demo's own last run: each demo trains afresh
tfcli train "$OUT/prep" -o "$OUT/run" --config recipes/demo.yaml --seed 1 ${DEMO_TRAIN_ARGS:-} >/dev/null

echo "== translate: the 500 test sentences with beam 5, from the averaged checkpoint" >&2
CKPT="$OUT/run/checkpoints/avg-last3"
[ -d "$CKPT" ] || CKPT="$OUT/run"
tfcli translate -m "$CKPT" --beam-size 5 $D/test.en -o "$OUT/test.hyp.fr"

echo "== eval: sacreBLEU and chrF against the references" >&2
tfcli eval "$OUT/test.hyp.fr" -r $D/test.fr --metrics bleu,chrf | tee "$OUT/score.txt"
tfcli eval "$OUT/test.hyp.fr" -r $D/test.fr --metrics bleu,chrf --json > "$OUT/sacrebleu.json"
paste -d'\n' <(head -3 $D/test.en | sed 's/^/src: /') <(head -3 "$OUT/test.hyp.fr" | sed 's/^/hyp: /') \
  <(head -3 $D/test.fr | sed 's/^/ref: /') >&2
# the figures, with the machine and the wall time of all of the above, into benchmarks/results/recipes.{json,md}
python3 benchmarks/recipe_results.py record demo "$OUT" --name demo --size cpu --checkpoint "$CKPT" --wall-s "$SECONDS" \
  ${BUSY:+--busy-cores "$BUSY"} >&2
