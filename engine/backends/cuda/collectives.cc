#include "engine/backends/cuda/collectives.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <dlfcn.h>

#include <barrier>
#include <cstdlib>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/status_macros.h"
#include "spdlog/spdlog.h"

namespace inferd::cuda {
namespace {

// The few NCCL declarations used, as its C ABI (nccl.h) defines them.
using ncclResult_t = int;
using ncclComm_t = struct ncclComm*;
constexpr int kNcclSuccess = 0;
constexpr int kNcclInt8 = 0, kNcclFloat16 = 6, kNcclBfloat16 = 9;  // ncclDataType_t
constexpr int kNcclSum = 0;                                        // ncclRedOp_t

}  // namespace

struct Collectives::Api {
  void* lib = nullptr;
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*destroy)(ncclComm_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;

  absl::Status Check(ncclResult_t r, const char* what) const {
    if (r == kNcclSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(what, ": ", error_string ? error_string(r) : "error ", r));
  }
};

// Two events per rank, alternating by call: a rank may record its event of call k + 1 before a slower rank has
// queued its wait on the one of call k (the barrier lets it), which must still mean call k.
struct Collectives::HostSync {
  explicit HostSync(int n) : arrived(n), ready(2 * n, nullptr) {}
  ~HostSync() {
    for (cudaEvent_t e : ready)
      if (e) cudaEventDestroy(e);
  }
  std::barrier<> arrived;
  std::vector<cudaEvent_t> ready;  // [call parity][rank]: the rank's work queued before that call
};

namespace {

// Loaded once for the process's life (NCCL keeps threads of its own).
absl::StatusOr<const Collectives::Api*> LoadNccl() {
  static Collectives::Api* api = nullptr;
  if (api) return api;
  auto loaded = std::make_unique<Collectives::Api>();
  loaded->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!loaded->lib) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine.tensor_parallel_size > 1 needs NCCL: libnccl.so.2 cannot be loaded (", dlerror(),
        "); install NCCL for CUDA 13 (the nvidia-nccl-cu13 wheel or the libnccl2 package) on the library path"));
  }
  bool found = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(loaded->lib, name));
    found = found && fn != nullptr;
  };
  sym(loaded->get_version, "ncclGetVersion");
  sym(loaded->init_all, "ncclCommInitAll");
  sym(loaded->destroy, "ncclCommDestroy");
  sym(loaded->error_string, "ncclGetErrorString");
  sym(loaded->all_reduce, "ncclAllReduce");
  sym(loaded->broadcast, "ncclBroadcast");
  if (!found) return absl::FailedPreconditionError("libnccl.so.2 lacks a function inferd needs (NCCL 2.9 or later)");
  api = loaded.release();
  return api;
}

