#include "engine/backends/cpu/cpu_weights.h"

#include <algorithm>
#include <initializer_list>

#include "engine/status_macros.h"

namespace inferd {
namespace {

// Stacks tensors with equal column counts row-wise into one matrix (vectors: end to end); as stored where asked and
// every part can be.
absl::StatusOr<Matrix> Stack(std::initializer_list<const TensorDesc*> parts, bool as_stored = false,
                             bool products = true) {
  Matrix m;
  if (as_stored && std::all_of(parts.begin(), parts.end(), [](const TensorDesc* p) { return CanStore(*p); })) {
    INFERD_ASSIGN_OR_RETURN(m.stored, StoreRows(parts, products));
    m.rows = m.stored.rows;
    m.cols = m.stored.cols;
    return m;
  }
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

// The rows of m in `runs`, in order.
Matrix Rows(const Matrix& m, const std::vector<IndexRange>& runs) {
  Matrix out;
  out.cols = m.cols;
  for (const IndexRange& r : runs) {
    out.data.insert(out.data.end(), m.data.begin() + r.begin * m.cols, m.data.begin() + r.end * m.cols);
    out.rows += r.size();
  }
  return out;
}

// The columns of m in `runs`, in order (a vector's elements when m has one row).
Matrix Cols(const Matrix& m, const std::vector<IndexRange>& runs) {
  Matrix out;
  out.rows = m.rows;
  for (const IndexRange& r : runs) out.cols += r.size();
  out.data.reserve(out.rows * out.cols);
  for (int64_t i = 0; i < m.rows; ++i) {
    for (const IndexRange& r : runs) {
      out.data.insert(out.data.end(), m.data.begin() + i * m.cols + r.begin, m.data.begin() + i * m.cols + r.end);
    }
  }
  return out;
}

}  // namespace

int64_t CpuLayerWeights::bytes() const {
  int64_t n = 0;
  for (const Matrix* m : {&input_norm, &qkv, &qkv_bias, &q_norm, &k_norm, &attn_out_norm, &mlp_out_norm, &o, &post_norm,
                          &gate_up, &down, &router}) {
    n += m->bytes();
  }
  for (const Matrix& m : expert_gate_up) n += m.bytes();
  for (const Matrix& m : expert_down) n += m.bytes();
  return n;
}

int64_t CpuWeights::bytes() const {
  int64_t n = embed.bytes() + final_norm.bytes() + lm_head_own.bytes();
  for (const CpuLayerWeights& l : layers) n += l.bytes();
  return n;
}

CpuLayerWeights ShardLayer(const CpuLayerWeights& l, const ModelConfig& c, const TensorParallelShard& shard) {
  const int64_t D = c.head_dim;
  CpuLayerWeights s;
  s.input_norm = l.input_norm;
  s.post_norm = l.post_norm;
  s.q_norm = l.q_norm;  // per head: the same on every rank
  s.k_norm = l.k_norm;
  s.attn_out_norm = l.attn_out_norm;  // on the summed output: whole on every rank
  s.mlp_out_norm = l.mlp_out_norm;
  s.qkv = Rows(l.qkv, shard.QkvRows(c));
  if (!l.qkv_bias.data.empty()) s.qkv_bias = Cols(l.qkv_bias, shard.QkvRows(c));
  s.o = Cols(l.o, {{shard.q_heads.begin * D, shard.q_heads.end * D}});
  if (!l.gate_up.data.empty()) {
    s.gate_up = Rows(l.gate_up, shard.GateUpRows(c));
    s.down = Cols(l.down, {shard.intermediate});
  }
  s.router = l.router;  // every rank routes every row alike
  for (const Matrix& m : l.expert_gate_up) s.expert_gate_up.push_back(Rows(m, shard.ExpertGateUpRows(c)));
  for (const Matrix& m : l.expert_down) s.expert_down.push_back(Cols(m, {shard.expert_intermediate}));
  return s;
}

absl::StatusOr<CpuWeights> BuildCpuWeights(const ModelTensors& t, bool as_stored) {
  CpuWeights w;
  const bool s = as_stored;
  // The embedding table is multiplied only where it is the LM head too (tied).
  INFERD_ASSIGN_OR_RETURN(w.embed, Stack({&t.embed}, s, /*products=*/!t.lm_head.present()));
  INFERD_ASSIGN_OR_RETURN(w.final_norm, Vector({&t.final_norm}));
  if (t.lm_head.present()) {
    INFERD_ASSIGN_OR_RETURN(w.lm_head_own, Stack({&t.lm_head}, s));
  }
  for (const LayerTensors& L : t.layers) {
    CpuLayerWeights& l = w.layers.emplace_back();
    INFERD_ASSIGN_OR_RETURN(l.input_norm, Vector({&L.input_norm}));
    INFERD_ASSIGN_OR_RETURN(l.qkv, Stack({&L.q_proj, &L.k_proj, &L.v_proj}, s));
    if (L.q_bias.present()) {
      INFERD_ASSIGN_OR_RETURN(l.qkv_bias, Vector({&L.q_bias, &L.k_bias, &L.v_bias}));
    }
    if (L.q_norm.present()) {
      INFERD_ASSIGN_OR_RETURN(l.q_norm, Vector({&L.q_norm}));
      INFERD_ASSIGN_OR_RETURN(l.k_norm, Vector({&L.k_norm}));
    }
    if (L.attn_out_norm.present()) {
      INFERD_ASSIGN_OR_RETURN(l.attn_out_norm, Vector({&L.attn_out_norm}));
      INFERD_ASSIGN_OR_RETURN(l.mlp_out_norm, Vector({&L.mlp_out_norm}));
    }
    INFERD_ASSIGN_OR_RETURN(l.o, Stack({&L.o_proj}, s));
    INFERD_ASSIGN_OR_RETURN(l.post_norm, Vector({&L.post_norm}));
    if (L.router.present()) {  // a sparse layer: the router and its experts
      // The router stays fp32 (a few rows): its logits choose experts, where an input's 8-bit rounding would flip
      // near-ties into other experts' outputs.
      INFERD_ASSIGN_OR_RETURN(l.router, Stack({&L.router}));
      for (const LayerTensors::Expert& e : L.experts) {
        INFERD_ASSIGN_OR_RETURN(l.expert_gate_up.emplace_back(), Stack({&e.gate, &e.up}, s));
        INFERD_ASSIGN_OR_RETURN(l.expert_down.emplace_back(), Stack({&e.down}, s));
      }
      continue;
    }
    INFERD_ASSIGN_OR_RETURN(l.gate_up, Stack({&L.gate_proj, &L.up_proj}, s));
    INFERD_ASSIGN_OR_RETURN(l.down, Stack({&L.down_proj}, s));
  }
  return w;
}

}  // namespace inferd
