# Run by hand: /work/lfvenv/bin/python tests/reference/crosscheck_pref_formulas.py
# Cross-check make_pref_reference.py's formulas against TRL 0.24's DPOTrainer.dpo_loss and
# KTOTrainer.kto_loss and LLaMA-Factory 0.9.5's odds_ratio_loss / simpo_loss, taken from their
# source files (exec'd alone: importing trl needs optional packages this venv lacks).
import ast, enum, math, os, sys, sysconfig, types, torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_pref_reference as m
SITE = sysconfig.get_paths()["purelib"] + "/"

def method(path, cls, name):
    tree = ast.parse(open(SITE + path).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == name:
                    f.decorator_list = []
                    ns = {"torch": torch, "F": F, "math": math, "Optional": object, "Union": object,
                          "FDivergenceType": enum.Enum("FDivergenceType", "REVERSE_KL JS_DIVERGENCE ALPHA_DIVERGENCE"),
                          "FDivergenceConstants": types.SimpleNamespace(ALPHA_DIVERGENCE_COEF_KEY="a")}
                    src = ast.unparse(f).replace('"torch.Tensor"', "object")
                    exec(compile(src, path, "exec"), ns)
                    return ns[name], ns
    raise KeyError(name)

dpo_loss, dpo_ns = method("trl/trainer/dpo_trainer.py", "DPOTrainer", "dpo_loss")
kto_loss, _ = method("trl/trainer/kto_trainer.py", "KTOTrainer", "kto_loss")
orpo, _ = method("llamafactory/train/dpo/trainer.py", "CustomDPOTrainer", "odds_ratio_loss")
simpo, _ = method("llamafactory/train/dpo/trainer.py", "CustomDPOTrainer", "simpo_loss")
torch.manual_seed(0)
c, r = -torch.rand(6) * 3 - 0.1, -torch.rand(6) * 3 - 0.1
rc, rr = c + torch.randn(6) * 0.3, r + torch.randn(6) * 0.3
acc = types.SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x)
worst = 0.0
for loss, beta, ls in [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("hinge", 0.1, 0.0), ("ipo", 0.1, 0.0)]:
    fake = types.SimpleNamespace(beta=beta, label_smoothing=ls, reference_free=False, accelerator=acc,
                                 f_divergence_type=dpo_ns["FDivergenceType"].REVERSE_KL, f_divergence_params=None,
                                 use_weighting=False, loss_type=[loss])
    theirs = dpo_loss(fake, c, r, rc, rr, loss_type=loss)[0]
    ours = m.dpo_losses({"pref_loss": loss, "pref_beta": beta, "dpo_label_smoothing": ls}, c, r, rc, rr)
    print(f"{loss} ls={ls}: max |TRL - ours| = {float((theirs - ours).abs().max()):.2e}")
    worst = max(worst, float((theirs - ours).abs().max()))
for loss, fn in [("orpo", orpo), ("simpo", simpo)]:
    theirs = fn(types.SimpleNamespace(beta=0.3, simpo_gamma=0.5), c, r)
    ours = m.dpo_losses({"pref_loss": loss, "pref_beta": 0.3, "simpo_gamma": 0.5}, c, r, rc, rr)
    print(f"{loss}: max |LLaMA-Factory - ours| = {float((theirs - ours).abs().max()):.2e}")
    worst = max(worst, float((theirs - ours).abs().max()))
fake = types.SimpleNamespace(calculate_KL=True, accelerator=acc, loss_type="kto", beta=0.1, desirable_weight=1.0,
                             undesirable_weight=1.5)
kl_p, kl_r = c + 0.2, c
theirs, _, _, kl = kto_loss(fake, c[:3], r[3:], kl_p, rc[:3], rr[3:], kl_r)
klv = (kl_p - kl_r).mean().clamp(min=0)
ours = torch.cat([1.0 * (1 - torch.sigmoid(0.1 * ((c[:3] - rc[:3]) - klv))),
                  1.5 * (1 - torch.sigmoid(0.1 * (klv - (r[3:] - rr[3:]))))])
print(f"kto: max |TRL - ours| = {float((theirs - ours).abs().max()):.2e} (kl {float(kl):.3f})")
worst = max(worst, float((theirs - ours).abs().max()))
print("worst", worst)
