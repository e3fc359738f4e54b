// Model FLOPs of a training step, MFU's numerator (PaLM's and torchtitan's convention: the matmuls
// of the model, not what recomputation adds): 6 per matmul parameter and token (forward, and both
// gradients in backward), or 4 under LoRA (the frozen base has no weight gradient), plus causal
// attention's QK^T and PV, 12 x layers x heads x head_dim per (query, key) pair a query attends
// to in its own document (forward 4, backward 8).
#pragma once

#include <span>

#include "data/sharded_loader.h"
#include "model/config.h"

namespace glm {

// The matmul parameters: every layer's q|k|v, o, gate|up and down, and the head (not the
// embedding table, which is read by row).
double matmul_parameters(const ModelConfig& config);

// FLOPs of the micro-batches' forward and backward (whole rows, or a context-parallel share: each
// query's keys are counted from its document's start).
double step_model_flops(const ModelConfig& config, std::span<const HostMicroBatch> micro_batches, bool lora);

}  // namespace glm
