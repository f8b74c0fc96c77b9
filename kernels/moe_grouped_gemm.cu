#include <algorithm>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_code.h"
#include "kernels/moe_grouped_gemm.h"

namespace inferd::kernels {
namespace {

using namespace cute;  // NOLINT: CUTLASS's shapes read as its documentation writes them

// The CUTLASS element of a CUDA one.
template <typename T>
using CutlassOf =
    std::conditional_t<std::is_same_v<T, __nv_bfloat16>, cutlass::bfloat16_t,
                       std::conditional_t<std::is_same_v<T, __half>, cutlass::half_t,
                                          std::conditional_t<std::is_same_v<T, Fp8>, cutlass::float_e4m3_t, float>>>;

// One GEMM type per input and output element and run length: 128-row tiles, k of 64 (128 for e4m3 inputs: the same
// bytes a stage), the cooperative warp-specialised schedule (two consumer warp groups on one tile), CTA pairs along
// N (two weight tiles of one expert sharing its rows' tile; pairs along M, FlashInfer's choice for its segment GEMM,
// measured 2% slower at prefill's runs of ~256 rows). kFew, a step's runs under 32 rows an expert on average (decode
// batches): 128 x 128 tiles stored straight from registers. Else 128 x 256 tiles stored through shared memory by
// TMA (the epilogue's own per-group descriptors), which win from 32 rows an expert and lose a little below it
// (kernels/NOTES.md). e4m3 inputs take CUTLASS's fast-accumulation FP8 main loop (the tensor cores' own
// accumulation, as the dense fp8 products: kernels/fp8_gemm_kernel.cuh).
template <typename In, typename Out, bool kFew>
struct Grouped {
  using ElementIn = CutlassOf<In>;
  using ElementOut = CutlassOf<Out>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;     // X: rows of k
  using LayoutB = cutlass::layout::ColumnMajor;  // W: [n, k], each output column's k contiguous
  using LayoutD = cutlass::layout::RowMajor;     // Y: rows of n
  static constexpr int kAlignIn = 128 / cutlass::sizeof_bits<ElementIn>::value;
  static constexpr int kAlignOut = 128 / cutlass::sizeof_bits<ElementOut>::value;
  using TileK = std::conditional_t<sizeof(In) == 1, _128, _64>;
  using TileShape = Shape<_128, std::conditional_t<kFew, _128, _256>, TileK>;
  using ClusterShape = Shape<_1, _2, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementOut, LayoutD*, kAlignOut, ElementOut,
      LayoutD*, kAlignOut,
      std::conditional_t<kFew, cutlass::epilogue::PtrArrayNoSmemWarpSpecialized,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementIn, LayoutA*, kAlignIn, ElementIn, LayoutB*, kAlignIn,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      std::conditional_t<sizeof(In) == 1, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
};

// The workspace's regions, each 256-byte aligned: per group its shape, the three operands' pointers and strides,
// then CUTLASS's workspace.
struct Regions {
  size_t shapes, a, b, d, stride_a, stride_b, stride_d, cutlass, end;
};
constexpr size_t Align(size_t v) {
  return (v + 255) / 256 * 256;
}
template <typename In, typename Out, bool kFew>
Regions RegionsOf(int32_t experts) {
  using G = Grouped<In, Out, kFew>;
  Regions r{};
  size_t at = 0;
  const auto take = [&](size_t bytes) {
    const size_t here = at;
    at += Align(bytes);
    return here;
  };
  r.shapes = take(experts * sizeof(typename G::Shape3));
  r.a = take(experts * sizeof(void*));
  r.b = take(experts * sizeof(void*));
  r.d = take(experts * sizeof(void*));
  r.stride_a = take(experts * sizeof(typename G::StrideA));
  r.stride_b = take(experts * sizeof(typename G::StrideB));
  r.stride_d = take(experts * sizeof(typename G::StrideD));
  r.cutlass = at;
  r.end = at;
  return r;
}

template <typename In, typename Out, bool kFew>
typename Grouped<In, Out, kFew>::Gemm::Arguments ArgumentsOf(unsigned char* base, const Regions& r, int32_t experts,
                                                             int sm_count) {
  using G = Grouped<In, Out, kFew>;
  using E = typename G::ElementIn;
  using D = typename G::ElementOut;
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  typename G::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {experts, reinterpret_cast<typename G::Shape3*>(base + r.shapes), nullptr},
      {reinterpret_cast<const E**>(base + r.a), reinterpret_cast<typename G::StrideA*>(base + r.stride_a),
       reinterpret_cast<const E**>(base + r.b), reinterpret_cast<typename G::StrideB*>(base + r.stride_b)},
      {{},
       reinterpret_cast<const D**>(base + r.d),
       reinterpret_cast<typename G::StrideD*>(base + r.stride_d),
       reinterpret_cast<D**>(base + r.d),
       reinterpret_cast<typename G::StrideD*>(base + r.stride_d)},
      hw};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;  // D alone: C (the same pointers) is never read
  return args;
}

// A thread an expert: its group's shape (its run's rows, n, k), operands and strides.
template <typename In, typename Out, bool kFew>
__global__ void GroupsKernel(const In* __restrict__ x, const In* __restrict__ w, const int32_t* __restrict__ offsets,
                             int32_t experts, Out* y, int64_t n, int64_t k, unsigned char* base, Regions r) {
  using G = Grouped<In, Out, kFew>;
  WaitForPrerequisites();  // the offsets are MoeRoute's, the rows the gather's
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
    const int32_t begin = offsets[e], rows = offsets[e + 1] - begin;
    reinterpret_cast<typename G::Shape3*>(base + r.shapes)[e] =
        typename G::Shape3(rows, static_cast<int>(n), static_cast<int>(k));
    reinterpret_cast<const In**>(base + r.a)[e] = x + int64_t{begin} * k;
    reinterpret_cast<const In**>(base + r.b)[e] = w + int64_t{e} * n * k;
    reinterpret_cast<Out**>(base + r.d)[e] = y + int64_t{begin} * n;
    typename G::StrideA sa{};
    get<0>(sa) = k;
    typename G::StrideB sb{};
    get<0>(sb) = k;
    typename G::StrideD sd{};
    get<0>(sd) = n;
    reinterpret_cast<typename G::StrideA*>(base + r.stride_a)[e] = sa;
    reinterpret_cast<typename G::StrideB*>(base + r.stride_b)[e] = sb;
    reinterpret_cast<typename G::StrideD*>(base + r.stride_d)[e] = sd;
  }
}

