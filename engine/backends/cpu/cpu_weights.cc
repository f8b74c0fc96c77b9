#include "engine/backends/cpu/cpu_weights.h"

#include <initializer_list>

#include "engine/status_macros.h"

namespace inferd {
namespace {

// Stacks tensors with equal column counts row-wise into one matrix (vectors: end to end).
absl::StatusOr<Matrix> Stack(std::initializer_list<const TensorDesc*> parts) {
  Matrix m;
  m.cols = (*parts.begin())->cols;
  for (const TensorDesc* p : parts) m.rows += p->rows;
  m.data.resize(m.rows * m.cols);
  int64_t row = 0;
  for (const TensorDesc* p : parts) {
    INFERD_RETURN_IF_ERROR(DecodeRows(*p, 0, p->rows, m.data.data() + row * m.cols));
    row += p->rows;
  }
  return m;
}

absl::StatusOr<Matrix> Vector(std::initializer_list<const TensorDesc*> parts) {
  Matrix m;
  m.rows = 1;
  for (const TensorDesc* p : parts) m.cols += p->numel();
  m.data.resize(m.cols);
  int64_t at = 0;
  for (const TensorDesc* p : parts) {
    INFERD_RETURN_IF_ERROR(DecodeRows(*p, 0, p->rows, m.data.data() + at));
    at += p->numel();
  }
  return m;
}

}  // namespace

int64_t CpuWeights::bytes() const {
  int64_t n = embed.data.size() + final_norm.data.size() + lm_head_own.data.size();
  for (const CpuLayerWeights& l : layers) {
    n += l.input_norm.data.size() + l.qkv.data.size() + l.qkv_bias.data.size() + l.o.data.size() +
         l.post_norm.data.size() + l.gate_up.data.size() + l.down.data.size();
  }
  return n * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<CpuWeights> BuildCpuWeights(const ModelTensors& t) {
  CpuWeights w;
  INFERD_ASSIGN_OR_RETURN(w.embed, Stack({&t.embed}));
  INFERD_ASSIGN_OR_RETURN(w.final_norm, Vector({&t.final_norm}));
  if (t.lm_head.present()) {
    INFERD_ASSIGN_OR_RETURN(w.lm_head_own, Stack({&t.lm_head}));
  }
  for (const LayerTensors& L : t.layers) {
    CpuLayerWeights& l = w.layers.emplace_back();
    INFERD_ASSIGN_OR_RETURN(l.input_norm, Vector({&L.input_norm}));
    INFERD_ASSIGN_OR_RETURN(l.qkv, Stack({&L.q_proj, &L.k_proj, &L.v_proj}));
    if (L.q_bias.present()) {
      INFERD_ASSIGN_OR_RETURN(l.qkv_bias, Vector({&L.q_bias, &L.k_bias, &L.v_bias}));
    }
    INFERD_ASSIGN_OR_RETURN(l.o, Stack({&L.o_proj}));
    INFERD_ASSIGN_OR_RETURN(l.post_norm, Vector({&L.post_norm}));
    INFERD_ASSIGN_OR_RETURN(l.gate_up, Stack({&L.gate_proj, &L.up_proj}));
    INFERD_ASSIGN_OR_RETURN(l.down, Stack({&L.down_proj}));
  }
  return w;
}

}  // namespace inferd
