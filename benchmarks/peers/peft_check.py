#!/usr/bin/env python3
"""Loads a glm_hpc LoRA export with transformers + PEFT and compares it with glm_hpc's own numbers.

Run by benchmarks/checks/lora_peft_check.sh (which trains, exports and dumps ours with glm_dump_logits). All
in fp32 on the CPU (a tiny model; the GPU plays no part in the comparison). Checks:
  adapter load    GlmForCausalLM.from_pretrained(--base) + peft.PeftModel.from_pretrained(--adapter):
                  every LoRA parameter PEFT created equals the tensor of adapter_model.safetensors of
                  its name, and every tensor of the file was used
  logits          PEFT's logits against ours (base + adapters, glm_dump_logits --out)
  loss            the same batch with labels = input_ids (transformers' shifted mean) against ours
  gradients       every adapter gradient after loss.backward() against ours (glm_dump_logits
                  --grads_out): lora_B of q/k/v_proj are the row blocks of our fused query_key_value
                  B; PEFT's three lora_A copies of it sum to our fused A's gradient
                  (...self_attn.q_proj+k_proj+v_proj.lora_A.weight in ours)
  merged          GlmForCausalLM.from_pretrained(--merged) (glm_hpc export --merge_lora, bf16
                  weights) against PEFT's logits
Prints a table and PASS/FAIL; exits 1 on FAIL.

usage: python3 peft_check.py --base D --adapter D --merged D --input_ids F --ours F --grads F
"""
import argparse
import json
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import GlmForCausalLM

torch.set_float32_matmul_precision("highest")

# fp32 against fp32 on identical weights: only the summation order differs (~1e-6 relative).
FP32_ABS_TOL_PER_UNIT_LOGIT = 1e-4
LOSS_REL_TOL = 1e-5
# Per tensor, max |ours - PEFT| over max |PEFT|: fp32 reductions in another order give ~1e-6; a wrong
# row block, transpose or scale gives O(1). Tensors whose gradient is tiny next to the largest one
# are held to GRAD_ABS_FLOOR x that largest gradient instead (relative error means nothing there).
GRAD_REL_TOL = 1e-3
GRAD_ABS_FLOOR = 1e-6
# The merged export holds bf16 weights: logits move by well under 1% (norm-wise), as in test_export.
MERGED_REL_TOL = 2e-2

FUSED_A = ".self_attn.q_proj+k_proj+v_proj.lora_A.weight"


def from_pretrained(path):
    kwargs = dict(attn_implementation="eager")
    try:
        return GlmForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    except TypeError:  # transformers 4 spells it torch_dtype
        return GlmForCausalLM.from_pretrained(path, torch_dtype=torch.float32, **kwargs)


