#!/usr/bin/env bash
# A vision-language model trained through the `fabrica` command on LLaMA-Factory's mllm_demo: a
# tiny qwen2_vl folder (config.json only, random initialisation; the real Qwen tokenizer, whose
# vision tokens are Qwen2-VL's) trained with the qwen2_vl template, the loss finite and falling,
# the saved folder reloaded by `fabrica generate` (text, and with an image through --image, a
# --prompts line's "images" and chat's /image) and trained on; freeze_vision_tower:
# false changes the tower's weights, the default leaves them as they were; LoRA on the tower and
# the language model, merged by export; neat_packing equal to unpacked. The refusals: an image
# token in text without images, a preprocessor_config.json whose patches are not the tower's.
# Usage: vlm_train_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir

tiny_vlm_model model
# One batch of all 6 samples (8 images): every step sees the same data, so the loss must fall.
{ mllm_config; printf 'per_device_train_batch_size: 6\nlearning_rate: 1.0e-3\nlogging_steps: 1\nmax_steps: 3\n'; } > run.yaml

"$fabrica" train run.yaml >train.log 2>&1 || { cat train.log; fail "train"; }
grep -q "6 train samples, 0 eval samples, 1025 tokens, 8 images" train.log || { cat train.log; fail "data counts"; }
python3 - out/metrics.jsonl <<'PY' || fail "losses"
import json, math, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1])]
print("  losses", " ".join(f"{x:.4f}" for x in losses))
assert len(losses) == 3 and all(math.isfinite(x) for x in losses), losses
assert all(b < a for a, b in zip(losses, losses[1:])), "not falling"
PY
echo "ok: trained: $(grep '^finetuning' train.log)"

# neat_packing packs the 6 samples into one row of 1025 tokens, each sample attending to itself with
# its M-RoPE positions counted from 0 as alone: the first step's loss is the unpacked one's.
"$fabrica" train run.yaml output_dir=neat neat_packing=true max_steps=1 >neat.log 2>&1 || { cat neat.log; fail "neat_packing"; }
grep -q "1 train sequences packed from 6 samples" neat.log || { cat neat.log; fail "neat_packing counts"; }
"$fabrica" train run.yaml output_dir=packed packing=true max_steps=1 >packed.log 2>&1 || { cat packed.log; fail "packing"; }
python3 - out/metrics.jsonl neat/metrics.jsonl packed/metrics.jsonl <<'PY' || fail "packed losses"
import json, math, sys
first = [json.loads(open(p).readline())["loss"] for p in sys.argv[1:]]
print("  step 1 loss: unpacked %.6f, neat_packing %.6f, packing %.6f" % tuple(first))
assert abs(first[1] - first[0]) < 1e-5 * first[0], first
assert math.isfinite(first[2]), first
PY
echo "ok: neat_packing with images = unpacked; packing runs"

# Tensor parallel 2: the language model sliced, the tower whole on both workers (frozen by default,
# then trained): the one-process steps.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$fabrica" train run.yaml output_dir=tp2 nproc_per_node=2 tensor_parallel_size=2 >tp2.log 2>&1 \
  || { cat tp2.log; fail "tensor parallel 2"; }
same_losses out tp2
tower="freeze_vision_tower=false freeze_multi_modal_projector=false max_steps=2"
"$fabrica" train run.yaml output_dir=tower1 $tower >tower1.log 2>&1 || { cat tower1.log; fail "tower trained"; }
"$fabrica" train run.yaml output_dir=tower2 $tower nproc_per_node=2 tensor_parallel_size=2 >tower2.log 2>&1 \
  || { cat tower2.log; fail "tensor parallel 2, tower trained"; }
same_losses tower1 tower2
python3 - out/model.safetensors tp2/model.safetensors <<'PY' || fail "the tp output folder's tower"
import json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
one, tp = tensors(sys.argv[1]), tensors(sys.argv[2])
assert one.keys() == tp.keys(), set(one) ^ set(tp)
tower = [k for k in one if "visual" in k]
assert tower and all(one[k] == tp[k] for k in tower), "the frozen tower differs"
PY
echo "ok: tensor parallel 2 = one process (tower frozen, and trained); the output holds the whole tower"

