// One-shot collectives between the ranks of a tensor-parallel model whose buffers every rank's GPU can address
// (peer access over NVLink, or ranks sharing one GPU): for the decode-sized messages where NCCL's fixed cost
// dominates. One kernel per call, on each rank's stream, in a fixed grid of kPeerBlocks blocks:
//   1. each block copies its slice of the rank's data into the rank's staging buffer (one of two, by call parity);
//   2. it raises its flag in every peer's flag array with the call's number, and waits until every peer's block
//      of the same index has raised its own here (a barrier per block, no grid-wide sync);
//   3. it reads that slice of every rank's staging buffer, in rank order, and writes the sum (fp32 accumulation,
//      rounded once) over its data: every rank gets the same bits. A broadcast copies rank 0's slice instead.
// Two staging buffers alternate by call: a rank reuses one only after every peer has started the next call, so
// after each peer's previous kernel (which read it) has ended. Call numbers live on the device (one counter per
// block), so the kernels capture into CUDA graphs and replay. Every rank must make the same calls in the same
// order, as with NCCL.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

constexpr int kPeerMaxRanks = 8;
constexpr int kPeerBlocks = 32;

// One rank's view of the group: device addresses, each usable from this rank's GPU.
struct PeerGroup {
  int rank = 0, size = 1;
  int64_t capacity_bytes = 0;           // of each staging half: the largest message
  char* staging[kPeerMaxRanks] = {};    // per rank: 2 * capacity_bytes
  uint32_t* flags[kPeerMaxRanks] = {};  // per rank: [kPeerBlocks][kPeerMaxRanks] call numbers, zeroed
  uint32_t* counters = nullptr;         // this rank's: [kPeerBlocks] calls made, zeroed
};

// Bytes of one rank's staging (both halves), flags and counters for messages of up to capacity_bytes.
int64_t PeerStagingBytes(int64_t capacity_bytes);
int64_t PeerFlagBytes();
int64_t PeerCounterBytes();

// In place: `count` elements of T (__nv_bfloat16 or __half) at `data` become their sum over the ranks.
// count * sizeof(T) <= capacity_bytes.
template <typename T>
cudaError_t PeerAllReduceSum(const PeerGroup& group, T* data, int64_t count, cudaStream_t stream);

// Rank 0's `words` 32-bit words at `data` land at every rank's `data`. words * 4 <= capacity_bytes.
cudaError_t PeerBroadcast(const PeerGroup& group, uint32_t* data, int64_t words, cudaStream_t stream);

}  // namespace inferd::kernels