template <typename In, typename Out, bool kFew>
size_t WorkspaceBytes(int32_t experts, int sm_count) {
  const Regions r = RegionsOf<In, Out, kFew>(experts);
  auto args = ArgumentsOf<In, Out, kFew>(nullptr, r, experts, sm_count);
  return r.end + Align(Grouped<In, Out, kFew>::Gemm::get_workspace_size(args));
}

template <typename In, typename Out, bool kFew>
cudaError_t Run(const In* x, const In* w, const int32_t* offsets, int32_t experts, Out* y, int64_t n, int64_t k,
                void* workspace, size_t workspace_bytes, int sm_count, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  constexpr int64_t kInAlign = 16 / sizeof(In), kOutAlign = 16 / sizeof(Out);  // elements of a 16-byte TMA unit
  if (experts < 1 || experts > 1024 || n < kOutAlign || k < kInAlign || n % kOutAlign != 0 || n % 8 != 0 ||
      k % kInAlign != 0 || n > INT32_MAX || k > INT32_MAX || !aligned(x) || !aligned(w) || !aligned(y) ||
      reinterpret_cast<uintptr_t>(workspace) % 256 != 0 ||
      workspace_bytes < WorkspaceBytes<In, Out, kFew>(experts, sm_count)) {
    return cudaErrorInvalidValue;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || !MoeGroupedGemmAvailable(device)) return cudaErrorNotSupported;
  using G = Grouped<In, Out, kFew>;
  auto* base = static_cast<unsigned char*>(workspace);
  const Regions r = RegionsOf<In, Out, kFew>(experts);
  cudaError_t err =
      LaunchDependent(GroupsKernel<In, Out, kFew>, 1, 256, stream, x, w, offsets, experts, y, n, k, base, r);
  if (err != cudaSuccess) return err;
  auto args = ArgumentsOf<In, Out, kFew>(base, r, experts, sm_count);
  typename G::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.initialize(args, base + r.cutlass, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t launch = cudaGetLastError();
    return launch != cudaSuccess ? launch : cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

// Under 32 rows an expert on average (slots 0: prefill's long runs).
bool FewRows(int64_t slots, int32_t experts) {
  return slots > 0 && slots < 32 * int64_t{experts};
}

template <typename In, typename Out>
cudaError_t RunFor(const In* x, const In* w, const int32_t* offsets, int32_t experts, Out* y, int64_t n, int64_t k,
                   void* workspace, size_t workspace_bytes, int sm_count, cudaStream_t stream, int64_t slots) {
  return FewRows(slots, experts)
             ? Run<In, Out, true>(x, w, offsets, experts, y, n, k, workspace, workspace_bytes, sm_count, stream)
             : Run<In, Out, false>(x, w, offsets, experts, y, n, k, workspace, workspace_bytes, sm_count, stream);
}

template <typename In, typename Out>
size_t BothWorkspaceBytes(int32_t experts, int sm_count) {
  return std::max(WorkspaceBytes<In, Out, true>(experts, sm_count), WorkspaceBytes<In, Out, false>(experts, sm_count));
}

}  // namespace

bool MoeGroupedGemmAvailable(int device) {
  return RunsSm90aCode(device);
}

size_t MoeGroupedGemmWorkspaceBytes(int32_t experts, int sm_count) {
  return std::max({BothWorkspaceBytes<__nv_bfloat16, __nv_bfloat16>(experts, sm_count),
                   BothWorkspaceBytes<__half, __half>(experts, sm_count),
                   BothWorkspaceBytes<Fp8, __nv_bfloat16>(experts, sm_count)});
}

template <typename T>
cudaError_t MoeGroupedGemm(const T* x, const T* w, const int32_t* offsets, int32_t experts, T* y, int64_t n, int64_t k,
                           void* workspace, size_t workspace_bytes, int sm_count, cudaStream_t stream, int64_t slots) {
  return RunFor(x, w, offsets, experts, y, n, k, workspace, workspace_bytes, sm_count, stream, slots);
}

cudaError_t MoeGroupedGemmFp8(const Fp8* x, const Fp8* w, const int32_t* offsets, int32_t experts, __nv_bfloat16* y,
                              int64_t n, int64_t k, void* workspace, size_t workspace_bytes, int sm_count,
                              cudaStream_t stream, int64_t slots) {
  return RunFor(x, w, offsets, experts, y, n, k, workspace, workspace_bytes, sm_count, stream, slots);
}

template cudaError_t MoeGroupedGemm(const __nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int32_t, __nv_bfloat16*,
                                    int64_t, int64_t, void*, size_t, int, cudaStream_t, int64_t);
template cudaError_t MoeGroupedGemm(const __half*, const __half*, const int32_t*, int32_t, __half*, int64_t, int64_t,
                                    void*, size_t, int, cudaStream_t, int64_t);

}  // namespace inferd::kernels
