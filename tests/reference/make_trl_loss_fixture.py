"""One GRPO loss from TRL's own GRPOTrainer, for tests/train/grpo_reference_test.cpp
(GrpoReference.LossEqualsTrlGrpoTrainer): the same weights and the same fed-in completions in
both, the loss of each loss_type TRL 1.16 has in common with Fabrica's stage grpo.

Run by hand (TRL is not needed at test time: the output is committed) with a venv holding trl
(written with trl 1.16.0, transformers 5.25.0, torch 2.15.0, CPU, fp32), after
make_grpo_reference.py has written the tiny Llama:
  /usr/bin/python3 tests/reference/make_grpo_reference.py build/reference
  VENV/bin/python tests/reference/make_trl_loss_fixture.py build/reference/grpo \
      tests/reference/trl/grpo_trl_losses.json

The completions, prompts and advantages are make_grpo_reference.py's; the "old" log-probabilities
are the policy's own (TRL's _get_per_token_logps_and_entropies at the rollout temperature) moved
by up to +-0.6, so both clips are reached but not verl's dual clip (TRL has none); the reference's
by up to +-0.5 (TRL's k3, which verl clamps only far from here). Each case calls
GRPOTrainer._compute_loss on those inputs.
"""
import json
import os
import sys
import tempfile

import torch
from datasets import Dataset
from safetensors.torch import load_file
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

TEMPERATURE = 0.7
MAX_COMPLETION = 10
EPSILON, EPSILON_HIGH = 0.2, 0.28
BETA = 0.04
# (name, loss_type, importance_sampling_level, epsilon_high)
CASES = [("grpo", "grpo", "token", EPSILON_HIGH), ("bnpo", "bnpo", "token", EPSILON_HIGH),
         ("dr_grpo", "dr_grpo", "token", EPSILON_HIGH), ("dapo", "dapo", "token", EPSILON_HIGH),
         ("grpo_sequence", "grpo", "sequence", EPSILON_HIGH), ("cispo", "cispo", "token", 5.0)]


def word_tokenizer(vocab):
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t3"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t2", unk_token="t3")


def batch(ref):
    """Prompts left-padded and completions right-padded, as GRPOTrainer holds them."""
    ids, labels = ref["ids"], ref["labels"]
    p_len, r_len = ref["prompt_lengths"].tolist(), ref["response_lengths"].tolist()
    n, pmax, rmax = len(p_len), max(p_len), max(r_len)
    prompt_ids = torch.zeros(n, pmax, dtype=torch.long)
    prompt_mask = torch.zeros(n, pmax, dtype=torch.long)
    completion_ids = torch.zeros(n, rmax, dtype=torch.long)
    completion_mask = torch.zeros(n, rmax, dtype=torch.long)
    for i, (p, r) in enumerate(zip(p_len, r_len)):
        prompt_ids[i, pmax - p:] = ids[i, :p]
        prompt_mask[i, pmax - p:] = 1
        completion_ids[i, :r] = ids[i, p:p + r]
        completion_mask[i, :r] = 1
    assert torch.equal(labels[0, p_len[0]:p_len[0] + r_len[0]], completion_ids[0, :r_len[0]])
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def trainer_for(model, tokenizer, work, loss_type, level, epsilon_high):
    args = GRPOConfig(output_dir=work, per_device_train_batch_size=6, num_generations=2,
                      max_completion_length=MAX_COMPLETION, temperature=TEMPERATURE, loss_type=loss_type,
                      importance_sampling_level=level, beta=BETA, epsilon=EPSILON, epsilon_high=epsilon_high,
                      use_cpu=True, report_to="none", bf16=False, logging_steps=1, seed=0)
    data = Dataset.from_dict({"prompt": ["t5 t6"] * 6})
    return GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                       train_dataset=data, processing_class=tokenizer)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    folder, out = argv[1], argv[2]
    ref = load_file(os.path.join(folder, "reference.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    cfg = json.load(open(os.path.join(folder, "config.json")))
    tokenizer = word_tokenizer(cfg["vocab_size"])
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch(ref)
    advantages = ref["advantages"].double().float()
    g = torch.Generator().manual_seed(31)
    result = {"temperature": TEMPERATURE, "max_completion_length": MAX_COMPLETION, "epsilon": EPSILON,
              "epsilon_high": EPSILON_HIGH, "beta": BETA, "advantages": advantages.tolist(),
              "prompt_lengths": ref["prompt_lengths"].tolist(), "response_lengths": ref["response_lengths"].tolist(),
              "versions": {}, "cases": {}}
    import transformers
    import trl
    result["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as work:
        for name, loss_type, level, epsilon_high in CASES:
            trainer = trainer_for(model, tokenizer, work, loss_type, level, epsilon_high)
            trainer.model.train()
            trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train; one micro-batch here
            input_ids = torch.cat([prompt_ids, completion_ids], 1)
            attention = torch.cat([prompt_mask, completion_mask], 1)
            if "old_logp" not in result:
                with torch.no_grad():
                    logp, _, _ = trainer._get_per_token_logps_and_entropies(
                        trainer.model, input_ids, attention, completion_ids.size(1))
                mask = completion_mask.float()
                old = (logp + (torch.rand(logp.shape, generator=g) * 1.2 - 0.6)) * mask
                reference = (logp + (torch.rand(logp.shape, generator=g) - 0.5)) * mask
                result["policy_logp"] = [logp[i, :n].tolist() for i, n in enumerate(result["response_lengths"])]
                result["old_logp"] = [old[i, :n].tolist() for i, n in enumerate(result["response_lengths"])]
                result["ref_logp"] = [reference[i, :n].tolist() for i, n in enumerate(result["response_lengths"])]
            inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                      "completion_mask": completion_mask, "advantages": advantages, "old_per_token_logps": old,
                      "ref_per_token_logps": reference, "num_items_in_batch": completion_mask.sum().float()}
            loss = trainer._compute_loss(trainer.model, inputs)
            result["cases"][name] = {"loss_type": loss_type, "importance_sampling_level": level,
                                     "epsilon_high": epsilon_high, "loss": float(loss)}
            print(f"[{name}] loss {float(loss):.8f}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
