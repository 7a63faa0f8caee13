#!/usr/bin/env bash
# Image datasets through the `fabrica` command: LLaMA-Factory's mllm_demo under the qwen2_vl
# template is prepared (its 8 images processed with the model folder's preprocessor_config.json),
# and `fabrica train` on it with this text-only model stops with exit 2 and writes nothing (training
# a vision-language model on it: vlm_train_test.sh). A video dataset is refused the same way.
# Usage: image_data_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
repo=$(cd "$(dirname "$0")/../.." && pwd)
e2e_workdir

tiny_model model
cp "$repo/tests/reference/image/preprocessor_config.json" model/
{ mllm_config; printf 'per_device_train_batch_size: 2\nmax_steps: 1\n'; } > run.yaml

"$fabrica" data prepare run.yaml >prepare.log 2>&1 || { cat prepare.log; fail "data prepare"; }
grep -q "6 train samples, 0 eval samples, 1025 tokens, 8 images" prepare.log || { cat prepare.log; fail "prepare counts"; }
echo "ok: $(grep '^data:' prepare.log)"

rc=0
"$fabrica" train run.yaml >train.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat train.log; fail "train on images: exit $rc, expected 2"; }
grep -q "it has images, and model_name_or_path model (model_type qwen3) has no vision tower" train.log \
  || { cat train.log; fail "train message"; }
[ ! -e out ] || fail "train on images wrote out/"
echo "ok: train refused: $(tail -1 train.log)"

mkdir videos
cat > videos/dataset_info.json <<'JSON'
{"v": {"file_name": "v.json", "formatting": "sharegpt", "columns": {"messages": "messages", "videos": "videos"},
 "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}
JSON
echo '[{"messages": [{"role": "user", "content": "<video>hi"}, {"role": "assistant", "content": "ok"}], "videos": ["a.mp4"]}]' > videos/v.json
rc=0
"$fabrica" data prepare run.yaml dataset=v dataset_dir=videos >video.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "video inputs are not supported yet" video.log || { cat video.log; fail "videos: exit $rc"; }
echo "ok: videos refused: $(tail -1 video.log)"
