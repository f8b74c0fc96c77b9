// The one-shot peer collectives (kernels/all_reduce.h) against a CPU reference, with 2, 3, 4 and 8 ranks sharing
// this GPU (each on its own stream, as ranks on several GPUs would be): random bf16 and fp16 data of odd sizes
// (a tail past the last 16-byte vector, fewer elements than blocks, the largest message), many calls in a row of
// changing sizes (the inbox slots alternate and must never be read stale), and the same calls captured into
// one CUDA graph per rank and replayed. The sum is fp32 in rank order rounded once, so the reference is exact:
// every rank must hold the reference's bits. An element equal to the inbox's empty mark (a NaN) must still arrive.
// The broadcast hands rank 0's words to every rank. Where there are GPUs enough, the sums again with each rank on a
// GPU of its own (peer access over NVLink or PCIe), as a served model runs them.
#include "kernels/all_reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/peer_group.h"

namespace inferd {
namespace {

using testing::Bits;
using testing::FromFloatHost;
using testing::GpuCount;
using testing::HaveGpu;
using testing::PeerTestGroup;
using testing::ToFloatHost;
namespace k = kernels;

// `calls` all-reduces of the given sizes on every rank, run directly or captured once per rank and replayed
// `replays` times; checks every rank against the reference after each pass.
template <typename T>
void RunAndCheck(int n, const std::vector<int64_t>& sizes, bool graph, int replays, bool own_gpus = false) {
  int64_t largest = 0;
  for (int64_t c : sizes) largest = std::max(largest, c);
  PeerTestGroup group(n, largest * 2, own_gpus);
  std::mt19937 rng(n * 100 + static_cast<int>(sizes.size()));
  std::normal_distribution<float> d(0.f, 3.f);
  // Each call its own buffer per rank (a graph replays fixed addresses).
  std::vector<std::vector<T*>> data(sizes.size(), std::vector<T*>(n));
  std::vector<std::vector<std::vector<T>>> inputs(sizes.size(), std::vector<std::vector<T>>(n));
  for (size_t c = 0; c < sizes.size(); ++c) {
    for (int r = 0; r < n; ++r) {
      inputs[c][r].resize(sizes[c]);
      for (T& v : inputs[c][r]) v = FromFloatHost<T>(d(rng));
      group.Use(r);
      void* p = nullptr;
      ASSERT_EQ(cudaMalloc(&p, sizes[c] * 2 + 16), cudaSuccess);
      data[c][r] = static_cast<T*>(p);
    }
  }
  auto upload = [&] {
    for (size_t c = 0; c < sizes.size(); ++c)
      for (int r = 0; r < n; ++r) cudaMemcpy(data[c][r], inputs[c][r].data(), sizes[c] * 2, cudaMemcpyHostToDevice);
  };
  auto enqueue = [&](int r) {
    group.Use(r);
    for (size_t c = 0; c < sizes.size(); ++c) {
      ASSERT_EQ(k::PeerAllReduceSum<T>(group.groups[r], data[c][r], sizes[c], group.streams[r]), cudaSuccess);
    }
  };
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  if (graph) {
    for (int r = 0; r < n; ++r) {
      group.Use(r);
      cudaGraph_t g;
      ASSERT_EQ(cudaStreamBeginCapture(group.streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
      enqueue(r);
      ASSERT_EQ(cudaStreamEndCapture(group.streams[r], &g), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&execs[r], g, 0), cudaSuccess);
      cudaGraphDestroy(g);
    }
  }
  for (int pass = 0; pass < replays; ++pass) {
    upload();
    for (int r = 0; r < n; ++r) {
      if (graph) {
        group.Use(r);
        ASSERT_EQ(cudaGraphLaunch(execs[r], group.streams[r]), cudaSuccess);
      } else {
        enqueue(r);
      }
    }
    ASSERT_EQ(group.Synchronize(), cudaSuccess);
    for (size_t c = 0; c < sizes.size(); ++c) {
      std::vector<uint16_t> want(sizes[c]);
      for (int64_t i = 0; i < sizes[c]; ++i) {
        float acc = 0;
        for (int r = 0; r < n; ++r) acc += ToFloatHost(inputs[c][r][i]);
        want[i] = Bits(FromFloatHost<T>(acc));
      }
      for (int r = 0; r < n; ++r) {
        std::vector<T> got(sizes[c]);
        cudaMemcpy(got.data(), data[c][r], sizes[c] * 2, cudaMemcpyDeviceToHost);
        int64_t wrong = 0, first = -1;
        for (int64_t i = 0; i < sizes[c]; ++i) {
          if (Bits(got[i]) != want[i]) {
            if (first < 0) first = i;
            ++wrong;
          }
        }
        EXPECT_EQ(wrong, 0) << n << (own_gpus ? " ranks on their own GPUs" : " ranks") << ", call " << c << " ("
                            << sizes[c] << " elements), rank " << r << ", pass " << pass << (graph ? " (graph)" : "")
                            << ": first wrong at " << first;
      }
    }
  }
  for (cudaGraphExec_t e : execs)
    if (e) cudaGraphExecDestroy(e);
  for (auto& per_call : data)
    for (T* p : per_call) cudaFree(p);
}

TEST(PeerAllReduce, EveryRankHoldsTheRankOrderSumOfAllRanks) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  // Odd sizes: fewer than one vector, fewer vectors than blocks, a tail, decode rows of hidden 4096, a prefill.
  const std::vector<int64_t> sizes = {5, 8 * 7 + 3, 4096, 3 * 4096 + 1000 + 7, 64 * 4096, 11, 1000 * 1 + 1, 256 * 4096};
  for (int n : {2, 3, 4, 8}) {
    RunAndCheck<__nv_bfloat16>(n, sizes, /*graph=*/false, 2);
    RunAndCheck<__half>(n, sizes, /*graph=*/false, 1);
  }
}

TEST(PeerAllReduce, RanksOnGpusOfTheirOwnHoldTheSumDirectAndReplayed) {
  const int gpus = GpuCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const std::vector<int64_t> sizes = {5, 4096, 3 * 4096 + 1000 + 7, 64 * 4096, 128 * 4096 + 8, 256 * 4096};
  for (int n : {2, 4, 8}) {
    if (n > gpus) continue;
    RunAndCheck<__nv_bfloat16>(n, sizes, /*graph=*/false, 2, /*own_gpus=*/true);
    RunAndCheck<__half>(n, sizes, /*graph=*/true, 3, /*own_gpus=*/true);
  }
}

TEST(PeerAllReduce, CallsCapturedInGraphsGiveTheSumOnEveryReplay) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const std::vector<int64_t> sizes = {4096, 8 * 4096 + 8, 9, 4096, 128 * 4096};
  for (int n : {2, 4}) RunAndCheck<__nv_bfloat16>(n, sizes, /*graph=*/true, 5);
}

TEST(PeerBroadcast, EveryRankGetsRankZerosWords) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  for (int n : {2, 3, 8}) {
    PeerTestGroup group(n, 4096 * 4);
    std::mt19937 rng(n);
    for (int64_t words : {1, 7, 33, 256, 4096}) {
      for (int round = 0; round < 3; ++round) {  // both staging halves, twice
        std::vector<std::vector<uint32_t>> host(n, std::vector<uint32_t>(words));
        std::vector<uint32_t*> dev(n);
        for (int r = 0; r < n; ++r) {
          for (uint32_t& w : host[r]) w = rng() & 0x7FFFFFFFu;  // token ids: never all ones
          ASSERT_EQ(cudaMalloc(&dev[r], words * 4), cudaSuccess);
          cudaMemcpy(dev[r], host[r].data(), words * 4, cudaMemcpyHostToDevice);
        }
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(k::PeerBroadcast(group.groups[r], dev[r], words, group.streams[r]), cudaSuccess);
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (int r = 0; r < n; ++r) {
          std::vector<uint32_t> got(words);
          cudaMemcpy(got.data(), dev[r], words * 4, cudaMemcpyDeviceToHost);
          EXPECT_EQ(got, host[0]) << n << " ranks, " << words << " words, rank " << r;
          cudaFree(dev[r]);
        }
      }
    }
  }
}

