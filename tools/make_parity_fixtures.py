#!/usr/bin/env python3
"""Builds the golden parity fixtures for glm_hpc from transformers' GlmForCausalLM.

Run where torch and transformers exist (the GPU machine); everything runs on the CPU in float32 so
the numbers are exact fp32 references. For each fixture it writes a directory holding:
  config.json + model.safetensors  the random model (transformers `glm` layout, float32)
  golden.safetensors               logits [B, T, V] and grad.<name> for every parameter
  golden.json                      input_ids, labels, loss, and a 10-step AdamW trajectory
and, for fixture "glm_a", a second directory "chatglm_a" with the same weights in the THUDM
layout (fused query_key_value, `chatglm` config.json, two shards + model.safetensors.index.json).

usage: python3 tools/make_parity_fixtures.py OUT_DIR
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import GlmConfig, GlmForCausalLM

torch.set_float32_matmul_precision("highest")
torch.set_num_threads(8)

FIXTURES = {
    # GLM-4's own shape features at a small size: 2 KV groups, partial rotary 0.5, rope_theta 5e6.
    "glm_a": dict(vocab_size=512, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=32, rope_theta=5e6,
                  rms_norm_eps=1e-5, batch=(2, 37), seed=1234),
    # 4 KV groups (the 1M variant's ratio), odd rotary pair count, 3 layers, a longer sequence.
    "glm_b": dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=12, rope_theta=1e8,
                  rms_norm_eps=1.5625e-07, batch=(1, 300), seed=99),
    # A pad token among the inputs: GlmModel's embedding has padding_idx = pad_token_id, so that row
    # never receives a gradient (given a non-zero value here, so the forward reads it too).
    "glm_pad": dict(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=5e6,
                    rms_norm_eps=1e-5, batch=(2, 41), seed=7, pad_token_id=3),
}
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, max_grad_norm=1.0, steps=10)


def make_config(f):
    common = dict(vocab_size=f["vocab_size"], hidden_size=f["hidden_size"],
                  intermediate_size=f["intermediate_size"], num_hidden_layers=f["num_hidden_layers"],
                  num_attention_heads=f["num_attention_heads"], num_key_value_heads=f["num_key_value_heads"],
                  head_dim=f["head_dim"], max_position_embeddings=4096, rms_norm_eps=f["rms_norm_eps"],
                  attention_bias=True, tie_word_embeddings=False, hidden_act="silu",
                  pad_token_id=f.get("pad_token_id"))  # the default 151329 is no row of these vocabularies
    rope = {"rope_type": "default", "rope_theta": f["rope_theta"], "partial_rotary_factor": 0.5}
    attempts = [
        lambda: GlmConfig(**common, rope_parameters=dict(rope)),
        lambda: GlmConfig(**common, rope_theta=f["rope_theta"], partial_rotary_factor=0.5),
    ]
    errors = []
    for make in attempts:
        try:
            cfg = make()
        except Exception as e:  # noqa: BLE001 - try the next spelling of the rope arguments
            errors.append(repr(e))
            continue
        cfg._attn_implementation = "eager"
        return cfg
    raise SystemExit("cannot build GlmConfig: " + "; ".join(errors))


def check_rope(model, f):
    rot = f["head_dim"] // 2
    expected = 1.0 / (f["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
    buffers = [b for n, b in model.named_buffers() if n.endswith("inv_freq")]
    assert buffers, "no inv_freq buffer found"
    inv = buffers[0].float()
    assert inv.shape == expected.shape, f"rotary dims: {inv.shape} vs {expected.shape}"
    assert torch.allclose(inv, expected, rtol=1e-6), f"inv_freq {inv} vs {expected}"


def make_batch(f, generator):
    b, t = f["batch"]
    ids = torch.randint(0, f["vocab_size"], (b, t), generator=generator)
    labels = ids.clone()
    labels[0, :5] = -100  # a prompt
    drop = torch.rand((b, t), generator=generator) < 0.2
    labels[drop] = -100
    if "pad_token_id" in f:  # every fourth input is the pad token, not a target
        ids[:, 1::4] = f["pad_token_id"]
        labels[:, 1::4] = -100
    return ids, labels


def randomize(model, generator):
    # Norm weights and biases are 1 and 0 at init: perturb them so every term is exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * (torch.rand(p.shape, generator=generator) - 0.5))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
        pad = model.config.pad_token_id
        if pad is not None:  # transformers starts the padding row at zero; a loaded one may hold anything
            model.model.embed_tokens.weight[pad].copy_(0.02 * torch.randn(model.config.hidden_size, generator=generator))


def thudm_state(model, f):
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out = {"transformer.embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
           "transformer.encoder.final_layernorm.weight": sd["model.norm.weight"],
           "transformer.output_layer.weight": sd["lm_head.weight"]}
    for i in range(f["num_hidden_layers"]):
        h = f"model.layers.{i}."
        t = f"transformer.encoder.layers.{i}."
        out[t + "input_layernorm.weight"] = sd[h + "input_layernorm.weight"]
        out[t + "post_attention_layernorm.weight"] = sd[h + "post_attention_layernorm.weight"]
        for kind in ("weight", "bias"):
            out[t + f"self_attention.query_key_value.{kind}"] = torch.cat(
                [sd[h + f"self_attn.{p}_proj.{kind}"] for p in ("q", "k", "v")], dim=0).contiguous()
        out[t + "self_attention.dense.weight"] = sd[h + "self_attn.o_proj.weight"]
        out[t + "mlp.dense_h_to_4h.weight"] = sd[h + "mlp.gate_up_proj.weight"]
        out[t + "mlp.dense_4h_to_h.weight"] = sd[h + "mlp.down_proj.weight"]
    rot = f["head_dim"] // 2
    out["transformer.rotary_pos_emb.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    return out


def write_thudm(model, f, path):
    os.makedirs(path, exist_ok=True)
    state = thudm_state(model, f)
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map, total = {}, 0
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, os.path.join(path, fname), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = fname
            total += state[k].numel() * state[k].element_size()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    config = {"architectures": ["ChatGLMModel"], "model_type": "chatglm", "num_layers": f["num_hidden_layers"],
              "padded_vocab_size": f["vocab_size"], "hidden_size": f["hidden_size"],
              "ffn_hidden_size": f["intermediate_size"], "kv_channels": f["head_dim"],
              "num_attention_heads": f["num_attention_heads"], "multi_query_attention": True,
              "multi_query_group_num": f["num_key_value_heads"], "seq_length": 4096,
              "rope_ratio": f["rope_theta"] / 10000.0, "layernorm_epsilon": f["rms_norm_eps"],
              "add_qkv_bias": True, "add_bias_linear": False, "rmsnorm": True, "post_layer_norm": True,
              "apply_residual_connection_post_layernorm": False, "original_rope": True,
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)


def build(name, f, out_dir):
    generator = torch.Generator().manual_seed(f["seed"])
    torch.manual_seed(f["seed"])
    model = GlmForCausalLM(make_config(f)).float()
    randomize(model, generator)
    check_rope(model, f)
    path = os.path.join(out_dir, name)
    try:
        model.save_pretrained(path, safe_serialization=True)
    except TypeError:  # transformers 5 always writes safetensors
        model.save_pretrained(path)
    ids, labels = make_batch(f, generator)

    model.train()
    model.zero_grad()
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    golden = {"logits": out.logits.detach().float().contiguous()}
    for pname, p in model.named_parameters():
        golden["grad." + pname] = p.grad.detach().float().contiguous()
    save_file(golden, os.path.join(path, "golden.safetensors"))
    loss0 = out.loss.item()

    # 10 AdamW steps on the same batch: decay on weights and embeddings, not on norms and biases.
    if name == "glm_a":
        write_thudm(model, f, os.path.join(out_dir, name.replace("glm_", "chatglm_")))
    decay = [p for n, p in model.named_parameters() if not ("norm" in n or n.endswith(".bias"))]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n or n.endswith(".bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"], foreach=False)
    losses, norms = [], []
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), ADAMW["max_grad_norm"]).item())
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - loss0) < 1e-6 * abs(loss0)

    info = {"input_ids": ids.tolist(), "labels": labels.tolist(), "loss": loss0,
            "adamw": {**ADAMW, "losses": losses, "grad_norms": norms},
            "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    with open(os.path.join(path, "golden.json"), "w") as fh:
        json.dump(info, fh)
    with open(os.path.join(path, "config.json")) as fh:
        print(name, "config.json:", fh.read().replace("\n", " "))
    print(f"{name}: loss {loss0:.6f}, adamw losses {[round(x, 5) for x in losses]}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for name, f in FIXTURES.items():
        build(name, f, out_dir)


if __name__ == "__main__":
    main()
