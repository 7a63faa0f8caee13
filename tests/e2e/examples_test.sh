#!/usr/bin/env bash
# Every file of examples/ (one YAML per stage and per parallel layout, the cluster file, the sbatch
# script) through `fabrica train` as a user runs it from the source folder, on the e2e tiny model:
# only model_name_or_path, dataset_dir (../shared's LLaMA-Factory data folder) and max_steps=1
# change, on the command line; output_dir stays the YAML's. Each run must finish and write its
# model (the model folder, the PEFT adapter, the reward model's value head, ppo's critic). The
# cluster file runs with its hosts swapped for two names of this machine; the sbatch script runs
# with an `srun` stand-in that starts its tasks through mpirun (slurm_test.sh and multinode_test.sh
# test a real Slurm and two network hosts). Then `fabrica --help`: its stage list is the Stage
# enum's, its command list is main.cpp's, every example file it names exists, and every example
# line it prints runs as printed (its train lines are the runs above).
# Usage: examples_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
source_dir=$(realpath "$(dirname "$0")/../..")
e2e_begin "$@"
e2e_workdir
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data="$shared/data/llamafactory"
[ -f "$data/dataset_info.json" ] || { echo "SKIP: $data not found"; exit 77; }

# The source folder's layout, as the examples expect it: examples/ (relative paths inside the YAMLs),
# models/Qwen3-0.6B (the help's examples) and data/.
ln -s "$source_dir/examples" examples
tiny_model model
mkdir models && ln -s ../model models/Qwen3-0.6B
ln -s "$data" data

# The cluster file with its hosts swapped for two names of this machine, one slot each, over lo.
sed -e 's/name: node1, slots: [0-9]*/name: localhost, slots: 1/' -e 's/name: node2, slots: [0-9]*/name: 127.0.0.1, slots: 1/' \
    -e 's/^iface: [^ ]*/iface: lo/' examples/parallel/cluster.yaml >local-cluster.yaml
grep -q "name: 127.0.0.1" local-cluster.yaml || fail "examples/parallel/cluster.yaml: hosts node1, node2 not found"

# output_dir KEY FILE: the YAML's value of KEY.
yaml_value() { sed -n "s/^$1: *\([^ #]*\).*/\1/p" "$2" | head -1; }

# expect_model YAML OUTPUT_DIR: the files the run must leave, from its stage and finetuning_type.
expect_model() {
  local stage finetuning files
  stage=$(yaml_value stage "$1")
  finetuning=$(yaml_value finetuning_type "$1")
  case "$finetuning" in
    lora) files="adapter_model.safetensors adapter_config.json" ;;
    full|freeze) files="model.safetensors config.json" ;;
    *) fail "$1: finetuning_type '$finetuning'" ;;
  esac
  [ "$stage" = rm ] && files="$files value_head.safetensors"
  [ "$stage" = ppo ] && files="$files critic/value_head.safetensors"
  for f in $files tokenizer.json; do [ -s "$2/$f" ] || fail "$1: no $f in $2"; done
  echo "$files"
}

# run_example NAME LOG COMMAND...: runs it, checks step 1 and the model of YAML, times it.
overrides=(model_name_or_path=model "dataset_dir=$data" max_steps=1)
ran=()
run_example() {
  local yaml=$1 log=$2; shift 2
  local start=$SECONDS
  "$@" >"$log" 2>&1 || { tail -20 "$log"; fail "$yaml did not finish"; }
  grep -q "^step 1/1 " "$log" || { tail -20 "$log"; fail "$yaml: no step 1"; }
  local files
  files=$(expect_model "$yaml" "$(yaml_value output_dir "$yaml")")
  ran+=("$yaml")
  echo "ok: $yaml ($((SECONDS - start)) s, wrote $files)"
}