def peft_name(parameter_name):
    """PEFT's saved name of a parameter: the adapter name ("default") dropped."""
    return parameter_name.replace(".default.", ".")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True, help="the Hugging Face base the LoRA run trained on")
    p.add_argument("--adapter", required=True, help="glm_hpc export of the LoRA checkpoint (PEFT's format)")
    p.add_argument("--merged", required=True, help="glm_hpc export --merge_lora true of the same checkpoint")
    p.add_argument("--input_ids", required=True)
    p.add_argument("--ours", required=True, help="glm_dump_logits --out of the LoRA checkpoint")
    p.add_argument("--grads", required=True, help="glm_dump_logits --grads_out of the same batch")
    a = p.parse_args()
    import peft
    from peft import PeftModel

    print(f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}")
    with open(a.input_ids) as fh:
        ids = torch.tensor(json.load(fh), dtype=torch.long)
    ours = load_file(a.ours)["logits"]
    our_grads = load_file(a.grads)
    our_loss = our_grads.pop("loss").item()
    rows, ok = [], True

    def record(name, value, tol, good, fmt="{:.3e}"):
        nonlocal ok
        ok &= bool(good)
        rows.append((name, fmt.format(value), fmt.format(tol) if tol is not None else "", "PASS" if good else "FAIL"))

    model = PeftModel.from_pretrained(from_pretrained(a.base), a.adapter, is_trainable=True)
    model.eval()  # no dropout; gradients still flow into the adapters
    adapter_file = load_file(f"{a.adapter}/adapter_model.safetensors")
    lora_params = {peft_name(n): prm for n, prm in model.named_parameters() if "lora_" in n}
    mismatched = [n for n, prm in lora_params.items()
                  if n not in adapter_file or not torch.equal(prm.detach().float(), adapter_file[n].float())]
    unused = sorted(set(adapter_file) - set(lora_params))
    if mismatched or unused:
        print("PEFT parameters not equal to the file's tensor:", mismatched[:6], "file tensors unused:", unused[:6])
    record(f"adapter load: {len(lora_params)} PEFT LoRA parameters = the file's {len(adapter_file)} tensors",
           len(mismatched) + len(unused), None, not mismatched and not unused and lora_params, fmt="{:d}")

    out = model(input_ids=ids, labels=ids)
    scale = max(1.0, ours.abs().max().item())
    d = (out.logits.detach().float() - ours).abs().max().item()
    record("logits: PEFT (base + exported adapter) vs ours, max abs diff", d, FP32_ABS_TOL_PER_UNIT_LOGIT * scale,
           d <= FP32_ABS_TOL_PER_UNIT_LOGIT * scale)
    d = abs(out.loss.item() - our_loss)
    record(f"loss: PEFT {out.loss.item():.6f} vs ours {our_loss:.6f}, abs diff", d, LOSS_REL_TOL * max(1.0, abs(our_loss)),
           d <= LOSS_REL_TOL * max(1.0, abs(our_loss)))

    out.loss.backward()
    theirs = {n: prm.grad.detach().float() for n, prm in lora_params.items() if prm.grad is not None}
    # PEFT's q/k/v lora_A gradients summed: what our fused A's gradient is.
    for n in [n for n in theirs if ".self_attn.q_proj.lora_A." in n]:
        layer = n[: n.index(".self_attn.")]
        parts = [theirs[f"{layer}.self_attn.{m}_proj.lora_A.weight"] for m in "qkv"]
        theirs[layer + FUSED_A] = parts[0] + parts[1] + parts[2]
    compared = [n for n in our_grads if n in theirs]
    missing = sorted(set(our_grads) - set(theirs))
    largest = max(g.abs().max().item() for g in our_grads.values())
    worst, worst_name, failed = 0.0, "", []
    for n in compared:
        peer, mine = theirs[n], our_grads[n].float()
        if peer.shape != mine.shape:
            failed.append(f"{n} shape {tuple(mine.shape)} vs PEFT {tuple(peer.shape)}")
            continue
        diff = (mine - peer).abs().max().item()
        rel = diff / max(peer.abs().max().item(), 1e-30)
        if rel > worst:
            worst, worst_name = rel, n
        if rel > GRAD_REL_TOL and diff > GRAD_ABS_FLOOR * largest:
            failed.append(f"{n}: max abs diff {diff:.3e}, relative {rel:.3e}")
    for f in failed[:8]:
        print("gradient mismatch:", f)
    if missing:
        print("our gradients with no PEFT counterpart:", missing[:6])
    record(f"gradients: {len(compared)} tensors, worst relative max diff ({worst_name.split('model.layers.')[-1]})",
           worst, GRAD_REL_TOL, not failed and not missing and compared and largest > 0)

    merged = from_pretrained(a.merged).eval()
    with torch.no_grad():
        m = merged(input_ids=ids).logits.float()
    peer = out.logits.detach().float()
    rel = ((m - peer).norm() / peer.norm()).item()
    record("merged export (bf16 weights) vs PEFT logits, relative norm", rel, MERGED_REL_TOL, rel <= MERGED_REL_TOL)

    print(f"\nlogits [{', '.join(map(str, ours.shape))}], max |logit| {scale:.3f}; largest adapter gradient {largest:.3e}")
    print(f"{'check':<92} {'value':>10} {'tolerance':>10}  result")
    for name, value, tol, result in rows:
        print(f"{name:<92} {value:>10} {tol:>10}  {result}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
