// One-shot collectives between the ranks of a tensor-parallel model whose buffers every rank's GPU can address
// (peer access over NVLink, or ranks sharing one GPU): for the decode-sized messages where NCCL's fixed cost
// dominates. One kernel per call, on each rank's stream, and no barrier: the data is its own flag.
//   1. Every rank writes its message straight into every peer's inbox for it (NVLink stores, no round trip).
//   2. Each rank reads the messages in its own inboxes, waiting on each 2-byte element until it is no longer the
//      empty mark (all ones: a NaN no arithmetic produces; an input element of all ones is sent as 0x7FFF, also a
//      NaN), sums them with its own in rank order (fp32, rounded once: every rank gets the same bits) and writes
//      the empty mark back, so the inbox is ready for a later call.
// The sum fused with what follows it in a layer (PeerAllReduceAddRmsNorm) moves its rows the same way, one block a
// row, and adds and norms each row as it arrives.
// Each rank's inboxes come in two slots that alternate by call: a peer writes slot (c + 1) only after it has read
// this rank's message of call c, which this rank sent after its call c − 1 (the last reader of that slot) ended.
// The call count lives on the device (the last block of each call advances it), so the kernels capture into CUDA
// graphs and replay. Every rank must make the same calls in the same order, as with NCCL. The kernels launch as
// programmatic dependents and read nothing before their prerequisites end.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8.h"
#include "kernels/sizes.h"

namespace inferd::kernels {

// One rank's view of the group: device addresses, each usable from this rank's GPU.
struct PeerGroup {
  int rank = 0, size = 1;
  int64_t capacity_bytes = 0;         // of one inbox: the largest message
  char* inboxes[kPeerMaxRanks] = {};  // per rank: [2 slots][size senders][capacity_bytes], all ones at start
  uint32_t* calls = nullptr;          // this rank's: [0] calls ended, [1] blocks of the current call ended; zeroed
  uint32_t* joins = nullptr;          // rank 0's (every rank's view of it): [0] its joins, [r] rank r's; zeroed
  // The ranks share one GPU (tests of the split): every rank's blocks of a call must fit on it at once, so the
  // kernels keep to a few blocks and let no dependent kernel launch early.
  bool one_gpu = false;
};
// Their sizes: PeerInboxBytes and kPeerCallBytes (sizes.h).

// In place: `count` elements of T (__nv_bfloat16 or __half) at `data` become their sum over the ranks.
// count * sizeof(T) <= capacity_bytes, data 16-byte aligned.
template <typename T>
cudaError_t PeerAllReduceSum(const PeerGroup& group, T* data, int64_t count, cudaStream_t stream);

// Where the kernel after a sum is the residual add and RMSNorm (kernels/elementwise.h AddRmsNorm, or
// AddRmsNormFp8), both in one kernel: for each of `rows` rows of n elements, the ranks' `delta` rows summed (fp32 in
// rank order, rounded to T), added to the residual row (rounded to T, written back), and the row normed by
// `weight` into `out` in T, or, with out null, quantized per row into q and scales as AddRmsNormFp8 does. The bits
// of every output equal those of the sum followed by the norm kernel. delta is read, not written. Every rank holds
// the same residual afterwards. rows * n * sizeof(T) <= capacity_bytes; PeerAllReduceAddRmsNormSupports(n).
bool PeerAllReduceAddRmsNormSupports(int64_t n);
template <typename T>
cudaError_t PeerAllReduceAddRmsNorm(const PeerGroup& group, const T* delta, T* residual, const T* weight, T* out,
                                    Fp8* q, float* scales, int64_t rows, int64_t n, float eps, cudaStream_t stream);

// Rank 0's `words` 32-bit words at `data` land at every rank's `data`. words * 4 <= capacity_bytes; no word may
// be all ones (the empty mark: these are token ids). Rank 0 waits for no peer here, so it may start its next call
// while a peer still reads an earlier one: a sum (which waits for every peer) must come between two broadcasts,
// as it does in a step (a broadcast after the last layer's sums), or the streams must be synchronised.
cudaError_t PeerBroadcast(const PeerGroup& group, uint32_t* data, int64_t words, cudaStream_t stream);

// Rank 0's stream goes on only once every peer's stream has reached its call of the same number: what a peer
// wrote into rank 0's memory before its call (its part of a product, written straight into rank 0's buffer) is
// then there for what rank 0 runs after. A peer's call waits for nothing: it must not write that memory again
// before a later collective that waits for rank 0 (a sum; a broadcast from rank 0). Launched as an ordinary
// kernel, so that it starts only once everything before it on the stream has ended.
cudaError_t PeerJoinRank0(const PeerGroup& group, cudaStream_t stream);

}  // namespace inferd::kernels
