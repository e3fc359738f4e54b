"""GLM-4-9B-Chat's shapes for the PyTorch peers, cut to any number of layers, and the FLOP count of
GLM4_SPEC.md section 3: 2 FLOPs per matmul parameter and token per pass, attention counted with
the causal half (6 x layers x hidden x seq for forward and backward together)."""
from transformers import GlmConfig

LAYER_MATMUL_PARAMS = 203948032  # query_key_value + dense + dense_h_to_4h + dense_4h_to_h
LM_HEAD_PARAMS = 620756992       # 151,552 x 4,096
HIDDEN = 4096


def glm4_9b_config(layers):
    cfg = GlmConfig(vocab_size=151552, hidden_size=HIDDEN, intermediate_size=13696, num_hidden_layers=layers,
                    num_attention_heads=32, num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
                    rms_norm_eps=1.5625e-07, attention_bias=True, tie_word_embeddings=False, pad_token_id=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5})
    cfg._attn_implementation = "sdpa"
    return cfg


def flops_per_token(layers, seq, matmul_passes=6):
    """matmul_passes: 6 for full training (forward, input and weight gradients), 4 for a frozen base
    (LoRA: forward and input gradient)."""
    return matmul_passes * (layers * LAYER_MATMUL_PARAMS + LM_HEAD_PARAMS) + 6 * layers * HIDDEN * seq
