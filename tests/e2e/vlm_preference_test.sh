#!/usr/bin/env bash
# Preference training of a vision-language model through the `fabrica` command: an image ranking
# dataset in LLaMA-Factory's sharegpt form (RLHF-V's columns: conversations, chosen, rejected,
# images) on the tiny qwen2_vl folder. A pair's chosen and rejected rows both carry its images:
#   - two pairs that differ only in their images' order; dpo with pref_loss orpo (whose logps are
#     per-token means) at learning rate 0, one pair a step, logs as logps/chosen and logps/rejected
#     minus the sft evaluation losses of prompt + chosen and prompt + rejected with the same images
#     in the same order (the sft path is the one checked against transformers), for both pairs;
#   - dpo sigmoid, full (the precomputed reference) and LoRA (the adapters-off reference), starts at
#     loss ln 2 with zero rewards, and trains;
#   - rm trains on the pairs;
#   - kto with images is refused by name (its KL rows pair a prompt with another example's answer).
# Usage: vlm_preference_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir

mkdir data
tiny_vlm_model model
cp "$shared"/data/llamafactory/mllm_demo_data/1.jpg "$shared"/data/llamafactory/mllm_demo_data/2.jpg data/
python3 - <<'PY'
import json
prompt = "<image>Who are they?<image>Which picture is brighter?"
chosen, rejected = "The first one, in the stadium lights.", "Neither."
orders = {"12": ["1.jpg", "2.jpg"], "21": ["2.jpg", "1.jpg"]}
json.dump([{"conversations": [{"from": "human", "value": prompt}], "chosen": {"from": "gpt", "value": chosen},
            "rejected": {"from": "gpt", "value": rejected}, "images": images} for images in orders.values()],
          open("data/pair.json", "w"))
ranking = {"messages": "conversations", "chosen": "chosen", "rejected": "rejected", "images": "images"}
info = {"pair": {"file_name": "pair.json", "formatting": "sharegpt", "ranking": True, "columns": ranking}}
for side, answer in (("chosen", chosen), ("rejected", rejected)):
    for order, images in orders.items():
        name = f"{side}{order}"
        json.dump([{"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}],
                    "images": images}], open(f"data/{name}.json", "w"))
        info[name] = {"file_name": f"{name}.json", "formatting": "sharegpt",
                      "columns": {"messages": "conversations", "images": "images"}}
json.dump([{"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": chosen}], "label": True,
            "images": orders["12"]}], open("data/kto.json", "w"))
info["kto"] = {"file_name": "kto.json", "formatting": "sharegpt",
               "columns": {"messages": "conversations", "kto_tag": "label", "images": "images"}}
json.dump(info, open("data/dataset_info.json", "w"), indent=1)
PY

common() {
  cat <<YAML
model_name_or_path: model
dataset_dir: data
template: qwen2_vl
cutoff_len: 2048
logging_steps: 1
per_device_train_batch_size: 1
YAML
}
for name in chosen12 chosen21 rejected12 rejected21; do
  { common; printf 'stage: sft\ndataset: %s\neval_dataset: %s\nlearning_rate: 0\nmax_steps: 1\neval_strategy: steps\neval_steps: 1\noutput_dir: sft-%s\n' \
      "$name" "$name" "$name"; } > sft-$name.yaml
  "$fabrica" train sft-$name.yaml >sft-$name.log 2>&1 || { cat sft-$name.log; fail "sft evaluation of $name"; }
done
{ common; printf 'stage: dpo\ndataset: pair\npref_loss: orpo\nlearning_rate: 0\nmax_steps: 2\noutput_dir: orpo\n'; } > orpo.yaml
"$fabrica" train orpo.yaml >orpo.log 2>&1 || { cat orpo.log; fail "dpo orpo"; }
grep -q "2 train pairs (4 sequences), 0 eval items, .* 8 images" orpo.log || { cat orpo.log; fail "pair data counts"; }
python3 - orpo/metrics.jsonl <<'PY' || fail "dpo log-probabilities"
import json, sys
def eval_loss(name):
    return [json.loads(l) for l in open(f"sft-{name}/metrics.jsonl") if "eval_loss" in l][-1]["eval_loss"]
sft = {order: (eval_loss("chosen" + order), eval_loss("rejected" + order)) for order in ("12", "21")}
print("  sft eval_loss (chosen, rejected) by image order:", sft)
assert abs(sft["12"][0] - sft["21"][0]) > 1e-4, "the images' order changes nothing: the check would not see a swap"
steps = [json.loads(l) for l in open(sys.argv[1])]
seen = set()
for s in steps:
    logps = (-s["logps/chosen"], -s["logps/rejected"])
    order = min(sft, key=lambda o: abs(sft[o][0] - logps[0]))
    print(f"  step {s['step']}: -logps {logps[0]:.6f} {logps[1]:.6f} -> images {order}")
    for want, got in zip(sft[order], logps):
        assert abs(want - got) < 1e-5 * want, (order, want, got)
    seen.add(order)
assert seen == {"12", "21"}, seen
PY
echo "ok: each pair's chosen and rejected rows carry its images, in order (orpo's mean log-probabilities = -sft eval_loss)"

for kind in full lora; do
  { common; printf 'stage: dpo\ndataset: pair\npref_loss: sigmoid\nlearning_rate: 1.0e-3\nmax_steps: 3\nfinetuning_type: %s\noutput_dir: dpo-%s\n' \
      "$kind" "$kind"; } > dpo-$kind.yaml
  "$fabrica" train dpo-$kind.yaml >dpo-$kind.log 2>&1 || { cat dpo-$kind.log; fail "dpo $kind"; }
  python3 - dpo-$kind/metrics.jsonl <<'PY' || fail "dpo $kind losses"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
losses = [l["loss"] for l in lines]
print("  losses", " ".join(f"{x:.4f}" for x in losses))
assert abs(losses[0] - math.log(2)) < 1e-6 and lines[0]["rewards/chosen"] == 0, lines[0]
assert losses[-1] < losses[0], "not falling"
PY
  echo "ok: dpo $kind with images: ln 2 at the start, falling"
done

{ common; printf 'stage: rm\ndataset: pair\nlearning_rate: 1.0e-3\nmax_steps: 3\noutput_dir: rm\n'; } > rm.yaml
"$fabrica" train rm.yaml >rm.log 2>&1 || { cat rm.log; fail "rm"; }
python3 - rm/metrics.jsonl <<'PY' || fail "rm losses"
import json, math, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1])]
print("  losses", " ".join(f"{x:.4f}" for x in losses))
assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
PY
echo "ok: rm on image pairs"

{ common; printf 'stage: kto\ndataset: kto\nmax_steps: 1\noutput_dir: kto\n'; } > kto.yaml
rc=0
"$fabrica" train kto.yaml >kto.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "which stage kto does not take yet" kto.log \
  || { cat kto.log; fail "kto with images: exit $rc"; }
echo "ok: refused: $(tail -1 kto.log)"
echo "ok: all"
