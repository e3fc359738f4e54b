// --deepspeed: every key of a DeepSpeed config gets one outcome (applied to an option, accepted
// without effect with a reason, or refused by name), on the DeepSpeed guide's ZeRO-2 offload config,
// a ZeRO-3 config with optimizer and scheduler blocks, ms-swift's presets, and broken input.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "cli/deepspeed_config.h"
#include "test_util.h"

namespace glm::test {
namespace {

using Outcome = DeepSpeedKey::Outcome;

std::string data(const std::string& name) { return std::string(GLM_SOURCE_DIR) + "/tests/data/deepspeed/" + name; }

std::map<std::string, DeepSpeedKey> by_key(const DeepSpeedConfig& c) {
  std::map<std::string, DeepSpeedKey> m;
  for (const DeepSpeedKey& k : c.keys) m[k.key] = k;
  return m;
}

void expect_applied(const std::map<std::string, DeepSpeedKey>& keys, const std::string& key, const std::string& option,
                    const std::string& text) {
  auto it = keys.find(key);
  ASSERT_NE(it, keys.end()) << key;
  EXPECT_EQ(it->second.outcome, Outcome::applied) << key << ": " << it->second.reason;
  EXPECT_EQ(it->second.option, option) << key;
  EXPECT_EQ(it->second.text, text) << key;
}

void expect_outcome(const std::map<std::string, DeepSpeedKey>& keys, const std::string& key, Outcome outcome,
                    const std::string& reason_part) {
  auto it = keys.find(key);
  ASSERT_NE(it, keys.end()) << key;
  EXPECT_EQ(it->second.outcome, outcome) << key << ": " << it->second.reason;
  EXPECT_NE(it->second.reason.find(reason_part), std::string::npos) << key << ": " << it->second.reason;
}

TEST(DeepSpeedConfig, GuideZero2OffloadConfigIsAccountedKeyByKey) {
  auto read = read_deepspeed_config(data("guide_zero2_offload.json"));
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  const DeepSpeedConfig& c = read.value();
  EXPECT_EQ(c.keys.size(), 21u) << c.account();
  EXPECT_TRUE(c.refused());  // fp16 only
  const auto keys = by_key(c);
  expect_applied(keys, "zero_optimization.stage", "zero_stage", "2");
  expect_applied(keys, "zero_optimization.reduce_bucket_size", "reduce_bucket_size", "200000000");
  expect_applied(keys, "zero_optimization.allgather_bucket_size", "allgather_bucket_size", "200000000");
  expect_applied(keys, "zero_optimization.overlap_comm", "overlap_comm", "true");
  expect_outcome(keys, "zero_optimization.contiguous_gradients", Outcome::no_effect, "contiguous buckets");
  expect_applied(keys, "zero_optimization.offload_optimizer.device", "offload_optimizer", "cpu");
  expect_applied(keys, "zero_optimization.offload_optimizer.pin_memory", "offload_pin_memory", "true");
  expect_outcome(keys, "fp16.enabled", Outcome::refused, "no fp16 path");
  expect_outcome(keys, "fp16.loss_scale_window", Outcome::no_effect, "loss scaling");
  expect_outcome(keys, "gradient_clipping", Outcome::no_effect, "auto: --max_grad_norm keeps its value");
  expect_outcome(keys, "train_batch_size", Outcome::no_effect, "global batch");
  // The account names every key once, in the file's order.
  const std::string account = c.account();
  EXPECT_LT(account.find("fp16.enabled"), account.find("zero_optimization.stage"));
  EXPECT_NE(account.find("fp16.enabled true: REFUSED"), std::string::npos) << account;
}

TEST(DeepSpeedConfig, Zero3OptimizerAndSchedulerBlocksMapOntoOptions) {
  auto read = read_deepspeed_config(data("zero3_bf16.json"));
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_FALSE(read.value().refused()) << read.value().account();
  const auto keys = by_key(read.value());
  expect_applied(keys, "zero_optimization.stage", "zero_stage", "3");
  expect_applied(keys, "optimizer.params.betas[1]", "adam_beta2", "0.95");
  expect_applied(keys, "optimizer.params.eps", "adam_epsilon", "1e-08");
  expect_applied(keys, "scheduler.type", "lr_scheduler_type", "cosine");
  expect_applied(keys, "scheduler.params.warmup_num_steps", "warmup_steps", "3");
  expect_applied(keys, "zero_optimization.stage3_prefetch_bucket_size", "prefetch_bucket_size", "5000000");
  expect_applied(keys, "zero_optimization.stage3_param_persistence_threshold", "param_persistence_threshold", "10000");
  expect_applied(keys, "gradient_accumulation_steps", "gradient_accumulation_steps", "2");
  expect_applied(keys, "gradient_clipping", "max_grad_norm", "0.5");
  expect_outcome(keys, "zero_optimization.offload_param.device", Outcome::no_effect, "no offload");
  expect_outcome(keys, "zero_optimization.stage3_max_live_parameters", Outcome::no_effect, "two layers gathered");
  expect_outcome(keys, "bf16.enabled", Outcome::no_effect, "auto");
}

TEST(DeepSpeedConfig, NoWarmupStepsMeansNoWarmup) {
  const std::string path = testing::TempDir() + "/ds_warmup.json";
  std::ofstream(path) << R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 0}}})";
  auto read = read_deepspeed_config(path);
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  const auto keys = by_key(read.value());
  expect_applied(keys, "scheduler.type", "lr_scheduler_type", "linear");
  expect_applied(keys, "scheduler.params.warmup_num_steps", "warmup_ratio", "0");
}

