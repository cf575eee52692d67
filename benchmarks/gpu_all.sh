#!/usr/bin/env bash
# Issue 22's measurements on a GPU, stage by stage, each stage within one 10-minute call of the device tool.
#
#   benchmarks/gpu_all.sh pack                  on this (CPU) machine: put what the device lacks into .gpu/
#                                               (Multi30k and Tiny Shakespeare text, sacremoses wheels for Python
#                                               3.12, 10 MB); then carry [".gpu/data", ".gpu/wheels"] with each call
#   benchmarks/gpu_all.sh [STAGE ...]           on the device (default: every stage, in this order):
#       check        the GPU, the imports, a one-line torch.compile (Inductor) smoke test
#       tests        pytest -m gpu (tests/test_gpu.py): bf16/fp16, compile, resume, decoding on CUDA vs the CPU
#       mfu          benchmarks/gpu_mfu.py: gpt2-small and base, bf16 + --compile (MFU_CASES=base: that case only,
#                    the others kept from the results file; MFU_CASES="base base-dynamic": one static graph per shape
#                    bucket against dynamic-shape graphs the buckets share)
#       de-en en-de  recipes/multi30k.sh SRC TGT full (test2016 read once, at the end)
#       shakespeare  recipes/shakespeare.sh full
#       sweep        benchmarks/ablations.py on recipes/multi30k.yaml (PAIR, default de-en; valid only):
#                    SWEEP="baseline,..." variants, SWEEP_JOBS (4) trained at once on the one GPU, into
#                    results/gpu_ablations.{json,md}
#       decode       benchmarks/gpu_translate_speed.py: tfcli vs HF generate, beam 5 and greedy, batch 64 and 256,
#                    bf16, 20,000 lines of Multi30k train (about 190 s on an H200, estimated from the test2016 speeds
#                    of 2026-11-27; before 2026-11-29 test2016's 1,000 in 80 s), on the de-en model that stage
#                    de-en trained (DECODE_RUN: another de-en run; one HF can represent: no QK-norm), and tfcli with
#                    eager steps (no CUDA graph, the device read every step)
#       lm-decode    benchmarks/gpu_lm_generate_speed.py: tfcli vs HF generate, baby-gpt and gpt2-small shapes,
#                    greedy and top-k sampling, batch 1 and 32, bf16 (random weights: no training needed)
#       opus nllb    benchmarks/translate_speed.py --device cuda: CTranslate2's GPU table's setting (beam 4 and
#                    greedy, length penalty 0, forced length 20) at the OPUS-MT base shape (SiLU, vocabulary 58,000;
#                    OPUS_SENTENCES, default 20,000; batch 32 and 256) and the NLLB-200 600M shape (NLLB_SENTENCES,
#                    default 4,000; batch 32): tfcli bf16 and fp16, CTranslate2 float16 and int8_float16, HF fp16
#                    (on HF_SENTENCES of them, default 2,000: its speed over those), random weights, tfcli's pass
#                    profiled (gpu_translate_speed-NAME_profile.txt); ctranslate2
#                    from the carried wheel, its CUDA 12 libraries from torch's (site-packages/nvidia/*/lib)
#       multi        the six-direction model given the six bilingual budgets together (recipes/multi30k-multi.sh
#                    cpu-long, 6 x MULTI_STEPS steps) against the six bilingual cpu-long-shaped models trained as long
#                    (recipes/multi30k.sh cpu-long, MULTI_STEPS each, default 6,000: the CPU's cpu-long de-en took
#                    6,290 in its 43 minutes; all six at once on the GPU), R-Drop off in both (the multilingual
#                    recipe's choice: a step is then one pass in each), steps not minutes; rows recorded under
#                    multi30k-PAIR-gpu-bilingual and multi30k-multi-gpu-PAIR. MULTI_PART=bilingual or multi: one half
#                    (the whole takes more than one device call: about 5 + 12 minutes on an H100, estimated)
#                Stage times seen on an H100 (2026-11-24): check 39 s on a fresh machine, tests 88 s, shakespeare
#                177 s, mfu about 160 s (gpt2-small) + 300 s (base), de-en 405 s, decode 108 s, en-de about as de-en;
#                on an H200 (2026-11-26): tests 160 s (beside a sweep), sweep 353 s (4 variants), de-en 351 s
#                (60 epochs at 8k tokens), decode 79 s; (2026-11-27) de-en 302 s and en-de 318 s trained at once
#                (100 epochs), decode 78 s, tests 91 s. A session's device time (15 minutes lately) fits two or
#                three calls: run two chains side by side (below) and call again at once while the machine is warm
#                (decode needs de-en's model: the same call, or DECODE_RUN on a warm machine).
#                With BUDGET_S a call's last stage is cut rather than the call lost.
#   BUDGET_S=570 benchmarks/gpu_all.sh ...       stop the stage that runs at 570 s after the start (exit 124) and
#                                               pack what the finished stages wrote: the call still brings it back
#   OUT=A COLLECT=.gpu/ca benchmarks/gpu_all.sh de-en decode & OUT=B COLLECT=.gpu/cb benchmarks/gpu_all.sh tests
#                                               two chains side by side on one GPU (the tests need about 90 s; the
#                                               recipe's epochs do not depend on its speed, only its wall time does)
#   DEVICE=cpu benchmarks/gpu_all.sh check tests mfu de-en
#                                               the same stages at toy sizes on the CPU (a few training steps, a
#                                               few sentences): that each one runs; nothing is recorded
#
# Logs and results go to $OUT (the device tool's folder; default .gpu/out) as two files, since the device tool brings
# back at most 8: OUT/summary.txt, and OUT/gpu-results.tgz holding each stage's STAGE.log and the results files the
# stages wrote (benchmarks/results/gpu_*, recipes.*, the README with its recipe table), to be copied back into the
# repository and committed. The archive is rewritten after each stage, so a call cut off at its time limit still
# brings back what the finished stages measured. A failed stage is logged and the next one runs; the exit code is
# that of the last failure.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$ROOT/.gpu/out}
mkdir -p "$OUT"

