#!/usr/bin/env bash
# Sequence-level knowledge distillation (Kim & Rush 2016) on Multi30k, the way Marian's and Bergamot's fast students
# are made: a teacher translates the training source with beam search, and a student trains on its translations.
#
#   recipes/distill.sh SRC TGT [SIZE] [OUT]        e.g. recipes/distill.sh de en cpu-long
#
# 1. The teacher: recipes/multi30k.sh SRC TGT SIZE OUT/teacher (skipped when OUT/teacher has its result). TEACHERS
#    ("RUN_OR_CKPT ...", quoted, sharing one vocabulary) decodes those instead, as an ensemble.
# 2. The training source translated by the teacher(s): beam 5, the teacher's length penalty (chosen on valid; 1.0 for
#    TEACHERS); TEACHER_DTYPE=int8 decodes in int8. Kept in OUT for the next student (remove it after changing
#    TEACHERS or TEACHER_DTYPE).
# 3. The student: recipes/multi30k.sh on those translations (valid and test keep the real references), with STUDENT's
#    config (default recipes/multi30k-student.yaml, 4+1 layers: the teacher's width, one decoder layer; STUDENT=teacher:
#    the teacher's own config, a student of its size); ORIGINAL=1 trains on the original pairs beside the distilled
#    ones. Its figures are recorded as multi30k-distill[-teacher-size][-orig]-SRC-TGT in benchmarks/results/recipes.*.
# 4. Speed: benchmarks/distill_speed.py, the teacher and the student side by side in one run (sentences/s, beam 5
#    and greedy, fp32 and int8, batch 64, and CTranslate2 int8 of the teacher where it exports); then the run is
#    recorded as one entry (benchmarks/recipe_results.py distill: the table in docs/recipes.md), with its whole time
#    (a resumed run's counts from its restart; a teacher found in OUT/teacher adds the time its recipe recorded).
# Other variables pass on to recipes/multi30k.sh (DATA, SEED, VOCAB, BPE, TRAIN_ARGS for both runs).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:?usage: recipes/distill.sh SRC TGT [cpu|cpu-long|full] [OUT]}
TGT=${2:?usage: recipes/distill.sh SRC TGT [cpu|cpu-long|full] [OUT]}
SIZE=${3:-cpu-long}
OUT=${4:-runs/distill-$SRC-$TGT-$SIZE}
DATA=${DATA:-../shared/data}
D=$DATA/multi30k
case ${STUDENT:-student} in
  student) STUDENT_CONFIG=recipes/multi30k-student.yaml TAG="" ;;
  teacher) STUDENT_CONFIG="" TAG="-teacher-size" ;;
  *) echo "error: STUDENT must be student or teacher, got '$STUDENT'" >&2; exit 2 ;; esac
[ "${ORIGINAL:-0}" = 1 ] && TAG="$TAG-orig"
[ -f "$D/train.$SRC" ] && [ -f "$D/train.$TGT" ] || { echo "error: $D/train.$SRC or $D/train.$TGT not found; set DATA" >&2; exit 1; }
mkdir -p "$OUT"

if [ -n "${TEACHERS:-}" ]; then
  MODELS=() && for t in $TEACHERS; do MODELS+=(-m "$t"); done
  ALPHA=1.0
else
  TEACHER_TRAINED=0
  if [ ! -f "$OUT/teacher/result.json" ]; then
    TEACHER_TRAINED=1
    echo "== teacher: recipes/multi30k.sh $SRC $TGT $SIZE" >&2
    recipes/multi30k.sh "$SRC" "$TGT" "$SIZE" "$OUT/teacher"
  fi
  CKPT="$OUT/teacher/run"
  for avg in "$OUT"/teacher/run/checkpoints/avg-last*; do [ -d "$avg" ] && CKPT=$avg; done
  MODELS=(-m "$CKPT")
  ALPHA=$(cat "$OUT/teacher/len_penalty.txt")
fi

# (an interrupted run resumes: translate --resume keeps the parts it finished, and a finished file, written
# atomically, is kept: another student of the same teacher trains on it)
if [ ! -f "$OUT/train.distilled.$TGT" ]; then
  echo "== distil: train.$SRC translated by the teacher (beam 5, length penalty $ALPHA)" >&2
  tfcli translate "${MODELS[@]}" --beam-size 5 --len-penalty "$ALPHA" --dtype "${TEACHER_DTYPE:-fp32}" --resume \
    "$D/train.$SRC" -o "$OUT/train.distilled.$TGT"
fi

echo "== student: ${STUDENT_CONFIG:-the config of the teacher} on the distilled pairs" >&2
DISTILLED="$OUT/train.distilled.$TGT" CONFIG="$STUDENT_CONFIG" NAME="multi30k-distill$TAG-$SRC-$TGT" \
  recipes/multi30k.sh "$SRC" "$TGT" "$SIZE" "$OUT/student$TAG"

if [ -z "${TEACHERS:-}" ]; then
  echo "== speed: teacher and student, side by side" >&2
  STUDENT_CKPT="$OUT/student$TAG/run"
  for avg in "$OUT/student$TAG"/run/checkpoints/avg-last*; do [ -d "$avg" ] && STUDENT_CKPT=$avg; done
  SPEED=${SPEED_OUT:-benchmarks/results/distill_speed-$SRC-$TGT$TAG}
  python3 benchmarks/distill_speed.py "$CKPT" "$STUDENT_CKPT" --pair "$SRC-$TGT" --data "$DATA" --out "$SPEED"
  echo "== record: the teacher against the student (benchmarks/results/recipes.*, docs/recipes.md)" >&2
  python3 benchmarks/recipe_results.py distill "$OUT" --pair "$SRC-$TGT" --tag="$TAG" --speed "$SPEED.json" \
    --size "$SIZE${TRAIN_ARGS:+ ($TRAIN_ARGS)}" --wall-s "$SECONDS" \
    $([ "$TEACHER_TRAINED" = 1 ] || echo --add-teacher-time)
fi