TEST(DeepSpeedConfig, PresetsSetTheStageOnly) {
  for (int stage = 1; stage <= 3; ++stage) {
    auto read = read_deepspeed_config("zero" + std::to_string(stage));
    ASSERT_TRUE(read.is_ok()) << read.status().message();
    ASSERT_EQ(read.value().keys.size(), 1u);
    expect_applied(by_key(read.value()), "zero_optimization.stage", "zero_stage", std::to_string(stage));
  }
}

TEST(DeepSpeedConfig, UnknownKeysAndMeaningsWeDoNotHaveAreRefusedByName) {
  const std::string path = testing::TempDir() + "/ds_unknown.json";
  std::ofstream(path) << R"({"zero_optimization": {"stage": 5, "stage3_typo": 1},
    "optimizer": {"type": "Lamb"}, "scheduler": {"type": "OneCycle"},
    "pipeline": {"enabled": true}, "compression_training": {"weight_quantization": {}}, "mystery": 1,
    "prescale_gradients": true, "communication_data_type": "fp16"})";
  auto read = read_deepspeed_config(path);
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  const auto keys = by_key(read.value());
  expect_outcome(keys, "zero_optimization.stage", Outcome::refused, "0, 1, 2 or 3");
  expect_outcome(keys, "zero_optimization.stage3_typo", Outcome::refused, "not a zero_optimization key");
  expect_outcome(keys, "optimizer.type", Outcome::refused, "AdamW");
  expect_outcome(keys, "scheduler.type", Outcome::refused, "WarmupCosineLR");
  expect_outcome(keys, "pipeline.enabled", Outcome::refused, "not part of glm_hpc");
  expect_outcome(keys, "mystery", Outcome::refused, "not a DeepSpeed key");
  expect_outcome(keys, "prescale_gradients", Outcome::refused, "target count");
  expect_outcome(keys, "communication_data_type", Outcome::refused, "fp32 or bf16");
  EXPECT_EQ(keys.count("compression_training.weight_quantization"), 0u) << "an empty block has no keys";
}

// ZeRO-Infinity's CPU block: both offloads applied, one pin_memory serving both, NVMe refused.
TEST(DeepSpeedConfig, Zero3ParameterOffloadMapsOntoOffloadParam) {
  const std::string path = testing::TempDir() + "/ds_offload_param.json";
  std::ofstream(path) << R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 5}}})";
  auto read = read_deepspeed_config(path);
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  const auto keys = by_key(read.value());
  EXPECT_FALSE(read.value().refused()) << read.value().account();
  expect_applied(keys, "zero_optimization.offload_param.device", "offload_param", "cpu");
  expect_applied(keys, "zero_optimization.offload_optimizer.pin_memory", "offload_pin_memory", "true");
  expect_outcome(keys, "zero_optimization.offload_param.pin_memory", Outcome::no_effect, "serves both");
  expect_outcome(keys, "zero_optimization.offload_param.buffer_count", Outcome::no_effect, "sizes its own staging");
  const std::string nvme = testing::TempDir() + "/ds_offload_param_nvme.json";
  std::ofstream(nvme) << R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"},
    "cpu_offload_params": true}})";
  auto refused = read_deepspeed_config(nvme);
  ASSERT_TRUE(refused.is_ok()) << refused.status().message();
  const auto nvme_keys = by_key(refused.value());
  expect_outcome(nvme_keys, "zero_optimization.offload_param.device", Outcome::refused, "not NVMe");
  expect_applied(nvme_keys, "zero_optimization.cpu_offload_params", "offload_param", "cpu");
}

TEST(DeepSpeedConfig, UnreadableOrNonObjectFilesAreOneClearError) {
  auto missing = read_deepspeed_config("/nonexistent/ds.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/ds.json"), std::string::npos) << missing.status().message();
  const std::string broken = testing::TempDir() + "/ds_broken.json";
  std::ofstream(broken) << "{\"zero_optimization\": {\"stage\": 2,";
  auto bad = read_deepspeed_config(broken);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("is not a JSON object"), std::string::npos) << bad.status().message();
  const std::string list = testing::TempDir() + "/ds_list.json";
  std::ofstream(list) << "[1, 2]";
  EXPECT_FALSE(read_deepspeed_config(list).is_ok());
}

}  // namespace
}  // namespace glm::test