TEST(PeerAllReduce, AMessageLargerThanTheInboxIsRefused) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  PeerTestGroup group(2, 1024);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  EXPECT_EQ(k::PeerAllReduceSum(group.groups[0], static_cast<__nv_bfloat16*>(p), 513, group.streams[0]),
            cudaErrorInvalidValue);
  EXPECT_EQ(k::PeerAllReduceSum(group.groups[0], static_cast<__nv_bfloat16*>(p), 512, group.streams[0]), cudaSuccess);
  // Its partner's call, so that the first ends.
  EXPECT_EQ(k::PeerAllReduceSum(group.groups[1], static_cast<__nv_bfloat16*>(p), 512, group.streams[1]), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(p);
}

// Each peer writes its part of rank 0's buffer on its own stream, after a long memset that keeps it busy, then
// joins; rank 0 joins and copies the buffer out. Rank 0 must see every peer's part of that round, never an earlier
// one. A broadcast from rank 0 separates the rounds, as it does a step's LM head from the next one's.
TEST(PeerJoinRank0, RankZeroSeesWhatEveryPeerWroteBeforeItsJoin) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  for (int n : {2, 4, 8}) {
    PeerTestGroup group(n, 4096);
    constexpr int64_t kPart = 1 << 16, kBusy = int64_t{64} << 20, kRounds = 6;
    char *buffer = nullptr, *busy = nullptr;
    unsigned char* seen = nullptr;
    ASSERT_EQ(cudaMalloc(&buffer, n * kPart), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&busy, (n - 1) * kBusy), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&seen, kRounds * n * kPart), cudaSuccess);
    std::vector<uint32_t*> words(n);
    for (auto& w : words) ASSERT_EQ(cudaMalloc(&w, 64), cudaSuccess);
    const auto mark = [n](int round, int r) { return static_cast<unsigned char>(1 + (round * n + r) % 250); };
    for (int round = 0; round < kRounds; ++round) {
      for (int r = 1; r < n; ++r) {
        cudaStream_t s = group.streams[r];
        ASSERT_EQ(cudaMemsetAsync(busy + (r - 1) * kBusy, round, kBusy, s), cudaSuccess);
        ASSERT_EQ(cudaMemsetAsync(buffer + r * kPart, mark(round, r), kPart, s), cudaSuccess);
        ASSERT_EQ(k::PeerJoinRank0(group.groups[r], s), cudaSuccess);
      }
      cudaStream_t s0 = group.streams[0];
      ASSERT_EQ(cudaMemsetAsync(buffer, mark(round, 0), kPart, s0), cudaSuccess);
      ASSERT_EQ(k::PeerJoinRank0(group.groups[0], s0), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(seen + round * n * kPart, buffer, n * kPart, cudaMemcpyDeviceToHost, s0), cudaSuccess);
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(k::PeerBroadcast(group.groups[r], words[r], 16, group.streams[r]), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int round = 0; round < kRounds; ++round) {
      for (int r = 0; r < n; ++r) {
        int64_t wrong = 0;
        for (int64_t i = 0; i < kPart; ++i) wrong += seen[(round * n + r) * kPart + i] != mark(round, r);
        EXPECT_EQ(wrong, 0) << n << " ranks, round " << round << ": rank " << r << "'s part";
      }
    }
    for (auto* w : words) cudaFree(w);
    cudaFree(buffer);
    cudaFree(busy);
    cudaFreeHost(seen);
  }
}

