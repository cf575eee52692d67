#!/usr/bin/env bash
# Adapting a trained de->en model to another domain: Multi30k (Flickr photo captions) -> Tatoeba (everyday
# sentences), by full fine-tuning and by LoRA, each on Tatoeba alone and with Multi30k replayed beside it
# (`prepare --corpus`, weight 1:1). What each gains on Tatoeba's test set and loses on Multi30k's test2016, in how
# much time and memory.
#
#   recipes/adapt.sh BASE [OUT]      e.g. recipes/adapt.sh runs/multi30k-de-en-cpu/run/checkpoints/BEST
#
# BASE: a de->en checkpoint (recipes/multi30k.sh de en cpu makes one), first exported to transformers and imported
# back, as a published model comes (ROUNDTRIP=0: used as it is; a model transformers cannot hold, such as one with
# QK-norm, needs it). Every run trains STEPS steps (default
# 600) of at most 1,500 tokens with a constant learning rate after 50 warmup steps (full: 5e-4; LoRA: rank 16 on
# every linear layer, 3e-3), validating both domains every 100 steps; its last checkpoint is scored, so that no run
# chooses on either valid set. Each model translates both test sets with beam 5 and length penalty 1.0. Figures:
# benchmarks/results/adapt_tatoeba.{json,md} (the CPU named). The data comes from $DATA (default ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: recipes/adapt.sh BASE_CHECKPOINT [OUT]}
OUT=${2:-runs/adapt-tatoeba-de-en}
DATA=${DATA:-../shared/data}
STEPS=${STEPS:-600}
T=$DATA/tatoeba M=$DATA/multi30k
mkdir -p "$OUT"
TRAINED=$BASE
if [ "${ROUNDTRIP:-1}" = 1 ]; then
  if [ ! -d "$OUT/base-imported" ]; then
    tfcli export "$BASE" --to hf -o "$OUT/base-hf" -q
    python3 - "$OUT/base-hf/config.json" <<'PY'  # (what a published model's config holds: no tfcli entry)
import json, sys
config = json.load(open(sys.argv[1]))
config.pop("tfcli_model", None)
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
    tfcli import "$OUT/base-hf" -o "$OUT/base-imported" -q
  fi
  BASE=$OUT/base-imported
fi
valid=(--valid-corpus "tatoeba=$T/valid.de,$T/valid.en" --valid-corpus "multi30k=$M/valid.de,$M/valid.en")
tfcli prepare --corpus "tatoeba=$T/train.de,$T/train.en" "${valid[@]}" --tokenizer-from "$BASE" -o "$OUT/prep-new" -q
tfcli prepare --corpus "tatoeba=$T/train.de,$T/train.en" --corpus "multi30k=$M/train.de,$M/train.en" "${valid[@]}" \
  --tokenizer-from "$BASE" -o "$OUT/prep-replay" -q

score() {  # MODEL NAME: both test sets, beam 5, into OUT/NAME.{tatoeba,multi30k}.bleu
  tfcli translate -m "$1" --beam-size 5 --len-penalty 1.0 "$T/test.de" -o "$OUT/$2.tatoeba.en" -q
  tfcli translate -m "$1" --beam-size 5 --len-penalty 1.0 "$M/test2016.de" -o "$OUT/$2.multi30k.en" -q
  tfcli eval "$OUT/$2.tatoeba.en" -r "$T/test.en" --metrics bleu --score-only > "$OUT/$2.tatoeba.bleu"
  tfcli eval "$OUT/$2.multi30k.en" -r "$M/test2016.en" --metrics bleu --score-only > "$OUT/$2.multi30k.bleu"
}
[ -f "$OUT/base.multi30k.bleu" ] || score "$BASE" base
for how in full lora; do
  for data in new replay; do
    run=$OUT/$how-$data
    if [ ! -f "$run.multi30k.bleu" ]; then
      [ "$how" = lora ] && extra=(--lora-rank 16 --lr 3e-3) || extra=(--lr 5e-4)
      echo "== $how, $data: training $STEPS steps" >&2
      /usr/bin/time -f "%e %M" -o "$run.time" tfcli train "$OUT/prep-$data" -o "$run" --init-from "$BASE" \
        "${extra[@]}" --max-steps "$STEPS" --max-epochs 0 --max-tokens 1500 --warmup 50 --schedule constant \
        --valid-every 100 --set train.bleu_max_sentences=300 --label-smoothing 0.1 --keep-last 1 --seed 1 -q >/dev/null
      score "$run/checkpoints/$(cat "$run/checkpoints/LATEST")" "$how-$data"
    fi
  done
done
python3 - "$OUT" "$TRAINED" "$STEPS" "$BASE" <<'EOF'
import json, os, platform, sys, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
from common import cpu_name, portable, write_results

out, base, steps, used = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
how_base = " (exported to transformers and imported back: the model adapted)" if used != base else ""
bleu = lambda name, test: float((out / f"{name}.{test}.bleu").read_text())
rows, start = {}, {t: bleu("base", t) for t in ("tatoeba", "multi30k")}
for how in ("full", "lora"):
    for data in ("new", "replay"):
        name = f"{how}-{data}"
        seconds, kib = (out / f"{name}.time").read_text().split()[-2:]
        valid = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines() if '"valid"' in l]
        rows[name] = {"tatoeba": bleu(name, "tatoeba"), "multi30k": bleu(name, "multi30k"),
                      "train_s": float(seconds), "peak_rss": int(kib) * 1024,
                      "valid": [{"step": v["step"], **{d: round(m["bleu"], 2) for d, m in v["directions"].items()}}
                                for v in valid]}
res = {"cpu": cpu_name(), "threads": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "base": base,
       "roundtrip": used != base, "steps": steps, "base_bleu": start, "runs": rows}
label = {"full-new": "full fine-tuning", "full-replay": "full fine-tuning + Multi30k replay",
         "lora-new": "LoRA r16", "lora-replay": "LoRA r16 + Multi30k replay"}
md = ["# Adapting a Multi30k de->en model to Tatoeba", "",
      f"`recipes/adapt.sh` ({res['cpu']}, {res['threads']} threads, {res['date']}): the base `{portable(base)}`"
      f"{how_base}, "
      f"{steps} steps each, the last checkpoint scored; sacreBLEU (13a, cased), beam 5, length penalty 1.0.", "",
      "| model | Tatoeba test | gain | Multi30k test2016 | change | training | peak RSS |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
      f"| base | {start['tatoeba']:.2f} | | {start['multi30k']:.2f} | | | |"]
for name, r in rows.items():
    md.append(f"| {label[name]} | {r['tatoeba']:.2f} | {r['tatoeba'] - start['tatoeba']:+.2f} | {r['multi30k']:.2f} "
              f"| {r['multi30k'] - start['multi30k']:+.2f} | {r['train_s'] / 60:.1f} min | "
              f"{r['peak_rss'] / 2**20:.0f} MiB |")
write_results(Path("benchmarks/results/adapt_tatoeba"), res, "\n".join(md) + "\n")
EOF
