// ZeRO's parameters outside the persistent unit and the collectives that gather them:
//   stages 0-2: the full parameters on every rank; stages 1-2 all-gather each rank's updated
//     shards after the optimizer in buckets of consecutive units (forward order);
//   stage 3: this rank's shards only; a unit is all-gathered just before the model uses it, the
//     next unit prefetched into a second buffer while the current one computes. With
//     offload_params the shards of offloaded_param_units() live in host memory: a gather of one
//     first uploads this rank's shard into its block of the gathered buffer (on a copy stream,
//     after the compute that read the buffer's previous unit), then all-gathers in place once the
//     upload is done.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/param_layout.h"
#include "mpi/communicator.h"
#include "zero/collectives.h"
#include "zero/comm_buckets.h"
#include "zero/sharding_plan.h"
#include "zero/zero_options.h"

namespace glm {

class ParamGatherer {
 public:
  static Result<std::unique_ptr<ParamGatherer>> create(const ParamLayout& layout, Backend& backend, Communicator& data,
                                                       const ShardingPlan& plan, const ZeroOptions& options,
                                                       const ZeroBufferSizes& sizes, CommWaits& waits);
  // All-gathers still in flight (stages 1-2 with --overlap_comm) finish first.
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Units other than the persistent one.
  Result<Tensor> acquire(int unit);
  Status prefetch(int unit);
  // The whole unit (stage 0) or this rank's shard of it: host memory where params_on_host(unit).
  Tensor owned_params(int unit) const;
  bool params_on_host(int unit) const { return plan_.shard_params && on_host_[static_cast<size_t>(unit)]; }
  // After the optimizer wrote owned_params(unit), units in forward order: with --overlap_comm
  // stages 1-2 start the all-gather of the bucket that unit completes.
  Status unit_updated(int unit);
  // After every unit_updated(): without --overlap_comm stages 1-2 gather every bucket and wait.
  Status finish_update();
  // Waits for every stage 1-2 all-gather still in flight.
  Status settle();
  // Stage 3: gathered copies are stale once parameters change; finish any gather, drop them.
  Status forget_gathered();
  // fill(dst, global_begin) over what this rank stores, but the persistent unit's, where it meets
  // the global range [begin, end). dst is backend memory: host-held shards are staged through a
  // gathered buffer (uploaded first where the range covers them only in part).
  Status fill_stored(const std::function<Status(Tensor dst, int64_t global_begin)>& fill, int64_t begin = 0,
                     int64_t end = INT64_MAX);
  // read(a copy of the host-held shard of unit in the first gathered buffer); the gathered units
  // must have been forgotten.
  Status read_stored(int unit, const std::function<Status(Tensor stored)>& read);
  int64_t param_bytes() const;       // backend memory
  int64_t host_param_bytes() const;  // host memory (offload_params)
  int64_t buffer_bytes() const;

 private:
  ParamGatherer(const ParamLayout& layout, Backend& backend, Communicator& data, const ShardingPlan& plan,
                const ZeroOptions& options, CommWaits& waits)
      : layout_(layout), backend_(backend), data_(data), plan_(plan), options_(options), waits_(waits) {}
  Tensor shard(int unit) const {
    const size_t u = static_cast<size_t>(unit);
    return (on_host_[u] ? host_shards_ : param_shards_).slice(stored_offsets_[u], layout_.shard_numel(unit));
  }

  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& data_;
  ShardingPlan plan_;
  ZeroOptions options_;
  CommWaits& waits_;
  CommType type_ = CommType::f32;
  Buffer params_;  // stages 0-2: the full parameters
  // Stage 3: this rank's shards of every unit but the persistent one, on the device or (on_host_)
  // in host memory, each at its stored_offsets_ entry in its store.
  Buffer param_shards_, host_shards_;
  std::vector<bool> on_host_;
  std::vector<int64_t> stored_offsets_;

  // Stage 3: two unit-sized buffers of gathered parameters, the one in use and the prefetch.
  struct Gathered {
    Buffer params;
    int unit = -1;
    std::unique_ptr<CommRequest> in_flight;
    std::unique_ptr<AsyncCopy> upload;  // offload_params: this rank's shard coming from the host
  };
  Gathered gathered_[2];
  int held_slot_ = -1;  // the slot of the unit the model acquired last
  Status gather_into(int slot, int unit);
  Status upload_and_gather(Gathered& g, int unit);

  // Stages 1-2: parameter all-gathers after the optimizer, buckets in forward order.
  std::vector<CommBucket> buckets_;
  std::vector<int> bucket_of_unit_;
  struct InFlight {
    std::unique_ptr<CommRequest> request;
    int bucket = -1;
  };
  std::vector<InFlight> in_flight_;
  Status gather_bucket(int bucket);
  Status finish(InFlight& g);
  Status finish_bucket_of(int unit);  // the in-flight gather of unit's bucket, if any
};

}  // namespace glm