TEST(PeerJoinRank0, AGroupWithoutJoinCountersIsRefused) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  k::PeerGroup g;
  g.size = 2;
  EXPECT_EQ(k::PeerJoinRank0(g, nullptr), cudaErrorInvalidValue);
}

// An input element of all ones (a NaN, the inbox's empty mark) must arrive as a NaN, not be waited for forever.
TEST(PeerAllReduce, AnElementEqualToTheEmptyMarkArrives) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  PeerTestGroup group(2, 64 * 2);
  std::vector<uint16_t> host(21, 0x3F80);  // 1.0 in bf16
  host[3] = 0xFFFF;                        // a vector's element
  host[17] = 0xFFFF;                       // the tail's
  std::vector<__nv_bfloat16*> dev(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaMalloc(&dev[r], 64), cudaSuccess);
    cudaMemcpy(dev[r], host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(k::PeerAllReduceSum(group.groups[r], dev[r], static_cast<int64_t>(host.size()), group.streams[r]),
              cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int r = 0; r < 2; ++r) {
    std::vector<__nv_bfloat16> got(host.size());
    cudaMemcpy(got.data(), dev[r], host.size() * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < host.size(); ++i) {
      const float v = ToFloatHost(got[i]);
      if (host[i] == 0xFFFF) {
        EXPECT_TRUE(std::isnan(v)) << "rank " << r << ", element " << i;
      } else {
        EXPECT_EQ(v, 2.f) << "rank " << r << ", element " << i;
      }
    }
    cudaFree(dev[r]);
  }
}

}  // namespace
}  // namespace inferd
