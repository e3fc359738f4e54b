// The flat parameter layout: every tensor's name, shape and offset in one buffer, grouped in units
// (embedding, each layer, head) so a unit is one contiguous range (ZeRO-3 gathers units). Small
// tensors may instead be persistent: moved into one trailing unit that ZeRO-3 keeps whole on every
// rank (DeepSpeed's parameter persistence).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "model/config.h"

namespace glm {

// v rounded up to a multiple of a (a > 0).
constexpr int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

enum class ParamKind { embedding, norm, weight, bias };

struct ParamEntry {
  std::string name;  // THUDM checkpoint name, e.g. transformer.encoder.layers.0.mlp.dense_h_to_4h.weight
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, aligned to ParamLayout::kAlignment
  int64_t numel = 0;
  ParamKind kind = ParamKind::weight;
  int unit = 0;
  // The unit the tensor belongs to (embedding, a layer, head) and its offset inside that unit in the
  // layout without persistent tensors: what checkpoints index. `unit` differs only when persistent.
  int home_unit = 0;
  int64_t home_offset = 0;
  bool persistent = false;  // lives in ParamLayout::persistent_unit()
  bool weight_decay() const { return kind == ParamKind::weight || kind == ParamKind::embedding; }
};

struct ParamUnit {
  int64_t offset = 0;  // first element (aligned)
  int64_t numel = 0;   // padded to a multiple of kAlignment
  std::vector<int> entries;
};

// Which tensors are persistent, with DeepSpeed's meanings (stage3_param_persistence_threshold,
// stage3_model_persistence_threshold): in layout order, a tensor of at most max_tensor_numel
// elements is persistent unless it would take the persistent total past max_total_numel.
struct PersistencePolicy {
  static constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
  int64_t max_tensor_numel = 0;  // 0: no tensor is persistent
  int64_t max_total_numel = kUnlimited;
};

// Index of every tensor of one transformer layer inside ParamLayout::entries().
struct LayerEntries {
  int input_norm, qkv_weight, qkv_bias, dense, post_norm, h_to_4h, four_h_to_h;
};

class ParamLayout {
 public:
  static constexpr int64_t kAlignment = 64;  // elements: 128-byte bf16 / 256-byte fp32 boundaries

  // shards > 1 pads every unit to a multiple of shards x kAlignment so that each unit splits into
  // equal, aligned ZeRO shards (rank r owns the r-th slice of every unit). Persistent tensors (none
  // by default) leave their units, in order, for a last unit after the head; a unit whose tensors
  // are all persistent is empty (0 elements). Entry indices do not depend on either argument.
  explicit ParamLayout(const ModelConfig& config, int shards = 1, const PersistencePolicy& persistence = {});

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
  int head_unit() const { return home_units_ - 1; }
  // Units a tensor can belong to (embedding, layers, head): units() less the persistent unit.
  int home_units() const { return home_units_; }
  // The unit of persistent tensors, last; -1 when there are none.
  int persistent_unit() const { return persistent_unit_; }
  int persistent_tensors() const;
  int64_t persistent_parameter_count() const;  // unpadded sum of persistent tensor sizes

  int embedding() const { return embedding_; }
  int final_norm() const { return final_norm_; }
  int output() const { return output_; }
  const LayerEntries& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  const ParamEntry& entry(int index) const { return entries_[static_cast<size_t>(index)]; }
  // -1 when absent.
  int find(const std::string& name) const;

 private:
  // Declares a tensor of the home unit being declared; offsets are assigned by place().
  int add(const std::string& name, std::vector<int64_t> shape, ParamKind kind);
  void place(int entry);
  void begin_unit();
  void end_unit();

  std::vector<ParamEntry> entries_;
  std::vector<ParamUnit> units_;
  std::vector<LayerEntries> layers_;
  int embedding_ = -1, final_norm_ = -1, output_ = -1;
  int home_units_ = 0, persistent_unit_ = -1;
  int64_t total_ = 0;
  int shards_ = 1;
};

}  // namespace glm