// Whether every device can address every other's memory (turning peer access on where it can).
absl::StatusOr<bool> EnablePeerAccess(const std::vector<int>& devices) {
  for (int a : devices) {
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      INFERD_CUDA(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) return false;
      INFERD_CUDA(cudaSetDevice(a));
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clears it
      } else if (e != cudaSuccess) {
        return FromCuda(e, "cudaDeviceEnablePeerAccess");
      }
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Collectives>>> Collectives::Create(const std::vector<int>& devices,
                                                                              int64_t peer_capacity_bytes) {
  const int n = static_cast<int>(devices.size());
  const bool shared = std::set<int>(devices.begin(), devices.end()).size() < devices.size();
  std::vector<std::unique_ptr<Collectives>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(std::unique_ptr<Collectives>(new Collectives()));
    out[r]->device_ = devices[r];
    out[r]->rank_ = r;
    out[r]->size_ = n;
  }
  int current = 0;
  INFERD_CUDA(cudaGetDevice(&current));
  if (!shared) {
    // NVLink multicast (NVLS) stays off: its buffers are large and not every host allows it.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
    INFERD_ASSIGN_OR_RETURN(const Api* api, LoadNccl());
    int version = 0;
    api->get_version(&version);
    std::vector<ncclComm_t> comms(n);
    if (absl::Status st = api->Check(api->init_all(comms.data(), n, devices.data()), "ncclCommInitAll"); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat(st.message(), " (", n, " ranks)"));
    }
    for (int r = 0; r < n; ++r) {
      out[r]->api_ = api;
      out[r]->comm_ = comms[r];
    }
    spdlog::info("cuda: NCCL {} communicators for {} ranks (NVLS off)", version, n);
  }
  bool peer = peer_capacity_bytes > 0 && n <= kernels::kPeerMaxRanks;
  if (peer && !shared) {
    INFERD_ASSIGN_OR_RETURN(const bool reachable, EnablePeerAccess(devices));
    peer = reachable;
  }
  if (shared && !peer) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks sharing a GPU need the peer kernels: at most ", kernels::kPeerMaxRanks, " ranks"));
  }
  if (shared) {
    auto sync = std::make_shared<HostSync>(n);
    for (int r = 0; r < n; ++r) {
      INFERD_CUDA(cudaSetDevice(devices[r]));
      for (int parity = 0; parity < 2; ++parity) {
        INFERD_CUDA(cudaEventCreateWithFlags(&sync->ready[parity * n + r], cudaEventDisableTiming));
      }
      out[r]->sync_ = sync;
    }
  }
  if (peer) {
    kernels::PeerGroup group;
    group.size = n;
    group.capacity_bytes = peer_capacity_bytes;
    group.one_gpu = shared;
    for (int r = 0; r < n; ++r) {
      Collectives& c = *out[r];
      INFERD_CUDA(cudaSetDevice(devices[r]));
      INFERD_RETURN_IF_ERROR(c.peer_inboxes_.Allocate(kernels::PeerInboxBytes(peer_capacity_bytes, n)));
      INFERD_RETURN_IF_ERROR(c.peer_calls_.Allocate(kernels::kPeerCallBytes));
      INFERD_CUDA(cudaMemset(c.peer_inboxes_.get(), 0xFF, c.peer_inboxes_.bytes()));  // every inbox empty
      INFERD_CUDA(cudaMemset(c.peer_calls_.get(), 0, c.peer_calls_.bytes()));
      INFERD_CUDA(cudaDeviceSynchronize());
      group.inboxes[r] = c.peer_inboxes_.get<char>();
    }
    for (int r = 0; r < n; ++r) {
      Collectives& c = *out[r];
      c.peer_ = group;
      c.peer_.rank = r;
      c.peer_.calls = c.peer_calls_.get<uint32_t>();
      c.peer_.joins = out[0]->peer_calls_.get<uint32_t>() + 2;
      // Until measured, the peer kernels take what NCCL cannot (ranks sharing a GPU) or nothing.
      c.peer_limit_ = shared ? peer_capacity_bytes : 0;
    }
  }
  INFERD_CUDA(cudaSetDevice(current));
  return out;
}

Collectives::~Collectives() {
  if (comm_) api_->destroy(static_cast<ncclComm_t>(comm_));
}

absl::Status Collectives::Nccl(void* data, int64_t count, bool bf16, cudaStream_t stream) const {
  if (!comm_) {
    return absl::InternalError(absl::StrCat("a sum of ", count, " elements is larger than the peer kernels' ",
                                            peer_.capacity_bytes, " bytes and there is no NCCL communicator"));
  }
  return api_->Check(api_->all_reduce(data, data, static_cast<size_t>(count), bf16 ? kNcclBfloat16 : kNcclFloat16,
                                      kNcclSum, static_cast<ncclComm_t>(comm_), stream),
                     "ncclAllReduce");
}

absl::Status Collectives::AwaitPeers(cudaStream_t stream) const {
  if (!sync_) return absl::OkStatus();
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  INFERD_CUDA(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {
    return absl::InternalError(
        "ranks sharing a GPU cannot sum inside a CUDA graph (engine.cuda_graphs is off for them)");
  }
  cudaEvent_t* ready = sync_->ready.data() + (calls_++ % 2) * size_;
  INFERD_CUDA(cudaEventRecord(ready[rank_], stream));
  sync_->arrived.arrive_and_wait();  // every rank has recorded its event for this call
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) INFERD_CUDA(cudaStreamWaitEvent(stream, ready[q], 0));
  }
  return absl::OkStatus();
}

absl::Status Collectives::AllReduceSum(void* data, int64_t count, bool bf16, cudaStream_t stream) const {
  INFERD_RETURN_IF_ERROR(AwaitPeers(stream));
  if (has_peer() && count * 2 <= peer_limit_) {
    return FromCuda(bf16 ? kernels::PeerAllReduceSum(peer_, static_cast<__nv_bfloat16*>(data), count, stream)
                         : kernels::PeerAllReduceSum(peer_, static_cast<__half*>(data), count, stream),
                    "kernels::PeerAllReduceSum");
  }
  return Nccl(data, count, bf16, stream);
}

