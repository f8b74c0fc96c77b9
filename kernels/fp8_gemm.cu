#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "kernels/device_code.h"
#include "kernels/fp8_gemm.h"

namespace inferd::kernels {
namespace {

using namespace cute;  // NOLINT: CUTLASS's shapes read as its documentation writes them
namespace fusion = cutlass::epilogue::fusion;

// One GEMM type per tile choice: kSmall (up to 128 rows) 64 × 128 × 128 tiles in pairs of CTAs along n, else
// 128 × 128 × 128 in pairs along m; both the ping-pong schedule (two consumer warp groups on alternate tiles) with
// the tensor cores' own fp8 accumulation (no promotion to fp32 registers every few k-blocks: the cooperative
// schedule with promotion measured 6–8% slower than cuBLASLt at prefill, this one 3% faster; kernels/NOTES.md).
template <bool kSmall>
struct ScaledFp8 {
  using E = cutlass::float_e4m3_t;
  using D = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;     // X: rows of k
  using LayoutB = cutlass::layout::ColumnMajor;  // W: [n, k], each output column's k contiguous
  using LayoutD = cutlass::layout::RowMajor;     // Y: rows of n
  static constexpr int kAlignIn = 16, kAlignOut = 8;
  using TileShape = std::conditional_t<kSmall, Shape<_64, _128, _128>, Shape<_128, _128, _128>>;
  using ClusterShape = std::conditional_t<kSmall, Shape<_1, _2, _1>, Shape<_2, _1, _1>>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  // y = x_scale[m] · (w_scale[n] · acc) + bias[n]
  using WScale = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using XScale = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, _0>>;
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, D, float, Stride<_0, _1, _0>>;
  using Scaled = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>, WScale,
      fusion::Sm90AccFetch>;
  using Out = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::homogeneous_multiply_add, D, float, cutlass::FloatRoundStyle::round_to_nearest>,
      XScale, Scaled, Bias>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignOut, D, LayoutD, kAlignOut,
      EpilogueSchedule, Out>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, LayoutA, kAlignIn, E, LayoutB, kAlignIn, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <bool kSmall>
cudaError_t Run(const Fp8* x, const float* x_scale, const Fp8* w, const float* w_scale, const __nv_bfloat16* bias,
                __nv_bfloat16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  using G = ScaledFp8<kSmall>;
  using Kernel = typename G::Kernel;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(M, K, 1));
  const auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(N, K, 1));
  const auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(M, N, 1));
  typename G::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {reinterpret_cast<const typename G::E*>(x), stride_a, reinterpret_cast<const typename G::E*>(w), stride_b},
      {{},  // the visitor tree's arguments, below
       nullptr,
       stride_d,
       reinterpret_cast<typename G::D*>(y),
       stride_d}};
  // Out's children in order (XScale, Scaled, Bias), then its own; Scaled's (WScale, the accumulator), then its own.
  args.epilogue.thread = {{x_scale}, {{w_scale}, {}, {}}, {reinterpret_cast<const typename G::D*>(bias)}, {}};
  typename G::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (G::Gemm::get_workspace_size(args) != 0) return cudaErrorInvalidValue;  // none for these schedules
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t launch = cudaGetLastError();
    return launch != cudaSuccess ? launch : cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool Fp8ScaledGemmAvailable(int device) {
  return RunsSm90aCode(device);
}

bool Fp8ScaledGemmSupports(const void* x, const void* w, const void* y, const void* bias, int64_t n, int64_t k) {
  return k > 0 && k % 16 == 0 && n > 0 && n % 8 == 0 && k <= 0x7fffffff && n <= 0x7fffffff && Aligned(x) &&
         Aligned(w) && Aligned(y) && Aligned(bias);
}

cudaError_t Fp8ScaledGemm(const Fp8* x, const float* x_scale, const Fp8* w, const float* w_scale,
                          const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t m, int64_t n, int64_t k,
                          cudaStream_t stream) {
  int device = 0;
  if (m <= 0) return m == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (m > 0x7fffffff || cudaGetDevice(&device) != cudaSuccess || !Fp8ScaledGemmAvailable(device) ||
      !Fp8ScaledGemmSupports(x, w, y, bias, n, k)) {
    return cudaErrorNotSupported;
  }
  return m <= 128 ? Run<true>(x, x_scale, w, w_scale, bias, y, m, n, k, stream)
                  : Run<false>(x, x_scale, w, w_scale, bias, y, m, n, k, stream);
}

}  // namespace inferd::kernels
