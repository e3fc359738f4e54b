// The flat parameter layout: every tensor's name, shape and offset in one buffer, grouped in units
// (embedding, each layer, head) so a unit is one contiguous range (ZeRO-3 gathers units).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace glm {

enum class ParamKind { embedding, norm, weight, bias };

struct ParamEntry {
  std::string name;  // THUDM checkpoint name, e.g. transformer.encoder.layers.0.mlp.dense_h_to_4h.weight
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, aligned to ParamLayout::kAlignment
  int64_t numel = 0;
  ParamKind kind = ParamKind::weight;
  int unit = 0;
  bool weight_decay() const { return kind == ParamKind::weight || kind == ParamKind::embedding; }
};

struct ParamUnit {
  int64_t offset = 0;  // first element (aligned)
  int64_t numel = 0;   // padded to a multiple of kAlignment
  std::vector<int> entries;
};

// Index of every tensor of one transformer layer inside ParamLayout::entries().
struct LayerEntries {
  int input_norm, qkv_weight, qkv_bias, dense, post_norm, h_to_4h, four_h_to_h;
};

class ParamLayout {
 public:
  static constexpr int64_t kAlignment = 64;  // elements: 128-byte bf16 / 256-byte fp32 boundaries

  // shards > 1 pads every unit to a multiple of shards x kAlignment so that each unit splits into
  // equal, aligned ZeRO shards (rank r owns the r-th slice of every unit).
  explicit ParamLayout(const ModelConfig& config, int shards = 1);

  const std::vector<ParamEntry>& entries() const { return entries_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  int64_t total_numel() const { return total_; }  // padded
  int shards() const { return shards_; }
  int64_t shard_numel(int unit) const { return units_[static_cast<size_t>(unit)].numel / shards_; }
  int64_t shard_offset(int unit, int rank) const {
    return units_[static_cast<size_t>(unit)].offset + rank * shard_numel(unit);
  }
  int64_t parameter_count() const;  // unpadded sum of tensor sizes
  int embedding_unit() const { return 0; }
  int layer_unit(int64_t layer) const { return static_cast<int>(layer) + 1; }
  int head_unit() const { return static_cast<int>(units_.size()) - 1; }

  int embedding() const { return embedding_; }
  int final_norm() const { return final_norm_; }
  int output() const { return output_; }
  const LayerEntries& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  const ParamEntry& entry(int index) const { return entries_[static_cast<size_t>(index)]; }
  // -1 when absent.
  int find(const std::string& name) const;

 private:
  int add(const std::string& name, std::vector<int64_t> shape, ParamKind kind);
  void begin_unit();
  void end_unit();

  std::vector<ParamEntry> entries_;
  std::vector<ParamUnit> units_;
  std::vector<LayerEntries> layers_;
  int embedding_ = -1, final_norm_ = -1, output_ = -1;
  int64_t total_ = 0;
  int shards_ = 1;
};

}  // namespace glm
