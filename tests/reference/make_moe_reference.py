"""Writes tests/reference/moe/: tiny qwen3_moe, qwen2_moe and mixtral folders saved by transformers
itself, and what its own modeling code computes on them, for tests/models/moe_reference_test.cpp.

Run with the venv of transformers >= 5 (written with transformers 5.25.0, torch 2.15.0, CPU, fp32):
    python tests/reference/make_moe_reference.py

Per family F:
  F/            save_pretrained's default layout: one module per expert (mixtral: block_sparse_moe.experts.{e}.w1/w3/w2)
  F_fused/      save_pretrained(save_original_format=False): transformers 5's fused 3-D experts
  F/reference.safetensors:
    input_ids, labels, lengths   a right-padded batch (row 1 has padding: attention_mask 0, label -100)
    logits                       on every real position (padding rows zero)
    loss_ce, aux_loss            cross-entropy mean, load_balancing_loss_func with the attention mask
    grad.<name>                  d(loss_ce + router_aux_loss_coef * aux_loss)/d(name), per-expert names
    noaux.grad.<name>            d(loss_ce)/d(name)
    step6.<name>                 every parameter after 6 AdamW steps on loss_ce + coef * aux on that batch
                                 (weight decay on tensors of >= 2 dimensions, as Fabrica)
The routers are drawn with std 1 (far from uniform), so top-k is decisive. Each saved folder
is re-loaded in transformers here and checked to give the same logits in both layouts.

    python tests/reference/make_moe_reference.py --check-export DIR...
loads folders Fabrica exported in transformers and checks their logits against the fixture's.
"""

import copy
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe")
COMMON = dict(vocab_size=48, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False, output_router_logits=True,
              router_aux_loss_coef=0.1, num_experts_per_tok=2)


def configs():
    yield "qwen3_moe", Qwen3MoeConfig(**COMMON, intermediate_size=24, head_dim=8, num_experts=4,
                                      moe_intermediate_size=8, norm_topk_prob=True, mlp_only_layers=[1])
    yield "qwen2_moe", Qwen2MoeConfig(**COMMON, intermediate_size=24, num_experts=4, moe_intermediate_size=8,
                                      shared_expert_intermediate_size=12, norm_topk_prob=False)
    yield "mixtral", MixtralConfig(**COMMON, intermediate_size=8, num_local_experts=4)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, COMMON["vocab_size"], (2, 7), generator=g)
    lengths = torch.tensor([7, 5])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    ids = ids * mask  # padding id 0
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[0, 1] = -100  # a prompt token
    return ids, labels, lengths, mask


def loss_of(model, ids, labels, mask, with_aux):
    model.config.output_router_logits = with_aux
    out = model(input_ids=ids, attention_mask=mask, labels=labels, output_router_logits=with_aux)
    return out


def build(name, config):
    torch.manual_seed(0)
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)  # far from uniform: top-k is decisive
            elif p.dim() >= 2:
                p.normal_(0.0, 0.3)
            elif "norm" in pname:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    folder, fused = os.path.join(HERE, name), os.path.join(HERE, name + "_fused")
    for f in (folder, fused):
        shutil.rmtree(f, ignore_errors=True)
    model.save_pretrained(folder)
    model.save_pretrained(fused, save_original_format=False)
    for f in (folder, fused):
        for extra in os.listdir(f):
            if extra == "generation_config.json":
                os.remove(os.path.join(f, extra))
    return model, folder, fused


def per_expert_names(folder):
    from safetensors import safe_open
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def to_saved_names(model, folder, tensors):
    """Maps a {model param name: tensor} dict to the per-expert names of `folder`'s file, the way
    save_pretrained converts weights (through its own revert_weight_conversion)."""
    from transformers.core_model_loading import revert_weight_conversion
    return revert_weight_conversion(model, dict(tensors))


def adamw_steps(model, ids, labels, mask):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(6):
        opt.zero_grad()
        loss_of(model, ids, labels, mask, True).loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def main():
    out_meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    for name, config in configs():
        model, folder, fused = build(name, config)
        ids, labels, lengths, mask = batch()
        model.train()
        # logits and losses
        out = loss_of(model, ids, labels, mask, True)
        logits = (out.logits * mask[..., None]).detach()
        ce = out.loss - config.router_aux_loss_coef * out.aux_loss
        ref = {"input_ids": ids, "labels": labels, "lengths": lengths, "logits": logits,
               "loss_ce": ce.detach().reshape(1), "aux_loss": out.aux_loss.detach().reshape(1),
               "loss": out.loss.detach().reshape(1)}
        model.zero_grad()
        out.loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        model.zero_grad()
        loss_of(model, ids, labels, mask, False).loss.backward()
        noaux = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        for k, v in to_saved_names(model, folder, grads).items():
            ref["grad." + k] = v.contiguous()
        for k, v in to_saved_names(model, folder, noaux).items():
            ref["noaux.grad." + k] = v.contiguous()
        # 6 AdamW steps on loss_ce + coef * aux, in fp32 and (to find the parameters whose fp32
        # trajectory is rounding noise: Adam divides near-zero gradients by their own size) in fp64.
        twin = copy.deepcopy(model).double()
        twin.set_experts_implementation("eager")  # torch._grouped_mm has no fp64
        after = adamw_steps(model, ids, labels, mask)
        after64 = adamw_steps(twin, ids, labels, mask)
        noisy = []
        for k, v in to_saved_names(model, folder, after).items():
            ref["step6." + k] = v.contiguous()
        for k, v in to_saved_names(model, folder, {n: t.float() for n, t in after64.items()}).items():
            if (v - ref["step6." + k]).abs().max() > 5e-6 * v.abs().max():  # half the C++ test's bound
                noisy.append(k)
        meta = dict(out_meta, noisy_step6=",".join(noisy))
        save_file(ref, os.path.join(folder, "reference.safetensors"), metadata=meta)
        # Both layouts load back in transformers to the same logits.
        for f in (folder, fused):
            again = AutoModelForCausalLM.from_pretrained(f, dtype=torch.float32)
            again.eval()
            with torch.no_grad():
                l2 = again(input_ids=ids, attention_mask=mask).logits * mask[..., None]
            assert torch.allclose(l2, logits, atol=1e-6), f
        print(name, "ok", {k: float(ref[k]) for k in ("loss_ce", "aux_loss")}, "noisy after 6 steps:", noisy)


def check_export(folders):
    """Loads folders Fabrica exported (MoeReferenceTest.ExportRoundTripsInBothLayouts with
    FAB_KEEP_TEST_DIRS=1 keeps them as moe_export_<family>[_fused]) in transformers and compares
    their logits with the fixture's."""
    for folder in folders:
        family = os.path.basename(folder.rstrip("/")).removeprefix("moe_export_").removesuffix("_fused")
        from safetensors.torch import load_file
        ref = load_file(os.path.join(HERE, family, "reference.safetensors"))
        mask = (torch.arange(ref["input_ids"].shape[1])[None, :] < ref["lengths"][:, None]).long()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(input_ids=ref["input_ids"], attention_mask=mask).logits * mask[..., None]
        err = float((logits - ref["logits"]).abs().max() / ref["logits"].abs().max())
        assert err < 1e-5, (folder, err)
        print(folder, "loads in transformers", transformers.__version__, "relative logit error", err)


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 2 and sys.argv[1] == "--check-export":
        check_export(sys.argv[2:])
    else:
        main()