bool Collectives::FusesAddRmsNorm(int64_t rows, int64_t n) const {
  return has_peer() && rows * n * 2 <= peer_limit_ && kernels::PeerAllReduceAddRmsNormSupports(n);
}

absl::Status Collectives::AllReduceAddRmsNorm(const void* delta, void* residual, const void* weight, void* out,
                                              kernels::Fp8* q, float* scales, int64_t rows, int64_t n, float eps,
                                              bool bf16, cudaStream_t stream) const {
  if (!FusesAddRmsNorm(rows, n)) {
    return absl::InternalError(absl::StrCat("a sum fused with the norm over ", rows, " rows of ", n,
                                            " elements, which the peer kernels do not take"));
  }
  INFERD_RETURN_IF_ERROR(AwaitPeers(stream));
  auto run = [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    return kernels::PeerAllReduceAddRmsNorm(peer_, static_cast<const T*>(delta), static_cast<T*>(residual),
                                            static_cast<const T*>(weight), static_cast<T*>(out), q, scales, rows, n,
                                            eps, stream);
  };
  return FromCuda(bf16 ? run(static_cast<__nv_bfloat16*>(nullptr)) : run(static_cast<__half*>(nullptr)),
                  "kernels::PeerAllReduceAddRmsNorm");
}

absl::Status Collectives::Broadcast(void* data, int64_t bytes, cudaStream_t stream) const {
  INFERD_RETURN_IF_ERROR(AwaitPeers(stream));
  if (has_peer() && bytes <= peer_limit_) {
    return FromCuda(kernels::PeerBroadcast(peer_, static_cast<uint32_t*>(data), bytes / 4, stream),
                    "kernels::PeerBroadcast");
  }
  if (!comm_) return absl::InternalError("a broadcast larger than the peer kernels' buffers without NCCL");
  return api_->Check(api_->broadcast(data, data, static_cast<size_t>(bytes), kNcclInt8, /*root=*/0,
                                     static_cast<ncclComm_t>(comm_), stream),
                     "ncclBroadcast");
}

absl::Status Collectives::JoinRank0(cudaStream_t stream) const {
  if (!has_peer()) return absl::InternalError("a join with rank 0 without the peer kernels' buffers");
  if (sync_) return AwaitPeers(stream);  // ranks sharing a GPU: rank 0's stream waits for every rank's events
  return FromCuda(kernels::PeerJoinRank0(peer_, stream), "kernels::PeerJoinRank0");
}

absl::StatusOr<std::pair<double, double>> Collectives::TimeAllReduce(void* data, int64_t count, bool bf16,
                                                                     int iterations, cudaStream_t stream) {
  cudaEvent_t events[2] = {nullptr, nullptr};
  for (cudaEvent_t& e : events) INFERD_CUDA(cudaEventCreate(&e));
  double us[2] = {-1, -1};
  const int64_t limit = peer_limit_;
  absl::Status st;
  for (int way = 0; way < 2 && st.ok(); ++way) {  // 0: NCCL, 1: the peer kernels
    if ((way == 0 && !comm_) || (way == 1 && (!has_peer() || count * 2 > peer_.capacity_bytes))) continue;
    peer_limit_ = way == 1 ? count * 2 : 0;
    st = AllReduceSum(data, count, bf16, stream);  // warm-up
    if (st.ok()) st = FromCuda(cudaEventRecord(events[0], stream), "cudaEventRecord");
    for (int i = 0; i < iterations && st.ok(); ++i) st = AllReduceSum(data, count, bf16, stream);
    if (st.ok()) st = FromCuda(cudaEventRecord(events[1], stream), "cudaEventRecord");
    if (st.ok()) st = FromCuda(cudaEventSynchronize(events[1]), "cudaEventSynchronize");
    float ms = 0;
    if (st.ok()) st = FromCuda(cudaEventElapsedTime(&ms, events[0], events[1]), "cudaEventElapsedTime");
    us[way] = ms * 1e3 / iterations;
  }
  peer_limit_ = limit;
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  if (!st.ok()) return st;
  return std::pair{us[0], us[1]};
}

}  // namespace inferd::cuda
