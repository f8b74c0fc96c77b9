#include "engine/backends/cuda/forward.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <chrono>
#include <cmath>
#include <string>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/status_macros.h"
#include "engine/trace.h"
#include "kernels/ceilings.h"
#include "kernels/decode_attention.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/fp8_gemm.h"
#include "kernels/gemv.h"
#include "kernels/moe_fp8.h"
#include "kernels/moe_grouped_gemm.h"
#include "kernels/moe_products.h"
#include "kernels/moe_routing.h"
#include "kernels/sampling.h"
#include "spdlog/spdlog.h"

namespace inferd::cuda {

#define INFERD_KERNEL(expr) INFERD_RETURN_IF_ERROR(::inferd::cuda::FromCuda((expr), #expr))

namespace k = kernels;

ModelConfig ShardConfig(const ModelConfig& model, const TensorParallelShard& shard) {
  ModelConfig c = model;
  c.num_heads = static_cast<int32_t>(shard.q_heads.size());
  c.num_kv_heads = static_cast<int32_t>(shard.kv_heads.size());
  c.intermediate_size = static_cast<int32_t>(shard.intermediate.size());
  c.moe_intermediate_size = static_cast<int32_t>(shard.expert_intermediate.size());
  return c;
}

namespace {

k::GatedActivation GatedOf(LayerOp op) {
  return op == LayerOp::kGeluTanhMul ? k::GatedActivation::kGeluTanh : k::GatedActivation::kSilu;
}

}  // namespace

template <typename T>
absl::Status RunForward(const ModelConfig& cfg, const CudaWeights& w, Gemm& gemm, const ForwardBuffers& b,
                        const StepInput& in, const AttentionPlans& plans, const Collectives* comm, cudaStream_t s) {
  const ActivationRegions& a = b.layout->activations;
  const InputRegions& ir = b.layout->inputs;
  const OutputRegions& o = b.layout->outputs;
  const int64_t Tn = in.num_tokens(), R = in.num_logits();
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t q_dim = cfg.q_width(), qkv_dim = cfg.qkv_width();
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  T* x = b.act<T>(a.x);
  T* xn = b.act<T>(a.xn);
  T* tmp = b.act<T>(a.tmp);
  T* qkv = b.act<T>(a.qkv);
  T* attn = b.act<T>(a.attn);
  T* gate_up = b.act<T>(a.gate_up);
  T* act = b.act<T>(a.act);
  const int32_t* positions = b.in<int32_t>(ir.positions);
  // The rotary tables (CudaBackend uploads them): global, the sliding-window layers', LongRoPE's long positions.
  const float* inv_freq = b.act<float>(a.inv_freq);
  const float* inv_freq_local = inv_freq + cfg.head_dim / 2;
  k::RotaryOptions rotary;
  rotary.rotary_dim = cfg.rotary_dim;
  if (cfg.rope.type == "longrope") {
    rotary.inv_freq_long = inv_freq + cfg.head_dim;
    rotary.long_from = cfg.rope.original_max_position_embeddings;
    rotary.mscale = static_cast<float>(cfg.rope.attention_factor);
  }
  const bool plain_rope = rotary.inv_freq_long == nullptr && (cfg.rotary_dim == 0 || cfg.rotary_dim == cfg.head_dim);
  const float sm_scale = cfg.attention_scale > 0 ? static_cast<float>(cfg.attention_scale)
                                                 : 1.f / std::sqrt(static_cast<float>(cfg.head_dim));
  const float soft_cap = static_cast<float>(cfg.attn_logit_softcap);  // 0: none
  char* out = b.outputs();
  const int32_t* sampled = reinterpret_cast<const int32_t*>(out + o.tokens.offset);
  // A mixture of experts' steps of several rows count the experts their rows touch (one row: its k per layer).
  int32_t* experts_touched =
      cfg.num_experts > 0 && Tn > 1 ? reinterpret_cast<int32_t*>(out + o.experts_touched.offset) : nullptr;
  if (experts_touched) INFERD_CUDA(cudaMemsetAsync(experts_touched, 0, sizeof(int32_t), s));
  INFERD_KERNEL(k::EmbedTokens(w.embed.get<T>(), b.in<int32_t>(ir.token_ids), sampled, x, Tn, H, s,
                               static_cast<float>(cfg.embedding_scale())));
  // fp8 weights: steps of more rows than the streaming kernel takes quantize each product's input per token, in
  // the kernel that produces it; the streaming kernel reads the activations as they are.
  const bool quantize = w.fp8 && Tn > gemm.streaming_rows(true);
  k::Fp8* xq = b.act<k::Fp8>(a.act_fp8);
  float* xs = b.act<float>(a.act_scale);
  const Operand normed = quantize ? Operand(xq, xs) : Operand(xn);
  // A row-parallel product's partial sums waiting to be summed over the ranks by the add and norm after them (one
  // kernel where the peer kernels take the sum: Collectives::AllReduceAddRmsNorm).
  bool sum_pending = false;
  // residual += delta, then its norm into the next product's input (xn, or xq and xs with `to_input`; xn for the
  // final norm, which the LM head reads in T, and for a mixture of experts, whose router does).
  auto add_norm = [&](const T* delta, const T* weight, bool to_input = true) -> absl::Status {
    if (sum_pending) {
      sum_pending = false;
      const bool to_fp8 = quantize && to_input;
      return comm->AllReduceAddRmsNorm(delta, x, weight, to_fp8 ? nullptr : xn, xq, xs, Tn, H, eps, kBf16, s);
    }
    if (!quantize || !to_input) return FromCuda(k::AddRmsNorm(x, delta, weight, xn, Tn, H, eps, s), "AddRmsNorm");
    if (k::AddRmsNormFp8Supports(x, delta, weight, H)) {
      return FromCuda(k::AddRmsNormFp8(x, delta, weight, xq, xs, Tn, H, eps, s), "AddRmsNormFp8");
    }
    INFERD_KERNEL(k::AddRmsNorm(x, delta, weight, xn, Tn, H, eps, s));
    return FromCuda(k::QuantizeRowsFp8(xn, Tn, H, xq, xs, s), "QuantizeRowsFp8");
  };
  // An fp8 KV cache (engine.kv_cache_dtype): RoPE's kernel divides K and V by the layer's scales (the checkpoint's
  // k_scale and v_scale, else 1) and rounds them to e4m3 as it writes them; attention multiplies them back (K's
  // scale folded into sm_scale, V's into the output). bf16 queries only: the backend refuses other dtypes.
  const bool fp8_kv = b.layout->kv_element_bytes == 1;
  if (fp8_kv && !std::is_same_v<T, __nv_bfloat16>) return absl::InternalError("an fp8 KV cache needs bf16 activations");
  // Steps of the streaming products' few rows fuse RoPE and the K/V write into the q/k/v product (bf16/fp16
  // weights, a cache of the same dtype, the plain rotary embedding right after the product).
  const bool streaming = Tn <= gemm.gemv_max_rows();
  const bool fused_qkv_rope = !w.fp8 && !fp8_kv && plain_rope && !cfg.arch->qk_norm() && !cfg.has_windows() &&
                              streaming && k::GemvQkvRopeSupports(xn, w.layers[0].qkv.data.get(), Tn, H, cfg.head_dim);
  // And the gated activation into the gate/up product (bf16/fp16 weights).
  const bool fused_gated_act = !w.fp8 && streaming && k::GemvSupports(xn, w.layers[0].gate_up.data.get(), Tn, H);
  // Steps of one decode row with bf16/fp16 weights run attention as one cluster launch (kernels/decode_attention.h)
  // where the device and shape allow, except in sliding-window layers; at 2–4 rows and behind fp8 products it
  // measured slower than FlashInfer's (kernels/NOTES.md).
  const bool decode_attention = Tn == 1 && in.num_seqs() == 1 && !w.fp8 &&
                                k::DecodeAttentionSupports(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
  // RoPE and the K/V write (one kernel), or attention, over the cache's element type C.
  auto over_cache = [&](int layer, auto&& run) -> absl::Status {
    const CudaLayerWeights& L = w.layers[layer];
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (fp8_kv) {
        return run(static_cast<k::Fp8*>(b.k(layer)), static_cast<k::Fp8*>(b.v(layer)), L.k_cache_scale,
                   L.v_cache_scale);
      }
    }
    return run(static_cast<T*>(b.k(layer)), static_cast<T*>(b.v(layer)), 1.f, 1.f);
  };
  // The layer's program (engine/model/arch/), walked op by op. Fusions: the per-head q/k norms, RoPE and the K/V
  // write are one kernel (RoPE and the write in the q/k/v product itself where fused_qkv_rope); a residual add and the
  // norm after it (the next op, or the next layer's input norm, or the final norm) are one kernel; a layer's first
  // input norm is the previous layer's.
  const T* delta = tmp;  // what the next residual add adds
  for (int layer = 0; layer < cfg.num_layers; ++layer) {
    TraceRange range("layer");
    const CudaLayerWeights& L = w.layers[layer];
    const int32_t window = cfg.window(layer);
    const std::vector<LayerOp>& program = cfg.program(layer);  // a dense or a sparse layer's
    for (size_t i = 0; i < program.size(); ++i) {
      switch (program[i]) {
        case LayerOp::kInputNorm:
          if (layer == 0) INFERD_RETURN_IF_ERROR(add_norm(nullptr, L.input_norm.get<T>()));
          break;
        case LayerOp::kQkvProj: {
          const T* bias = L.qkv_bias.bytes() ? L.qkv_bias.get<T>() : nullptr;
          if (fused_qkv_rope) {  // one kernel: the product, RoPE and the K/V write
            INFERD_KERNEL(k::GemvQkvRope<T>(xn, L.qkv.data.get<T>(), bias, qkv, Tn, H, positions, b.slots(layer),
                                            inv_freq, static_cast<T*>(b.k(layer)), static_cast<T*>(b.v(layer)),
                                            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, s,
                                            /*attention_starts_early=*/decode_attention));
          } else {
            INFERD_RETURN_IF_ERROR(gemm.Run(normed, L.qkv.operand(), qkv, Tn, qkv_dim, H, bias, false, s));
          }
          break;
        }
        case LayerOp::kQkNorm:  // with RoPE and the K/V write
        case LayerOp::kRope:
          break;
        case LayerOp::kWriteKv: {
          if (fused_qkv_rope) break;
          k::RotaryOptions options = rotary;
          if (cfg.arch->qk_norm()) {
            options.q_norm = L.q_norm.get();
            options.k_norm = L.k_norm.get();
            options.norm_eps = eps;
          }
          INFERD_RETURN_IF_ERROR(over_cache(layer, [&](auto* k_cache, auto* v_cache, float ks, float vs) {
            using C = std::remove_pointer_t<decltype(k_cache)>;
            return FromCuda(
                k::RopeWriteKv<T, C>(qkv, positions, b.slots(layer), window > 0 ? inv_freq_local : inv_freq, k_cache,
                                     v_cache, Tn, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, ks, vs, s, options),
                "RopeWriteKv");
          }));
          break;
        }
        case LayerOp::kAttention: {
          TraceRange attention("attention");
          INFERD_RETURN_IF_ERROR(over_cache(layer, [&](auto* k_cache, auto* v_cache, float ks, float vs) {
            using C = std::remove_pointer_t<decltype(k_cache)>;
            if constexpr (std::is_same_v<C, T>) {
              if (decode_attention && window <= 0) {
                return FromCuda(
                    k::RunDecodeAttention<T>(qkv, qkv_dim, k_cache, v_cache, b.kv_indptr(layer),
                                             b.in<int32_t>(ir.kv_indices), b.in<int32_t>(ir.kv_last_page_len), attn, Tn,
                                             cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, in.block_size, sm_scale,
                                             /*early_launch=*/true, s, soft_cap),
                    "RunDecodeAttention");
              }
            }
            // A window layer runs on the window layers' plan and schedule, a global one on the global plan.
            const k::AttentionPlan& plan = window > 0 ? plans.window : plans.global;
            void* int_ws = b.act<void>(window > 0 ? a.attn_int_ws_window : a.attn_int_ws);
            return FromCuda(k::RunPagedAttention<T, C>(
                                plan, b.act<void>(a.attn_float_ws), int_ws, qkv, qkv_dim, k_cache, v_cache,
                                b.in<int32_t>(ir.qo_indptr), b.kv_indptr(layer), b.in<int32_t>(ir.kv_indices),
                                b.in<int32_t>(ir.kv_last_page_len), attn, in.num_seqs(), cfg.num_heads,
                                cfg.num_kv_heads, cfg.head_dim, in.block_size, ks * sm_scale, vs,
                                /*early_launch=*/Tn <= gemm.streaming_rows(w.fp8), s, window - 1, soft_cap),
                            "RunPagedAttention");
          }));
          break;
        }
        case LayerOp::kOutProj:
          if (quantize) INFERD_KERNEL(k::QuantizeRowsFp8(attn, Tn, q_dim, xq, xs, s));
          INFERD_RETURN_IF_ERROR(gemm.Run(quantize ? Operand(xq, xs) : Operand(attn), L.o.operand(), tmp, Tn, H, q_dim,
                                          nullptr, false, s));
          delta = tmp;
          break;
        case LayerOp::kDownProj:
          INFERD_RETURN_IF_ERROR(
              gemm.Run(quantize ? Operand(xq, xs) : Operand(act), L.down.operand(), tmp, Tn, H, I, nullptr, false, s));
          delta = tmp;
          break;
        case LayerOp::kSumRanks:  // a row-parallel product's partial sums, summed in place or with the add after
          if (!comm) break;
          if (i + 1 < program.size() && program[i + 1] == LayerOp::kResidual && comm->FusesAddRmsNorm(Tn, H)) {
            sum_pending = true;
          } else {
            INFERD_RETURN_IF_ERROR(comm->AllReduceSum(tmp, Tn * H, kBf16, s));
          }
          break;
        case LayerOp::kAttnOutNorm:
        case LayerOp::kMlpOutNorm: {
          T* normed_delta = b.act<T>(a.tmp_normed);
          const DeviceBuffer& weight = program[i] == LayerOp::kAttnOutNorm ? L.attn_out_norm : L.mlp_out_norm;
          INFERD_KERNEL(
              k::AddRmsNorm(tmp, static_cast<const T*>(nullptr), weight.get<T>(), normed_delta, Tn, H, eps, s));
          delta = normed_delta;
          break;
        }
        case LayerOp::kResidual: {
          // The add and the norm that follows: the post-attention norm here, else (at the layer's end) the next
          // layer's input norm, or after the last layer the final norm (over every row, as the layers' norms are: a
          // prefill's extra rows cost little).
          if (i + 1 < program.size()) {
            // A mixture's router reads the normed rows in T (its experts quantize their own inputs).
            const bool to_moe = i + 2 < program.size() && program[i + 2] == LayerOp::kMoe;
            INFERD_RETURN_IF_ERROR(add_norm(delta, L.post_norm.get<T>(), /*to_input=*/!to_moe));
            ++i;  // kPostNorm (CudaProgramProblem checks the order)
          } else if (layer + 1 < cfg.num_layers) {
            INFERD_RETURN_IF_ERROR(add_norm(delta, w.layers[layer + 1].input_norm.get<T>()));
          } else {
            INFERD_RETURN_IF_ERROR(add_norm(delta, w.final_norm.get<T>(), /*to_input=*/false));
          }
          break;
        }
        case LayerOp::kPostNorm:  // with the residual add before it
          break;
        case LayerOp::kGateUpProj:
          if (fused_gated_act) {  // one kernel: the product and the activation after it (the program's next op)
            const k::GatedActivation gated = GatedOf(program[i + 1]);
            INFERD_KERNEL(k::GemvGatedAct<T>(xn, L.gate_up.data.get<T>(), act, Tn, I, H, gated, s));
            ++i;
            break;
          }
          INFERD_RETURN_IF_ERROR(gemm.Run(normed, L.gate_up.operand(), gate_up, Tn, 2 * I, H, nullptr, false, s));
          break;
        case LayerOp::kSiluMul:
        case LayerOp::kGeluTanhMul: {
          const k::GatedActivation gated = GatedOf(program[i]);
          if (quantize) {
            INFERD_KERNEL(k::ActivateMulFp8(gate_up, xq, xs, Tn, I, gated, s));
          } else {
            INFERD_KERNEL(k::ActivateMul(gate_up, act, Tn, I, gated, s));
          }
          break;
        }
        case LayerOp::kMoe: {
          // The router's logits, each row's top k and the rows grouped by expert (on the device: a decode graph
          // holds any routing), each expert's run times its gate/up, SiLU·mul, times its down, and each row's k
          // outputs weighted back in k order (kernels/moe_routing.h, moe_products.h); one row, ungrouped in four
          // launches. fp8 experts (e4m3, a scale per row) stream against the rows in T; where the runs go through
          // CUTLASS's grouped GEMM their inputs are quantized per row too, as the dense products' (kernels/moe_fp8.h).
          TraceRange experts("experts");
          const int32_t E = cfg.num_experts, K = cfg.experts_per_token;
          const int64_t S = Tn * K, Ie = cfg.moe_intermediate_size;
          const LinearWeight& gu = L.experts_gate_up;
          const LinearWeight& dn = L.experts_down;
          const bool fp8_experts = gu.fp8();
          float* logits = b.act<float>(a.moe_logits);
          int32_t* ids = b.act<int32_t>(a.moe_ids);
          int32_t* offsets = b.act<int32_t>(a.moe_offsets);
          int32_t* sorted = b.act<int32_t>(a.moe_sorted);
          int32_t* slot_positions = b.act<int32_t>(a.moe_positions);
          float* weights = b.act<float>(a.moe_weights);
          T* rows = b.act<T>(a.moe_x);
          T* expert_gate_up = b.act<T>(a.moe_gate_up);
          T* expert_act = b.act<T>(a.moe_act);
          T* expert_out = b.act<T>(a.moe_y);
          INFERD_RETURN_IF_ERROR(
              gemm.Run(Operand(xn), L.router.operand(), logits, Tn, E, H, nullptr, /*out_fp32=*/true, s));
          if (Tn == 1) {
            // One row: its k experts are distinct, so each is read once without grouping; the products read the
            // row and the routing where they lie and the down product sums the k outputs itself.
            INFERD_KERNEL(k::MoeTopK(logits, Tn, E, K, cfg.normalize_top_k, ids, weights, s));
            if (fp8_experts) {
              INFERD_KERNEL(k::MoeRowGatedGemv(xn, gu.data.get<k::Fp8>(), gu.scale.get<float>(), ids, Tn, K, expert_act,
                                               Ie, H, k::GatedActivation::kSilu, s));
              INFERD_KERNEL(k::MoeRowDownCombine(expert_act, dn.data.get<k::Fp8>(), dn.scale.get<float>(), ids, weights,
                                                 Tn, K, tmp, H, Ie, s));
            } else {
              INFERD_KERNEL(k::MoeRowGatedGemv(xn, gu.data.get<T>(), ids, Tn, K, expert_act, Ie, H,
                                               k::GatedActivation::kSilu, s));
              INFERD_KERNEL(k::MoeRowDownCombine(expert_act, dn.data.get<T>(), ids, weights, Tn, K, tmp, H, Ie, s));
            }
            delta = tmp;
            break;
          }
          INFERD_KERNEL(k::MoeRoute(logits, Tn, E, K, cfg.normalize_top_k, ids, weights, b.act<int32_t>(a.moe_counts),
                                    offsets, sorted, slot_positions, s, experts_touched));
          // Runs of a few rows (decode) stream each chosen expert's weights; longer ones go through the tensor
          // cores: CUTLASS's grouped GEMM on Hopper (from 4 rows an expert on average, where its schedule for short
          // runs reads each touched expert's weights once, faster than a streaming pass), else tiles of our own
          // from 8 rows (a streaming pass's; 16-bit weights: fp8 experts stream there). fp8 experts take CUTLASS
          // at any run length: the streaming kernel's e4m3 loop does twice the products per weight byte and is
          // bound by its instructions.
          const bool fp8_grouped = fp8_experts && b.moe_grouped_sms > 0;
          const bool grouped = fp8_grouped || S > (b.moe_grouped_sms > 0 ? 4 : 8) * int64_t{E};
          void* gemm_ws = b.act<void>(a.moe_gemm_ws);
          if (fp8_grouped) {
            k::Fp8* xq = b.act<k::Fp8>(a.moe_x);
            k::Fp8* act_q = b.act<k::Fp8>(a.moe_act);
            float* x_scales = b.act<float>(a.moe_x_scale);
            float* act_scales = b.act<float>(a.moe_act_scale);
            __nv_bfloat16* gate_up_sums = b.act<__nv_bfloat16>(a.moe_gate_up);
            __nv_bfloat16* out_sums = b.act<__nv_bfloat16>(a.moe_y);
            INFERD_KERNEL(k::MoeGatherFp8(xn, sorted, S, K, H, xq, x_scales, s));
            INFERD_KERNEL(k::MoeGroupedGemmFp8(xq, gu.data.get<k::Fp8>(), offsets, E, gate_up_sums, 2 * Ie, H, gemm_ws,
                                               a.moe_gemm_ws.bytes, b.moe_grouped_sms, s, S));
            INFERD_KERNEL(k::MoeActivateMulFp8<T>(gate_up_sums, x_scales, gu.scale.get<float>(), ids, sorted, S, Ie,
                                                  k::GatedActivation::kSilu, act_q, act_scales, s));
            INFERD_KERNEL(k::MoeGroupedGemmFp8(act_q, dn.data.get<k::Fp8>(), offsets, E, out_sums, H, Ie, gemm_ws,
                                               a.moe_gemm_ws.bytes, b.moe_grouped_sms, s, S));
            INFERD_KERNEL(k::MoeCombineFp8(out_sums, act_scales, dn.scale.get<float>(), ids, slot_positions, weights,
                                           Tn, K, H, tmp, s));
            delta = tmp;
            break;
          }
          INFERD_KERNEL(k::MoeGather(xn, sorted, S, K, H, rows, s));
          const auto products = [&](const T* in, const LinearWeight& w, T* out, int64_t n, int64_t kdim) {
            if (w.fp8()) {
              return k::MoeExpertGemv(in, w.data.get<k::Fp8>(), w.scale.get<float>(), offsets, E, out, n, kdim, s);
            }
            const T* weights = w.data.get<T>();
            if (!grouped) return k::MoeExpertGemv(in, weights, offsets, E, out, n, kdim, s);
            if (b.moe_grouped_sms > 0 && n % 8 == 0 && kdim % 8 == 0) {
              return k::MoeGroupedGemm(in, weights, offsets, E, out, n, kdim, gemm_ws, a.moe_gemm_ws.bytes,
                                       b.moe_grouped_sms, s, S);
            }
            return k::MoeExpertGemmSupports(in, weights, n, kdim)
                       ? k::MoeExpertGemm(in, weights, offsets, E, S, out, n, kdim, s)
                       : k::MoeExpertGemv(in, weights, offsets, E, out, n, kdim, s);
          };
          INFERD_KERNEL(products(rows, gu, expert_gate_up, 2 * Ie, H));
          INFERD_KERNEL(k::ActivateMul(expert_gate_up, expert_act, S, Ie, k::GatedActivation::kSilu, s));
          INFERD_KERNEL(products(expert_act, dn, expert_out, H, Ie));
          INFERD_KERNEL(k::MoeCombine(expert_out, slot_positions, weights, Tn, K, H, tmp, s));
          delta = tmp;
          break;
        }
      }
    }
  }
  // Every rank holds the same residual stream now. The LM head, on the rows that sample: where the ranks can write
  // rank 0's memory, each writes its vocabulary run of every row's logits straight into rank 0's (each GPU reads
  // its share of the LM head, not rank 0 all of it) and rank 0 waits for the others'; else rank 0 computes them
  // all. Rank 0 samples and hands the tokens to the others.
  int32_t* tokens_out = reinterpret_cast<int32_t*>(out + o.tokens.offset);
  const bool split = comm && comm->writes_to_rank0();
  if (comm && comm->rank() > 0 && !split) return comm->Broadcast(tokens_out, R * sizeof(int32_t), s);
  TraceRange sampling("LM head and sampling");
  T* last_n = b.act<T>(a.last_n);
  float* logits = b.act<float>(a.logits);
  INFERD_KERNEL(k::GatherRows(xn, b.in<int32_t>(ir.logits_indices), last_n, R, H, s));
  if (split) {
    if (w.vocab.size() > 0) {
      INFERD_RETURN_IF_ERROR(gemm.Run(last_n, w.lm_head_part(H, sizeof(T)),
                                      reinterpret_cast<float*>(b.rank0_logits) + w.vocab.begin, R, w.vocab.size(), H,
                                      nullptr, true, s, cfg.vocab_size));
    }
    INFERD_RETURN_IF_ERROR(comm->JoinRank0(s));
    if (comm->rank() > 0) return comm->Broadcast(tokens_out, R * sizeof(int32_t), s);
  } else {
    INFERD_RETURN_IF_ERROR(gemm.Run(last_n, w.lm_head(), logits, R, cfg.vocab_size, H, nullptr, true, s));
  }
  if (cfg.final_logit_softcap > 0) {
    INFERD_KERNEL(k::SoftCap(logits, R * cfg.vocab_size, static_cast<float>(cfg.final_logit_softcap), s));
  }
  INFERD_KERNEL(k::SampleRows(
      logits, static_cast<int32_t>(R), cfg.vocab_size, b.in<k::SamplingRowParams>(ir.params),
      b.in<int32_t>(ir.penalty_indptr), b.in<int32_t>(ir.penalty_tokens), b.in<int32_t>(ir.penalty_counts),
      b.in<uint8_t>(ir.penalty_flags), b.in<float>(ir.penalty_bias), b.act<float>(a.penalty_raw),
      b.in<uint32_t>(ir.allowed), tokens_out, reinterpret_cast<float*>(out + o.logprobs.offset),
      reinterpret_cast<int32_t*>(out + o.top_ids.offset), reinterpret_cast<float*>(out + o.top_logprobs.offset), s,
      b.in<uint32_t>(ir.masks_ready)));
  if (comm) return comm->Broadcast(tokens_out, R * sizeof(int32_t), s);
  return absl::OkStatus();
}

template absl::Status RunForward<__nv_bfloat16>(const ModelConfig&, const CudaWeights&, Gemm&, const ForwardBuffers&,
                                                const StepInput&, const AttentionPlans&, const Collectives*,
                                                cudaStream_t);
template absl::Status RunForward<__half>(const ModelConfig&, const CudaWeights&, Gemm&, const ForwardBuffers&,
                                         const StepInput&, const AttentionPlans&, const Collectives*, cudaStream_t);

absl::Status TuneProducts(const ModelConfig& cfg, const CudaWeights& w, Gemm& gemm, const ForwardBuffers& b, bool bf16,
                          const std::vector<int32_t>& rows, cudaStream_t stream) {
  const auto start = std::chrono::steady_clock::now();
  const ActivationRegions& a = b.layout->activations;
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t e = b.layout->element_bytes;
  for (const Region* r : {&a.xn, &a.attn, &a.act, &a.last_n}) {  // random inputs: timings on real-looking data
    INFERD_KERNEL(k::FillUniform16(b.act<void>(*r), r->bytes / e, bf16, 3, stream));
  }
  const int64_t tokens = a.act.bytes / (I * e);
  if (w.fp8) {  // the fp8 products' inputs: valid e4m3 rows and scales, quantized from the random ones
    INFERD_KERNEL(bf16 ? k::QuantizeRowsFp8(b.act<__nv_bfloat16>(a.act), tokens, I, b.act<k::Fp8>(a.act_fp8),
                                            b.act<float>(a.act_scale), stream)
                       : k::QuantizeRowsFp8(b.act<__half>(a.act), tokens, I, b.act<k::Fp8>(a.act_fp8),
                                            b.act<float>(a.act_scale), stream));
  }
  auto input = [&](const Region& r) {
    return w.fp8 ? Operand(b.act<void>(a.act_fp8), b.act<float>(a.act_scale)) : Operand(b.act<void>(r));
  };
  struct Product {
    const char* name;
    std::vector<Operand> weights;  // every layer's, cycled so that none is served from L2
    Operand x;
    void* y;
    int64_t n, k;
    const void* bias;
    bool out_fp32;
    int64_t ldy = 0;
  };
  std::vector<Product> products = {
      {"qkv", {}, input(a.xn), b.act<void>(a.qkv), cfg.qkv_width(), H, nullptr, false},
      {"o", {}, input(a.attn), b.act<void>(a.tmp), H, cfg.q_width(), nullptr, false},
      {"gate_up", {}, input(a.xn), b.act<void>(a.gate_up), 2 * I, H, nullptr, false},
      {"down", {}, input(a.act), b.act<void>(a.tmp), H, I, nullptr, false},
      // the rank's vocabulary run of the logits (all of them on one GPU), as RunForward writes it
      {"lm_head",
       {w.lm_head_part(H, e)},
       b.act<void>(a.last_n),
       b.act<float>(a.logits) + w.vocab.begin,
       w.vocab.size(),
       H,
       nullptr,
       true,
       cfg.vocab_size}};
  for (const CudaLayerWeights& L : w.layers) {
    products[0].weights.push_back(L.qkv.operand());
    products[0].bias = L.qkv_bias.bytes() ? L.qkv_bias.get() : nullptr;
    products[1].weights.push_back(L.o.operand());
    if (L.gate_up.data.bytes() > 0) {  // a dense layer's MLP (a sparse layer's experts stream their weights)
      products[2].weights.push_back(L.gate_up.operand());
      products[3].weights.push_back(L.down.operand());
    }
  }
  std::vector<std::string> gains;
  for (int32_t m : rows) {
    for (const Product& p : products) {
      if (p.weights.empty() || m <= gemm.streaming_rows(p.weights[0].fp8()) || p.n == 0) continue;
      INFERD_ASSIGN_OR_RETURN(const double gain,
                              gemm.Tune(p.x, p.weights, p.y, m, p.n, p.k, p.bias, p.out_fp32, stream, p.ldy));
      if (gain > 1.02) gains.push_back(absl::StrFormat("%s at %d rows %.2fx", p.name, m, gain));
    }
  }
  std::vector<std::string> tiles;  // the fp8 products CUTLASS runs: the tile each shape measured fastest with
  for (const auto& [shape, tile] : gemm.cutlass_tiles()) {
    const auto [m, n, k] = shape;
    for (const Product& p : products) {
      if (p.n == n && p.k == k) tiles.push_back(absl::StrFormat("%s %d %s", p.name, m, kernels::Fp8GemmTileName(tile)));
    }
  }
  spdlog::info(
      "cuda: product kernels chosen by measurement in {:.2f} s; faster than the default (cuBLASLt's "
      "heuristic, CUTLASS's tile by the rows): {}",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      gains.empty() ? "none" : absl::StrJoin(gains, ", "));
  if (!tiles.empty()) spdlog::info("cuda: fp8 CUTLASS tiles (product, rows, tile): {}", absl::StrJoin(tiles, ", "));
  return absl::OkStatus();
}

}  // namespace inferd::cuda