for yaml in examples/*/*.yaml; do
  [ "$yaml" = examples/parallel/cluster.yaml ] && continue
  name=$(basename "$yaml" .yaml)
  extra=()
  [ -n "$(yaml_value cluster "$yaml")" ] && extra=(cluster=local-cluster.yaml)
  run_example "$yaml" "$name.log" "$fabrica" train "$yaml" "${overrides[@]}" "${extra[@]}"
  case "$name" in
    *multinode*) grep -q "launching 2 workers" "$name.log" || fail "$name: not 2 workers from the cluster file" ;;
    *_ds_z3*|*_tp_sp|*_pp|*_auto) grep -q "x 2 processes" "$name.log" || fail "$name: not 2 processes" ;;
  esac
done
grep -q "zero_stage 3" qwen3_full_sft_ds_z3.log || fail "ds_z3: not at ZeRO-3"
grep -q "tensor_parallel_size 2" qwen3_full_sft_tp_sp.log || fail "tp_sp: not tensor parallel 2"

# The sbatch script with an srun that starts its tasks through mpirun (--mpi=pmix dropped).
mkdir bin && ln -s "$fabrica" bin/fabrica
cat >bin/srun <<'SH'
#!/bin/sh
[ "${1#--mpi=}" != "$1" ] && shift
exec mpirun --oversubscribe --bind-to none -np "$SLURM_NTASKS" "$@"
SH
chmod +x bin/srun
sbatch_yaml=$(sed -n 's/.*fabrica train \(examples\/[^ ]*\.yaml\).*/\1/p' examples/parallel/qwen3_full_sft.sbatch)
sbatch_dir=$(sed -n 's/^output_dir=//p' examples/parallel/qwen3_full_sft.sbatch)
grep -q "^#SBATCH --ntasks-per-node=" examples/parallel/qwen3_full_sft.sbatch || fail "sbatch: no #SBATCH lines"
start=$SECONDS
PATH="$work/bin:$PATH" SLURM_NTASKS=2 bash examples/parallel/qwen3_full_sft.sbatch "${overrides[@]}" >sbatch.log 2>&1 \
  || { tail -20 sbatch.log; fail "the sbatch script"; }
grep -q "x 2 processes" sbatch.log && [ -s "$sbatch_dir/model.safetensors" ] || { tail -20 sbatch.log; fail "sbatch: no 2-task run"; }
echo "ok: examples/parallel/qwen3_full_sft.sbatch ($((SECONDS - start)) s, 2 tasks, $sbatch_yaml into $sbatch_dir)"

# Every file of examples/ was run.
for f in examples/*/*; do
  case "$f" in
    *.yaml) [ "$f" = examples/parallel/cluster.yaml ] || [[ " ${ran[*]} " == *" $f "* ]] || fail "$f was not run" ;;
    *.sbatch|*.json|*.jsonl) ;;
    *) fail "$f: a file the test does not know" ;;
  esac
done
echo "ok: ${#ran[@]} YAMLs, the cluster file and the sbatch script"

# fabrica --help: the stages are the Stage enum's, the commands main.cpp's.
"$fabrica" --help >help.txt
enum=$(sed -n 's/.*enum class Stage *{\(.*\)}.*/\1/p' "$source_dir/src/config/stage.h" | tr -d ' ')
[ -n "$enum" ] || fail "no Stage enum in src/config/stage.h"
listed=$(grep -A1 "stages:" help.txt | tail -1 | tr -d ' ')
[ "$listed" = "$enum" ] || fail "fabrica --help lists stages '$listed', the Stage enum has '$enum'"
"$fabrica" train --help | grep -q "stages $(echo "$enum" | sed 's/,/, /g');" || fail "train --help: not every stage"
for command in $(grep -o 'command == "[a-z-]*"' "$source_dir/src/main.cpp" | cut -d'"' -f2); do
  grep -q "^  $command " help.txt || fail "fabrica --help does not list the command $command"
done
echo "ok: fabrica --help lists the stages $enum and every command of main.cpp"

# Every example line of the help runs as printed, in this source-folder layout.
mapfile -t lines < <(sed -n '/^examples/,$p' help.txt | grep '^  ' | sed 's/^  //')
[ "${#lines[@]}" -ge 3 ] || fail "fabrica --help prints no examples"
for line in "${lines[@]}"; do
  for f in $(grep -o 'examples/[^ ]*\.yaml' <<<"$line"); do
    [ -f "$f" ] || fail "fabrica --help names $f, which does not exist"
  done
  if [[ "$line" == "fabrica train "* ]]; then  # the loop above ran it (models/Qwen3-0.6B and data/ are what it swapped in)
    [[ "$line" =~ ^fabrica\ train\ (examples/[^ ]*\.yaml)$ ]] && [[ " ${ran[*]} " == *" ${BASH_REMATCH[1]} "* ]] \
      || fail "fabrica --help's example is not one of the examples run above: $line"
    echo "ok: $line (run above)"
    continue
  fi
  rc=0
  (PATH="$work/bin:$PATH"; eval "$line") </dev/null >line.log 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { tail -5 line.log; fail "fabrica --help's example exits $rc: $line"; }
  echo "ok: $line"
done
echo "examples: all checks passed"