"$fabrica" generate --model out --template qwen2_vl --prompt "Who are you?" --max-new-tokens 4 >generate.log 2>&1 \
  || { cat generate.log; fail "generate on the trained folder"; }
echo "ok: generate on out/"

# With an image (mllm_demo's 1.jpg, 300 x 168: transformers' processor gives it a 1 x 12 x 22 grid,
# 66 merged tokens): --prompt --image, a --prompts line with "images" beside a text line, and
# chat's /image give the same greedy reply; the image line's prompt is 66 + 2 tokens longer.
image="$shared/data/llamafactory/mllm_demo_data/1.jpg"
"$fabrica" generate --model out --template qwen2_vl --image "$image" --prompt "Who are they?" --max-new-tokens 4 \
  >gen-image.log 2>&1 || { cat gen-image.log; fail "generate --image"; }
printf '{"prompt": "Who are they?", "images": ["%s"]}\n{"prompt": "Who are they?"}\n' "$image" >prompts.jsonl
"$fabrica" generate --model out --template qwen2_vl --prompts prompts.jsonl --output gen.jsonl --max-new-tokens 4 \
  >gen-batch.log 2>&1 || { cat gen-batch.log; fail "generate --prompts with images"; }
printf '/image %s\nWho are they?\n' "$image" | "$fabrica" chat --model out --template qwen2_vl --max-new-tokens 4 \
  >chat.log 2>&1 || { cat chat.log; fail "chat with /image"; }
# --image-max-pixels 12544 (LLaMA-Factory's image_max_pixels, 112 x 112) pre-resizes it smaller: fewer tokens.
"$fabrica" generate --model out --template qwen2_vl --prompts prompts.jsonl --output small.jsonl --max-new-tokens 4 \
  --image-max-pixels 12544 >gen-small.log 2>&1 || { cat gen-small.log; fail "generate --image-max-pixels"; }
python3 - gen.jsonl gen-image.log chat.log small.jsonl <<'PY' || fail "generation with an image"
import json, sys
image, text = [json.loads(l) for l in open(sys.argv[1])]
small = json.loads(open(sys.argv[4]).readline())
assert text["prompt_tokens"] + 2 < small["prompt_tokens"] < image["prompt_tokens"], (small, image)
assert image["prompt_tokens"] == text["prompt_tokens"] + 68, (image["prompt_tokens"], text["prompt_tokens"])
single = open(sys.argv[2]).read()
assert single == image["response"] + "\n", (single, image["response"])
chat = open(sys.argv[3]).read()
assert chat.startswith("user> user> assistant> " + image["response"] + "\n"), chat
PY
# generate_refused NAME MESSAGE [flags ...]: `fabrica generate --model out` exits 2 naming MESSAGE.
generate_refused() {
  local name=$1 message=$2 rc=0
  shift 2
  "$fabrica" generate --model out "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -- "$message" "$name.log" || { cat "$name.log"; fail "$name: exit $rc"; }
  echo "ok: refused: $(tail -1 "$name.log")"
}
generate_refused no-template "images need --template" --image "$image" --prompt "Who?"
generate_refused two-placeholders "2 <image> placeholder(s) in the messages but 1 image(s)" \
  --template qwen2_vl --image "$image" --prompt "<image><image>Who?"
generate_refused missing-image "nothere.jpg" --template qwen2_vl --image nothere.jpg --prompt "Who?"
generate_refused pixel-bounds "image-min-pixels" --template qwen2_vl --image "$image" --prompt "Who?" \
  --image-max-pixels 1000 --image-min-pixels 2000
generate_refused text-template "template qwen takes no images" --template qwen --image "$image" --prompt "Who?"
echo "ok: generate and chat with an image"

# From the trained folder: one step with the tower trainable, one with the default freezing.
"$fabrica" train run.yaml model_name_or_path=out max_steps=1 freeze_vision_tower=false output_dir=tower \
  >tower.log 2>&1 || { cat tower.log; fail "train with freeze_vision_tower: false"; }
"$fabrica" train run.yaml model_name_or_path=out max_steps=1 output_dir=frozen >frozen.log 2>&1 \
  || { cat frozen.log; fail "train with the default freezing"; }
