// Global sample stream: epoch e is a Fisher-Yates shuffle seeded by (seed, e).
#include "data/sharded_loader.h"

#include <cmath>
#include <numbers>

namespace glm {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

void append_document(HostMicroBatch& batch, SampleView sample) {
  const int32_t start = static_cast<int32_t>(batch.tokens.size());
  const size_t n = sample.tokens.size();
  for (size_t i = 0; i < n; ++i) {
    batch.tokens.push_back(sample.tokens[i]);
    const int32_t target = i + 1 < n ? sample.labels[i + 1] : -1;
    const bool trained = target >= 0;
    batch.targets.push_back(trained ? target : -1);
    batch.target_count += trained ? 1 : 0;
    batch.positions.push_back(static_cast<int32_t>(i));
    batch.doc_start.push_back(start);
  }
}

ShardedLoader::ShardedLoader(const Dataset& dataset, uint64_t seed, int rank, int world_size, int64_t per_device_batch,
                             int64_t gradient_accumulation_steps, const PackingPlan* packing)
    : dataset_(dataset),
      packing_(packing),
      seed_(seed),
      rank_(rank),
      world_size_(world_size),
      per_device_batch_(per_device_batch),
      accumulation_(gradient_accumulation_steps) {}

int64_t ShardedLoader::epoch_size() const { return packing_ != nullptr ? packing_->rows() : dataset_.size(); }

int64_t ShardedLoader::unit_at(int64_t stream_index) {
  const int64_t n = epoch_size();
  const int64_t epoch = stream_index / n;
  if (epoch != cached_epoch_) {
    order_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order_[i] = i;
    SplitMix64 rng(seed_ * 0x2545f4914f6cdd1dULL + static_cast<uint64_t>(epoch) + 1);
    for (int64_t i = n - 1; i > 0; --i) std::swap(order_[i], order_[rng.next() % static_cast<uint64_t>(i + 1)]);
    cached_epoch_ = epoch;
  }
  return order_[static_cast<size_t>(stream_index % n)];
}

HostMicroBatch ShardedLoader::micro_batch(int64_t step, int64_t micro) {
  HostMicroBatch batch;
  const int64_t first = step * global_batch_size() + (micro * world_size_ + rank_) * per_device_batch_;
  for (int64_t b = 0; b < per_device_batch_; ++b) {
    const int64_t unit = unit_at(first + b);
    if (packing_ == nullptr) {
      append_document(batch, dataset_.sample(unit));
      continue;
    }
    for (int64_t sample : packing_->row(unit)) append_document(batch, dataset_.sample(sample));
  }
  return batch;
}

}  // namespace glm
