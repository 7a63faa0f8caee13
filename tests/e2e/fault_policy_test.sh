#!/usr/bin/env bash
# What a run does when its numbers blow up, and when time passes without a save:
#  - nan_policy stop (the default): learning_rate 1e15 makes the loss non-finite (weights of ~1e15
#    overflow the forward; at 1e6 it stays finite, as PyTorch's does); the run exits with code 2
#    at that step, naming it and the rank, and saves nothing: the last checkpoint and the model in
#    the output folder stay byte for byte as they were.
#  - nan_policy skip: each non-finite step is skipped and counted in metrics.jsonl (skipped_steps)
#    until more than max_skipped_steps were, then the run stops.
#  - save_every_minutes: a checkpoint at the end of each step once that much time has passed.
# Usage: fault_policy_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 32
max_steps: 4
save_steps: 2
YAML
"$fabrica" train run.yaml output_dir=out >good.log 2>&1 || { tail -20 good.log; fail "the good run"; }
# The checkpoints and the model (metrics.jsonl and train_config.yaml are the resumed run's own).
sums() { (cd out && find . -type f ! -name '*.log' ! -name metrics.jsonl ! -name train_config.yaml | sort | xargs sha256sum); }
before=$(sums)

blow_up="max_steps=10 resume_from_checkpoint=true learning_rate=1e15 lr_scheduler_type=constant"
rc=0
"$fabrica" train run.yaml output_dir=out $blow_up >stop.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { tail -20 stop.log; fail "nan_policy stop: exit $rc, expected 2"; }
grep -q "step 4: the loss is not finite on rank 0: stopping, saving nothing new (nan_policy: stop); the last checkpoint is out/checkpoint-2" stop.log \
  || { tail -5 stop.log; fail "nan_policy stop: no message naming the step, the rank and the kept checkpoint"; }
[ "$(sums)" = "$before" ] || fail "nan_policy stop: the output folder changed"
echo "ok: nan_policy stop: exit 2 at step 4, naming rank 0; the output folder and checkpoint-2 unchanged"

rc=0
"$fabrica" train run.yaml output_dir=out $blow_up nan_policy=skip max_skipped_steps=2 >skip.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { tail -20 skip.log; fail "nan_policy skip: exit $rc, expected 2"; }
grep -q "optimizer step skipped (nan_policy: skip, 2 of at most 2)" skip.log || { tail -8 skip.log; fail "no skip lines"; }
grep -q "step 6: the loss is not finite on rank 0: 3 optimizer steps skipped, more than max_skipped_steps 2" skip.log \
  || { tail -5 skip.log; fail "nan_policy skip: no stop after max_skipped_steps"; }
python3 - out/metrics.jsonl <<'PY' || fail "nan_policy skip: metrics.jsonl"
import json, sys
rows = {j["step"]: j for j in map(json.loads, open(sys.argv[1]))}
assert rows[3]["skipped_steps"] == 0 and rows[3]["loss"] is not None, rows[3]
assert rows[4]["skipped_steps"] == 1 and rows[4]["loss"] is None and rows[4]["grad_norm"] is None, rows[4]
assert rows[5]["skipped_steps"] == 2, rows[5]
assert 6 not in rows
PY
echo "ok: nan_policy skip: steps 4 and 5 skipped and counted, stopped at step 6"

"$fabrica" train run.yaml output_dir=timed save_steps=0 save_every_minutes=0.0001 >timed.log 2>&1 \
  || { tail -20 timed.log; fail "save_every_minutes run"; }
for s in 2 3; do [ -f timed/checkpoint-$s/trainer_state.json ] || fail "save_every_minutes: no checkpoint-$s"; done
echo "ok: save_every_minutes: a checkpoint after each step once the time passed (steps 2 and 3; step 4 is the final model)"