pack() {
  local data=${DATA:-../shared/data}
  mkdir -p .gpu/data .gpu/wheels
  cp -r "$data/multi30k" "$data/tinyshakespeare" .gpu/data/
  python3 -m pip download --quiet --dest .gpu/wheels --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 sacremoses
  # CTranslate2 (this checkout's version) for the opus and nllb stages, without its dependencies (numpy, pyyaml:
  # the device has them)
  python3 -m pip download --quiet --dest .gpu/wheels --only-binary=:all: --python-version 3.12 --no-deps \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 "ctranslate2==$(python3 -c 'import ctranslate2; print(ctranslate2.__version__)')"
  du -sh .gpu
  echo "carry [\".gpu/data\", \".gpu/wheels\"] with each device call (the device tool takes at most 64 MiB)"
}
if [ "${1:-}" = pack ]; then pack; exit; fi

# tfcli from this checkout, without installing it (the device has no network and no `datasets`; nothing here
# imports it), and sacremoses from the carried wheels
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
mkdir -p .gpu/bin
printf '#!/bin/sh\nexec python3 -m tfcli "$@"\n' > .gpu/bin/tfcli
chmod +x .gpu/bin/tfcli
export PATH=$ROOT/.gpu/bin:$PATH
# (asked of Python, not the PATH: a warm device machine keeps .gpu/bin from the last call, not its environment)
if ! python3 -c "import sacremoses" 2>/dev/null && [ -d .gpu/wheels ]; then
  [ -d .gpu/site ] || python3 -m pip install --quiet --no-index --find-links .gpu/wheels --target .gpu/site sacremoses
  export PYTHONPATH=$PYTHONPATH:$ROOT/.gpu/site
  python3 -c "import sacremoses" && printf '#!/bin/sh\nexec python3 -m sacremoses "$@"\n' > .gpu/bin/sacremoses && chmod +x .gpu/bin/sacremoses
fi

