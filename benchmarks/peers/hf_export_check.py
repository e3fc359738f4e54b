#!/usr/bin/env python3
"""Loads glm_hpc exports in transformers and compares their logits with glm_hpc's own.

Run by benchmarks/checks/export_check.sh (which trains, exports and dumps our logits). Checks:
  hf layout       GlmForCausalLM.from_pretrained(--hf_dir) in float32 (no missing or unexpected keys),
                  logits against ours from the same bf16 weights (glm_dump_logits, fp32 CPU backend)
  chatglm layout  transformers has no `chatglm` model without THUDM's remote code (not available
                  offline), so the THUDM names are mapped onto GlmForCausalLM here (load_state_dict
                  strict): proves the fused query_key_value and the config fields independently of
                  our own importer
  bf16 on GPU     the hf directory as shipped (bfloat16) on CUDA: informational, bf16 arithmetic
Prints a table and PASS/FAIL; exits 1 on FAIL.

usage: python3 hf_export_check.py --hf_dir D --chatglm_dir D --input_ids F --ours F [--ours_fp32 F]
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import GlmConfig, GlmForCausalLM

torch.set_float32_matmul_precision("highest")

# fp32 against fp32 on identical weights: only the summation order differs (~1e-6 relative).
FP32_ABS_TOL_PER_UNIT_LOGIT = 1e-4


def from_pretrained(path, dtype):
    kwargs = dict(attn_implementation="eager", output_loading_info=True)
    try:
        return GlmForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except TypeError:  # transformers 4 spells it torch_dtype
        return GlmForCausalLM.from_pretrained(path, torch_dtype=dtype, **kwargs)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.to(model.device)).logits.float().cpu()


def read_state(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            files = sorted(set(json.load(fh)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for f in files:
        state.update(load_file(os.path.join(path, f)))
    return state


def glm_config_from_chatglm(c):
    common = dict(vocab_size=c["padded_vocab_size"], hidden_size=c["hidden_size"],
                  intermediate_size=c["ffn_hidden_size"], num_hidden_layers=c["num_layers"],
                  num_attention_heads=c["num_attention_heads"], num_key_value_heads=c["multi_query_group_num"],
                  head_dim=c["kv_channels"], max_position_embeddings=c["seq_length"],
                  rms_norm_eps=c["layernorm_epsilon"], attention_bias=c["add_qkv_bias"],
                  tie_word_embeddings=c["tie_word_embeddings"], hidden_act="silu", pad_token_id=None)
    theta = 10000.0 * c["rope_ratio"]
    for make in (lambda: GlmConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": theta,
                                                              "partial_rotary_factor": 0.5}),
                 lambda: GlmConfig(**common, rope_theta=theta, partial_rotary_factor=0.5)):
        try:
            return make()
        except Exception:  # noqa: BLE001 - the other spelling of the rope arguments
            continue
    raise SystemExit("cannot build a GlmConfig from the chatglm config.json")


def chatglm_to_glm(state, c):
    q = c["num_attention_heads"] * c["kv_channels"]
    kv = c["multi_query_group_num"] * c["kv_channels"]
    out = {"model.embed_tokens.weight": state.pop("transformer.embedding.word_embeddings.weight"),
           "model.norm.weight": state.pop("transformer.encoder.final_layernorm.weight"),
           "lm_head.weight": state.pop("transformer.output_layer.weight")}
    inv = state.pop("transformer.rotary_pos_emb.inv_freq")
    dim = c["kv_channels"] // 2
    expected = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    assert torch.allclose(inv.float(), expected, rtol=1e-2), f"inv_freq {inv} vs {expected}"
    for i in range(c["num_layers"]):
        t, h = f"transformer.encoder.layers.{i}.", f"model.layers.{i}."
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[h + name] = state.pop(t + name)
        for kind in ("weight", "bias"):
            fused = state.pop(t + f"self_attention.query_key_value.{kind}")
            assert fused.shape[0] == q + 2 * kv, f"query_key_value rows {fused.shape[0]} != {q + 2 * kv}"
            out[h + f"self_attn.q_proj.{kind}"] = fused[:q]
            out[h + f"self_attn.k_proj.{kind}"] = fused[q:q + kv]
            out[h + f"self_attn.v_proj.{kind}"] = fused[q + kv:]
        out[h + "self_attn.o_proj.weight"] = state.pop(t + "self_attention.dense.weight")
        out[h + "mlp.gate_up_proj.weight"] = state.pop(t + "mlp.dense_h_to_4h.weight")
        out[h + "mlp.down_proj.weight"] = state.pop(t + "mlp.dense_4h_to_h.weight")
    assert not state, f"tensors the THUDM layout does not have: {sorted(state)}"
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hf_dir", required=True)
    p.add_argument("--chatglm_dir", required=True)
    p.add_argument("--input_ids", required=True)
    p.add_argument("--ours", required=True, help="glm_dump_logits of the checkpoint, bf16-rounded weights")
    p.add_argument("--ours_fp32", help="glm_dump_logits --bf16_weights false (the fp32 masters), informational")
    a = p.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    with open(a.input_ids) as fh:
        ids = torch.tensor(json.load(fh), dtype=torch.long)
    ours = load_file(a.ours)["logits"]
    scale = max(1.0, ours.abs().max().item())
    tol = FP32_ABS_TOL_PER_UNIT_LOGIT * scale
    rows, ok = [], True

    model, info = from_pretrained(a.hf_dir, torch.float32)
    bad_keys = sorted(set(info.get("missing_keys", [])) | set(info.get("unexpected_keys", [])))
    with open(os.path.join(a.hf_dir, "config.json")) as fh:
        hf_cfg = json.load(fh)
    rope = model.config.rope_parameters if hasattr(model.config, "rope_parameters") else None
    theta = rope["rope_theta"] if rope else model.config.rope_theta
    cfg_ok = abs(theta - hf_cfg["rope_theta"]) < 1e-6 * hf_cfg["rope_theta"] and not bad_keys
    d = (logits(model.eval(), ids) - ours).abs().max().item()
    good = d <= tol and cfg_ok
    ok &= good
    rows.append(("hf layout: GlmForCausalLM.from_pretrained, fp32", d, "PASS" if good else "FAIL"))
    if bad_keys:
        print("missing/unexpected keys:", bad_keys)
    if a.ours_fp32:
        d32 = (logits(model, ids) - load_file(a.ours_fp32)["logits"]).abs().max().item()
        rows.append(("  same, against ours from the unrounded fp32 masters", d32, "info (bf16 rounding)"))

    with open(os.path.join(a.chatglm_dir, "config.json")) as fh:
        chat_cfg = json.load(fh)
    glm_cfg = glm_config_from_chatglm(chat_cfg)
    glm_cfg._attn_implementation = "eager"
    chat = GlmForCausalLM(glm_cfg).float()
    chat.load_state_dict(chatglm_to_glm(read_state(a.chatglm_dir), chat_cfg), strict=True)
    d = (logits(chat.eval(), ids) - ours).abs().max().item()
    good = d <= tol
    ok &= good
    rows.append(("chatglm layout: THUDM names mapped onto GlmForCausalLM, fp32", d, "PASS" if good else "FAIL"))

    if torch.cuda.is_available():
        bf16, _ = from_pretrained(a.hf_dir, torch.bfloat16)
        d = (logits(bf16.to("cuda").eval(), ids) - ours).abs().max().item()
        rows.append(("hf layout as shipped: bfloat16 on CUDA", d, "info (bf16 arithmetic)"))
    else:
        rows.append(("hf layout as shipped: bfloat16 on CUDA", float("nan"), "skipped: no GPU"))

    print(f"\nlogits [{', '.join(map(str, ours.shape))}], max |logit| {scale:.3f}, fp32 tolerance {tol:.2e}")
    print(f"{'check':<64} {'max abs diff':>13}  result")
    for name, diff, result in rows:
        print(f"{name:<64} {diff:>13.3e}  {result}")
    print("tokenizer: not loaded (the tiny run's tokenizer.model is a tiktoken file that needs THUDM's "
          "tokenization_chatglm.py)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