# changed BEFORE AFTER PREFIX: which tensors whose names start with PREFIX differ, "all" or "none".
changed() {
  python3 - "$@" <<'PY'
import json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
before, after = tensors(sys.argv[1] + "/model.safetensors"), tensors(sys.argv[2] + "/model.safetensors")
names = [k for k in before if k.startswith(sys.argv[3])]
assert names and sorted(names) == sorted(k for k in after if k.startswith(sys.argv[3])), names
diff = sum(before[k] != after[k] for k in names)
print("all" if diff == len(names) else "none" if diff == 0 else f"{diff} of {len(names)}")
PY
}
tower="model.visual.blocks. model.visual.patch_embed."
for prefix in $tower; do
  [ "$(changed out tower "$prefix")" = all ] || fail "freeze_vision_tower: false left $prefix unchanged"
  [ "$(changed out frozen "$prefix")" = none ] || fail "the default freezing changed $prefix"
done
[ "$(changed out tower model.visual.merger.)" = none ] || fail "freeze_multi_modal_projector changed the merger"
[ "$(changed out frozen model.language_model.layers.)" = all ] || fail "the language model did not train"
echo "ok: the tower trains with freeze_vision_tower: false and stays frozen by default"

# LoRA with the tower unfrozen (LLaMA-Factory's lora_target all): adapters on the language model's
# projections and the tower blocks' linears, none on the merger or the patch embedding; the
# export merges them and keeps preprocessor_config.json and the chat template.
"$fabrica" train run.yaml model_name_or_path=out max_steps=1 finetuning_type=lora freeze_vision_tower=false \
  output_dir=lora >lora.log 2>&1 || { cat lora.log; fail "train with finetuning_type: lora"; }
python3 - lora/adapter_model.safetensors <<'PY' || fail "adapter tensors"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    names = json.loads(f.read(struct.unpack("<Q", f.read(8))[0])).keys()
parts = {p: sum(n.startswith("base_model.model.model." + p) for n in names)
         for p in ["language_model.layers.", "visual.blocks.", "visual.merger.", "visual.patch_embed."]}
print("  adapter tensors", parts)
assert parts["language_model.layers."] and parts["visual.blocks."], parts
assert not parts["visual.merger."] and not parts["visual.patch_embed."], parts
PY
"$fabrica" export --checkpoint lora --output lora-merged >export.log 2>&1 || { cat export.log; fail "export lora"; }
[ -f lora-merged/model.safetensors ] && [ -f lora-merged/preprocessor_config.json ] \
  && grep -q chat_template lora-merged/tokenizer_config.json || fail "export dropped preprocessor_config.json or chat_template"
"$fabrica" generate --model lora-merged --template qwen2_vl --prompt "Who are you?" --max-new-tokens 2 >lora-gen.log 2>&1 \
  || { cat lora-gen.log; fail "generate on the merged folder"; }
echo "ok: LoRA on the tower and language model, merged by export with preprocessor_config.json"

# refused RUN_NAME MESSAGE [key=value ...]: exit 2 naming MESSAGE, nothing written.
refused() {
  local name=$1 message=$2 rc=0
  shift 2
  "$fabrica" train run.yaml output_dir="$name" "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -q -- "$message" "$name.log" || { cat "$name.log"; fail "$name: exit $rc"; }
  [ ! -e "$name" ] || fail "$name: wrote $name/"
  echo "ok: refused: $(tail -1 "$name.log")"
}
mkdir text
cat > text/dataset_info.json <<'JSON'
{"t": {"file_name": "t.json", "formatting": "sharegpt", "columns": {"messages": "messages"},
 "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}
JSON
echo '[{"messages": [{"role": "user", "content": "<|image_pad|>what is it?"}, {"role": "assistant", "content": "a cat"}]}]' \
  > text/t.json
refused pad "holds the image token 151655" dataset=t dataset_dir=text
refused pt "stage pt does not train on images" stage=pt
refused tpsp "sequence_parallel with tensor_parallel_size 2 and a vision-language model is not implemented" \
  nproc_per_node=2 tensor_parallel_size=2 sequence_parallel=true
cp -r model patch7 && sed -i 's/"patch_size": 14/"patch_size": 7/' patch7/config.json
refused mismatch "the model's vision_config has patch_size 7" model_name_or_path=patch7
