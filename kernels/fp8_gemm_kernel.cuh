// The CUTLASS GEMM type behind kernels/fp8_gemm.h, one instantiation per tile choice (each in its own
// translation unit: fp8_gemm_rows64.cu, fp8_gemm_rows128.cu, so that they compile side by side).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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
#include "kernels/fp8_gemm_tiles.h"

namespace inferd::kernels::fp8_gemm {

namespace fusion = cutlass::epilogue::fusion;

// The tensor cores' own fp8 accumulation (no promotion to fp32 registers every few k-blocks: the cooperative
// schedule with promotion measured 6–8% slower than cuBLASLt at prefill, ping-pong with fast accumulation 3%
// faster; kernels/NOTES.md). Ping-pong: two consumer warp groups on alternate tiles, each tile whole; cooperative:
// both on one tile, split along m.
struct Pingpong {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};
struct Cooperative {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

// y = x_scale[m] · (w_scale[n] · acc) + bias[n], rounded once to bf16.
template <class TileShape, class ClusterShape, class Schedule>
struct ScaledFp8 {
  using E = cutlass::float_e4m3_t;
  using D = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;     // X: rows of k
  using LayoutB = cutlass::layout::ColumnMajor;  // W: [n, k], each output column's k contiguous
  using LayoutD = cutlass::layout::RowMajor;     // Y: rows of n
  static constexpr int kAlignIn = 16, kAlignOut = 8;
  using WScale = fusion::Sm90RowBroadcast<0, TileShape, float, float, cute::Stride<cute::_0, cute::_1, cute::_0>>;
  using XScale = fusion::Sm90ColBroadcast<0, TileShape, float, float, cute::Stride<cute::_1, cute::_0, cute::_0>>;
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, D, float, cute::Stride<cute::_0, cute::_1, cute::_0>>;
  using Scaled = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>, WScale,
      fusion::Sm90AccFetch>;
  using Out = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::homogeneous_multiply_add, D, float, cutlass::FloatRoundStyle::round_to_nearest>,
      XScale, Scaled, Bias>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignOut, D, LayoutD, kAlignOut,
      typename Schedule::Epilogue, Out>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, LayoutA, kAlignIn, E, LayoutB, kAlignIn, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Schedule::Kernel>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class G>
cudaError_t Run(const Args& a) {
  using Kernel = typename G::Kernel;
  using cute::make_shape;
  const auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(a.m, a.k, 1));
  const auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(a.n, a.k, 1));
  const auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(a.m, a.n, 1));
  typename G::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {a.m, a.n, a.k, 1},
      {reinterpret_cast<const typename G::E*>(a.x), stride_a, reinterpret_cast<const typename G::E*>(a.w), stride_b},
      {{},  // the visitor tree's arguments, below
       nullptr,
       stride_d,
       reinterpret_cast<typename G::D*>(a.y),
       stride_d}};
  // Out's children in order (XScale, Scaled, Bias), then its own; Scaled's (WScale, the accumulator), then its own.
  args.epilogue.thread = {{a.x_scale}, {{a.w_scale}, {}, {}}, {reinterpret_cast<const typename G::D*>(a.bias)}, {}};
  typename G::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (G::Gemm::get_workspace_size(args) != 0) return cudaErrorInvalidValue;  // none for these schedules
  if (gemm.initialize(args, nullptr, a.stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  if (gemm.run(a.stream) != cutlass::Status::kSuccess) {
    const cudaError_t launch = cudaGetLastError();
    return launch != cudaSuccess ? launch : cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

}  // namespace inferd::kernels::fp8_gemm
