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

// One GEMM type per dtype: 128 x 128 x 64 tiles, clusters of 2 along M, the cooperative warp-specialised schedule
// (two consumer warp groups on one tile), as FlashInfer's own SM90 segment GEMM takes for 16-bit inputs.
template <typename T>
struct Grouped {
  using Element = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, cutlass::bfloat16_t, cutlass::half_t>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;     // X: rows of k
  using LayoutB = cutlass::layout::ColumnMajor;  // W: [n, k], each output column's k contiguous
  using LayoutD = cutlass::layout::RowMajor;     // Y: rows of n
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
  using TileShape = Shape<_128, _128, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, LayoutD*, kAlign, Element, LayoutD*,
      kAlign, cutlass::epilogue::PtrArrayNoSmemWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element, LayoutB*, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
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
template <typename T>
Regions RegionsOf(int32_t experts) {
  using G = Grouped<T>;
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

template <typename T>
typename Grouped<T>::Gemm::Arguments ArgumentsOf(unsigned char* base, const Regions& r, int32_t experts, int sm_count) {
  using G = Grouped<T>;
  using E = typename G::Element;
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  typename G::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {experts, reinterpret_cast<typename G::Shape3*>(base + r.shapes), nullptr},
      {reinterpret_cast<const E**>(base + r.a), reinterpret_cast<typename G::StrideA*>(base + r.stride_a),
       reinterpret_cast<const E**>(base + r.b), reinterpret_cast<typename G::StrideB*>(base + r.stride_b)},
      {{},
       reinterpret_cast<const E**>(base + r.d),
       reinterpret_cast<typename G::StrideD*>(base + r.stride_d),
       reinterpret_cast<E**>(base + r.d),
       reinterpret_cast<typename G::StrideD*>(base + r.stride_d)},
      hw};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;  // D alone: C (the same pointers) is never read
  return args;
}

// A thread an expert: its group's shape (its run's rows, n, k), operands and strides.
template <typename T>
__global__ void GroupsKernel(const T* __restrict__ x, const T* __restrict__ w, const int32_t* __restrict__ offsets,
                             int32_t experts, T* y, int64_t n, int64_t k, unsigned char* base, Regions r) {
  using G = Grouped<T>;
  WaitForPrerequisites();  // the offsets are MoeRoute's, the rows the gather's
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
    const int32_t begin = offsets[e], rows = offsets[e + 1] - begin;
    reinterpret_cast<typename G::Shape3*>(base + r.shapes)[e] =
        typename G::Shape3(rows, static_cast<int>(n), static_cast<int>(k));
    reinterpret_cast<const T**>(base + r.a)[e] = x + int64_t{begin} * k;
    reinterpret_cast<const T**>(base + r.b)[e] = w + int64_t{e} * n * k;
    reinterpret_cast<T**>(base + r.d)[e] = y + int64_t{begin} * n;
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

template <typename T>
size_t WorkspaceBytes(int32_t experts, int sm_count) {
  const Regions r = RegionsOf<T>(experts);
  auto args = ArgumentsOf<T>(nullptr, r, experts, sm_count);
  return r.end + Align(Grouped<T>::Gemm::get_workspace_size(args));
}

}  // namespace

bool MoeGroupedGemmAvailable(int device) {
  return RunsSm90aCode(device);
}

size_t MoeGroupedGemmWorkspaceBytes(int32_t experts, int sm_count) {
  return std::max(WorkspaceBytes<__nv_bfloat16>(experts, sm_count), WorkspaceBytes<__half>(experts, sm_count));
}

template <typename T>
cudaError_t MoeGroupedGemm(const T* x, const T* w, const int32_t* offsets, int32_t experts, T* y, int64_t n, int64_t k,
                           void* workspace, size_t workspace_bytes, int sm_count, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (experts < 1 || experts > 1024 || n < 8 || k < 8 || n % 8 != 0 || k % 8 != 0 || n > INT32_MAX || k > INT32_MAX ||
      !aligned(x) || !aligned(w) || !aligned(y) || reinterpret_cast<uintptr_t>(workspace) % 256 != 0 ||
      workspace_bytes < WorkspaceBytes<T>(experts, sm_count)) {
    return cudaErrorInvalidValue;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || !MoeGroupedGemmAvailable(device)) return cudaErrorNotSupported;
  using G = Grouped<T>;
  auto* base = static_cast<unsigned char*>(workspace);
  const Regions r = RegionsOf<T>(experts);
  cudaError_t err = LaunchDependent(GroupsKernel<T>, 1, 256, stream, x, w, offsets, experts, y, n, k, base, r);
  if (err != cudaSuccess) return err;
  auto args = ArgumentsOf<T>(base, r, experts, sm_count);
  typename G::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.initialize(args, base + r.cutlass, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t launch = cudaGetLastError();
    return launch != cudaSuccess ? launch : cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

template cudaError_t MoeGroupedGemm(const __nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int32_t, __nv_bfloat16*,
                                    int64_t, int64_t, void*, size_t, int, cudaStream_t);
template cudaError_t MoeGroupedGemm(const __half*, const __half*, const int32_t*, int32_t, __half*, int64_t, int64_t,
                                    void*, size_t, int, cudaStream_t);

}  // namespace inferd::kernels
