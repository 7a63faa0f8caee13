# Sourced by the end-to-end scripts: `tiny_model DIR SHARED` makes a config-only model folder (a
# tiny Qwen3 trained from scratch) with the real Qwen3 tokenizer.
tiny_model() {
  mkdir -p "$1"
  cp "$2/data/tokenizers/qwen3/tokenizer.json" "$2/data/tokenizers/qwen3/tokenizer_config.json" "$1/"
  cat > "$1/config.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 151669, "hidden_size": 32, "intermediate_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
 "max_position_embeddings": 256, "tie_word_embeddings": true, "rope_theta": 1000000}
JSON
}
