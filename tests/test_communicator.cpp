// MpiCommunicator collectives with exactly representable data (integers), blocking and
// non-blocking, in place and out of place, every dtype, any world size (run under mpirun).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "mpi/mpi_communicator.h"

namespace glm::test {
namespace {

MpiCommunicator& world() {
  static MpiCommunicator comm(MPI_COMM_WORLD, std::chrono::seconds(60));
  return comm;
}

TEST(MpiCommunicator, AllReduceSumMaxMinExact) {
  auto& c = world();
  const int n = c.size(), r = c.rank();
  std::vector<float> f(1001);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(r + 1) * static_cast<float>(i % 17);
  ASSERT_TRUE(c.all_reduce(f.data(), f.data(), f.size(), CommType::f32, ReduceOp::sum).is_ok());
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(f[i], ranks_sum * static_cast<float>(i % 17)) << i;
  int64_t v[2] = {r, -r}, out[2] = {0, 0};
  ASSERT_TRUE(c.all_reduce(v, out, 1, CommType::i64, ReduceOp::max).is_ok());
  EXPECT_EQ(out[0], n - 1);
  ASSERT_TRUE(c.all_reduce(v + 1, out + 1, 1, CommType::i64, ReduceOp::min).is_ok());
  EXPECT_EQ(out[1], -(n - 1));
  double d = 0.5 * r;
  ASSERT_TRUE(c.all_reduce(&d, &d, 1, CommType::f64, ReduceOp::sum).is_ok());
  EXPECT_EQ(d, 0.5 * n * (n - 1) / 2);
}

TEST(MpiCommunicator, Bf16SumThroughFloat) {
  auto& c = world();
  // 1.0 in bf16 is 0x3f80; the sum of n ones (n <= 8) is exact in bf16.
  std::vector<uint16_t> x(33, 0x3f80);
  ASSERT_TRUE(c.all_reduce(x.data(), x.data(), x.size(), CommType::bf16, ReduceOp::sum).is_ok());
  float expected = static_cast<float>(c.size());
  uint32_t bits;
  std::memcpy(&bits, &expected, 4);
  for (uint16_t v : x) EXPECT_EQ(v, static_cast<uint16_t>(bits >> 16));
}

TEST(MpiCommunicator, ReduceScatterAndAllGatherRoundTrip) {
  auto& c = world();
  const int n = c.size(), r = c.rank();
  const size_t block = 37;  // odd block size
  std::vector<int32_t> send(block * n), recv(block);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<int32_t>(i) * (r + 1);
  ASSERT_TRUE(c.reduce_scatter(send.data(), recv.data(), block, CommType::i32, ReduceOp::sum).is_ok());
  const int32_t factor = n * (n + 1) / 2;
  for (size_t i = 0; i < block; ++i) ASSERT_EQ(recv[i], static_cast<int32_t>(r * block + i) * factor);
  std::vector<int32_t> gathered(block * n, -1);
  ASSERT_TRUE(c.all_gather(recv.data(), gathered.data(), block, CommType::i32).is_ok());
  for (size_t i = 0; i < gathered.size(); ++i) ASSERT_EQ(gathered[i], static_cast<int32_t>(i) * factor);
  // In place: this rank's block already sits in the output buffer.
  std::vector<int32_t> inplace(block * n, -1);
  for (size_t i = 0; i < block; ++i) inplace[r * block + i] = static_cast<int32_t>(r * 1000 + i);
  ASSERT_TRUE(c.all_gather(inplace.data() + r * block, inplace.data(), block, CommType::i32).is_ok());
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < block; ++i) ASSERT_EQ(inplace[q * block + i], static_cast<int32_t>(q * 1000 + i));
}

// Grouped collectives (ZeRO's multi-unit buckets): each part reduced or gathered in its own
// buffers, with its own (odd) size; an empty group is a valid request.
TEST(MpiCommunicator, GroupedReduceScatterAndInPlaceAllGather) {
  auto& c = world();
  const int n = c.size(), r = c.rank();
  const size_t blocks[3] = {5, 1, 37};
  std::vector<std::vector<int32_t>> send(3), recv(3), full(3);
  std::vector<CommPart> rs, ag;
  for (size_t p = 0; p < 3; ++p) {
    send[p].resize(blocks[p] * n);
    for (size_t i = 0; i < send[p].size(); ++i) send[p][i] = static_cast<int32_t>(100 * p + i) * (r + 1);
    recv[p].assign(blocks[p], -1);
    rs.push_back({send[p].data(), recv[p].data(), blocks[p]});
  }
  ASSERT_TRUE(c.start_reduce_scatter_group(rs, CommType::i32, ReduceOp::sum)->wait().is_ok());
  const int32_t factor = n * (n + 1) / 2;
  for (size_t p = 0; p < 3; ++p)
    for (size_t i = 0; i < blocks[p]; ++i)
      ASSERT_EQ(recv[p][i], static_cast<int32_t>(100 * p + r * blocks[p] + i) * factor) << "part " << p;
  for (size_t p = 0; p < 3; ++p) {
    full[p].assign(blocks[p] * n, -1);
    std::copy(recv[p].begin(), recv[p].end(), full[p].begin() + static_cast<std::ptrdiff_t>(r * blocks[p]));
    ag.push_back({full[p].data() + r * blocks[p], full[p].data(), blocks[p]});
  }
  ASSERT_TRUE(c.start_all_gather_group(ag, CommType::i32)->wait().is_ok());
  for (size_t p = 0; p < 3; ++p)
    for (size_t i = 0; i < full[p].size(); ++i)
      ASSERT_EQ(full[p][i], static_cast<int32_t>(100 * p + i) * factor) << "part " << p;
  EXPECT_TRUE(c.start_all_gather_group({}, CommType::i32)->wait().is_ok());
}

TEST(MpiCommunicator, NonBlockingCollectivesOverlap) {
  auto& c = world();
  const int n = c.size();
  std::vector<double> a(513, 1.0), b(257, 2.0);
  auto ra = c.start_all_reduce(a.data(), a.data(), a.size(), CommType::f64, ReduceOp::sum);
  auto rb = c.start_all_reduce(b.data(), b.data(), b.size(), CommType::f64, ReduceOp::sum);
  // Work between start and wait is the point of the non-blocking form.
  volatile double busy = 0;
  for (int i = 0; i < 100000; ++i) busy = busy + i;
  ASSERT_TRUE(rb->wait().is_ok());
  ASSERT_TRUE(ra->wait().is_ok());
  for (double v : a) ASSERT_EQ(v, n);
  for (double v : b) ASSERT_EQ(v, 2.0 * n);
}

TEST(MpiCommunicator, BroadcastAndBarrier) {
  auto& c = world();
  const int root = c.size() - 1;
  std::vector<uint8_t> buf(300, static_cast<uint8_t>(c.rank()));
  if (c.rank() == root)
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(c.broadcast(buf.data(), buf.size(), CommType::u8, root).is_ok());
  for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], static_cast<uint8_t>(i * 7));
  ASSERT_TRUE(c.barrier().is_ok());
}

TEST(MpiCommunicator, TooLargeReduceScatterBlockIsAnError) {
  auto& c = world();
  char dummy = 0;
  Status s = c.reduce_scatter(&dummy, &dummy, size_t{1} << 31, CommType::u8, ReduceOp::sum);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("2^31"), std::string::npos);
}

}  // namespace
}  // namespace glm::test