# The recipes read .gpu/data. On the CPU, a toy copy: the first lines of each file, and training cut to a few steps.
DATA=$ROOT/.gpu/data
if [ "$DEVICE" = cpu ]; then
  TOY=$ROOT/.gpu/toy-data
  mkdir -p "$TOY/multi30k" "$TOY/tinyshakespeare"
  for f in "$DATA"/multi30k/*; do head -n 40 "$f" > "$TOY/multi30k/$(basename "$f")"; done
  head -c 20000 "$DATA/tinyshakespeare/input.txt" > "$TOY/tinyshakespeare/input.txt"
  DATA=$TOY
  export TRAIN_ARGS="--max-steps 4 --valid-every 2 --device cpu" TFCLI_RECIPE_RESULTS=$ROOT/.gpu/toy-results
fi
export DATA

check() {
  nvidia-smi || true
  python3 - <<EOF
import importlib, torch
for m in ("typer", "rich", "tokenizers", "sacrebleu", "safetensors", "yaml", "numpy", "tfcli.cli"):
    mod = importlib.import_module(m)
    print(m, getattr(mod, "__version__", ""))
print("torch", torch.__version__, "CUDA", torch.version.cuda, "device", "$DEVICE",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no GPU)")
x = torch.arange(8.0, device="$DEVICE")
print("torch.compile (Inductor):", torch.compile(lambda t: (t.sin() + 1).sum())(x).item())
EOF
}
tests() { python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py; }
mfu() {
  if [ "$DEVICE" = cpu ]; then python3 benchmarks/gpu_mfu.py --device cpu --quick --work "$ROOT/.gpu/mfu-quick"
  else python3 benchmarks/gpu_mfu.py --work "$ROOT/.gpu/mfu" ${MFU_CASES:+--case $MFU_CASES}; fi
}
multi30k() { recipes/multi30k.sh "$1" "$2" full "$ROOT/.gpu/runs/multi30k-$1-$2-full"; }
shakespeare() { recipes/shakespeare.sh full "$ROOT/.gpu/runs/shakespeare-char-full"; }
sweep() {  # recipe choices for multi30k.yaml on valid (benchmarks/ablations.py), several runs at once on one GPU
  local pair=${PAIR:-de-en} d=$DATA/multi30k extra=(--set train.device=$DEVICE) prep src tgt
  prep=$ROOT/.gpu/runs/sweep-$pair-prep src=${pair%-*} tgt=${pair#*-}
  [ "$DEVICE" = cpu ] && extra+=(--set train.max_steps=4 --set train.max_epochs=0 --set train.valid_every=2
                                 --out "$ROOT/.gpu/toy-results/gpu_ablations")
  [ -d "$prep" ] || tfcli prepare --src "$d/train.$src" --tgt "$d/train.$tgt" --valid-src "$d/valid.$src" \
    --valid-tgt "$d/valid.$tgt" --tokenizer bpe --vocab-size 8000 --joint-vocab -o "$prep"
  python3 benchmarks/ablations.py "$prep" --config recipes/multi30k.yaml --data "$DATA" --pair "$pair" \
    --variants "${SWEEP:-baseline,sep5000,dropout0.4,attn_dropout0.1}" --jobs "${SWEEP_JOBS:-4}" \
    --runs "$ROOT/.gpu/runs/sweep" --out benchmarks/results/gpu_ablations "${extra[@]}"
}
decode() {
  local run=${DECODE_RUN:-$ROOT/.gpu/runs/multi30k-de-en-full/run} ckpt  # DECODE_RUN: another de-en run
  ckpt=$run
  for avg in "$run"/checkpoints/avg-last*; do [ -d "$avg" ] && ckpt=$avg; done  # as the recipe chooses
  if [ "$DEVICE" = cpu ]; then
    python3 benchmarks/gpu_translate_speed.py "$ckpt" --data "$DATA" --device cpu --dtype fp32 --split test2016 \
      --sentences 40 --batch-sizes 8 --out "$ROOT/.gpu/toy-results/gpu_translate_speed"
  else python3 benchmarks/gpu_translate_speed.py "$ckpt" --data "$DATA"; fi
}

lm_decode() {
  if [ "$DEVICE" = cpu ]; then python3 benchmarks/gpu_lm_generate_speed.py --device cpu --dtype fp32 --quick
  else python3 benchmarks/gpu_lm_generate_speed.py; fi
}

with_ct2() {  # ctranslate2 from the carried wheel, and the CUDA 12 libraries torch's wheels installed
  if ! python3 -c "import ctranslate2" 2>/dev/null; then
    python3 -m pip install --quiet --no-index --no-deps --find-links .gpu/wheels --target .gpu/ct2 ctranslate2 || return
    export PYTHONPATH=$PYTHONPATH:$ROOT/.gpu/ct2
  fi
  local nv
  nv=$(python3 -c "import os, torch; print(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), 'nvidia'))")
  for d in "$nv"/*/lib; do [ -d "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; done
  python3 -c "import ctranslate2; print('ctranslate2', ctranslate2.__version__, 'CUDA devices',
ctranslate2.get_cuda_device_count(), 'compute types', ctranslate2.get_supported_compute_types('$DEVICE'))"
  # its wheel loads CUDA 12's cuBLAS (libcublas.so.12) at its first GPU model: torch's cu12x wheels bring it, a
  # cu13x torch does not (and cuBLAS is far past the carry's 64 MiB), so say so before any time is spent
  if [ "$DEVICE" != cpu ] && ! ls "$nv"/*/lib/libcublas.so.12 >/dev/null 2>&1 && ! ldconfig -p | grep -q libcublas.so.12
  then
    echo "no libcublas.so.12 (CUDA 12's cuBLAS) here: CTranslate2 $(python3 -c 'import ctranslate2 as c; print(c.__version__)')" \
      "cannot run on this GPU (torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'))" >&2
    return 3
  fi
}
shape_speed() {  # translate_speed at a shape: NAME SENTENCES BATCH_SIZES ARGS...
  local name=$1 n=$2 sizes=$3
  shift 3
  with_ct2 || return
  if [ "$DEVICE" = cpu ]; then
    python3 benchmarks/translate_speed.py "$@" --sentences 8 --batch-sizes 4 --hf-sentences 4 --repeats 1 --beam 4 \
      --alpha 0 --skip-real --profile --out "$ROOT/.gpu/toy-results/gpu_translate_speed-$name"
  else
    python3 benchmarks/translate_speed.py --device cuda "$@" --sentences "$n" --batch-sizes "$sizes" \
      --hf-sentences "${HF_SENTENCES:-2000}" --repeats 1 --beam 4 --alpha 0 --threads 4 --profile \
      --out "benchmarks/results/gpu_translate_speed-$name"
  fi
}
opus() { shape_speed opus-base "${OPUS_SENTENCES:-20000}" 32,256 --arch base --activation silu --vocab 58000; }
multi() {
  local steps=${MULTI_STEPS:-6000} part=${MULTI_PART:-all} pair rc=0
  [ "$DEVICE" = cpu ] && steps=4
  local args="--set train.max_minutes=0 --set train.rdrop=0 --set train.device=$DEVICE"
  if [ "$part" != multi ]; then
    for pair in de-en en-de de-fr fr-de en-fr fr-en; do
      NAME=multi30k-$pair-gpu-bilingual TRAIN_ARGS="$args --set train.max_steps=$steps ${TRAIN_ARGS:-}" \
        recipes/multi30k.sh "${pair%-*}" "${pair#*-}" cpu-long "$ROOT/.gpu/runs/bilingual-$pair" \
        > "$ROOT/.gpu/runs/bilingual-$pair.log" 2>&1 &
    done
    for pair in de-en en-de de-fr fr-de en-fr fr-en; do wait -n || rc=$?; done
    tail -n 3 "$ROOT"/.gpu/runs/bilingual-*.log
  fi
  if [ "$part" != bilingual ]; then
    NAME=multi30k-multi-gpu MINUTES=0 TRAIN_ARGS="$args --set train.max_steps=$((6 * steps)) ${TRAIN_ARGS:-}" \
      recipes/multi30k-multi.sh cpu-long "$ROOT/.gpu/runs/multi" || rc=$?
  fi
  return $rc
}
nllb() { shape_speed nllb-600m "${NLLB_SENTENCES:-4000}" 32 --shape nllb-600m; }

run_stage() {
  case $1 in
    check) check ;; tests) tests ;; mfu) mfu ;; de-en) multi30k de en ;; en-de) multi30k en de ;;
    shakespeare) shakespeare ;; decode) decode ;; lm-decode) lm_decode ;; sweep) sweep ;; opus) opus ;; nllb) nllb ;;
    multi) multi ;;
    *) echo "unknown stage '$1' (pack, check, tests, mfu, de-en, en-de, shakespeare, decode, lm-decode, sweep, opus," \
         "nllb, multi)" >&2
       return 2 ;;
  esac
}

if [ "${1:-}" = --one ]; then run_stage "$2"; exit; fi  # one stage, in its own process (for `timeout`)

STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(check tests mfu de-en en-de shakespeare decode lm-decode)
COLLECT=${COLLECT:-$ROOT/.gpu/collect}  # its own for each of two calls run side by side
rm -rf "$COLLECT" && mkdir -p "$COLLECT"
export PYTHONUNBUFFERED=1
RC=0
for stage in "${STAGES[@]}"; do
  start=$SECONDS
  if [ "${BUDGET_S:-0}" -gt 0 ]; then  # the stage is stopped at the budget's end, so that what ran comes back
    left=$((BUDGET_S - SECONDS))
    [ $left -gt 0 ] || { echo "$stage: not started, BUDGET_S=$BUDGET_S spent" | tee -a "$OUT/summary.txt"; RC=124; continue; }
    timeout --kill-after=5 "$left" bash "$0" --one "$stage" > "$COLLECT/$stage.log" 2>&1
  else
    bash "$0" --one "$stage" > "$COLLECT/$stage.log" 2>&1
  fi
  rc=$?
  [ $rc -eq 0 ] || RC=$rc
  echo "$stage: exit $rc, $((SECONDS - start)) s ($DEVICE)" | tee -a "$OUT/summary.txt"
  tail -n 5 "$COLLECT/$stage.log"
  for log in .gpu/mfu/run-*/train.log; do [ -f "$log" ] && cp "$log" "$COLLECT/mfu-$(basename "$(dirname "$log")").log"; done
  if [ "$DEVICE" != cpu ]; then  # what the stage measured, to copy back
    for f in benchmarks/results/gpu_*.json benchmarks/results/gpu_*.md benchmarks/results/gpu_*.txt \
      benchmarks/results/recipes.json \
      benchmarks/results/recipes.md README.md; do [ -f "$f" ] && cp "$f" "$COLLECT/"; done
  fi
  tar -czf "$OUT/gpu-results.tgz.tmp" -C "$COLLECT" . && mv "$OUT/gpu-results.tgz.tmp" "$OUT/gpu-results.tgz"
done
exit $RC
