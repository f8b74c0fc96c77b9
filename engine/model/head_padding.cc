#include "engine/model/head_padding.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/sizes.h"

namespace inferd {

namespace {

void Pad(TensorDesc* t, int32_t stored, int32_t padded, bool columns) {
  if (!t->present()) return;
  t->head_stored = stored;
  t->head_padded = padded;
  t->pad_columns = columns;
  int64_t& dim = columns ? t->cols : t->rows;
  dim = dim / stored * padded;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> WithPaddedHeads(const Model& model, int32_t head_dim) {
  const ModelConfig& c = model.config;
  if (head_dim <= c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("heads of ", c.head_dim, " cannot be padded to ", head_dim, "; allowed: a wider head dim"));
  }
  if (c.arch->qk_norm()) {
    return absl::FailedPreconditionError(absl::StrCat(c.architecture, "'s per-head q/k norms over heads of ",
                                                      c.head_dim, " padded to ", head_dim, " are not run"));
  }
  auto out = std::make_unique<Model>();
  out->name = model.name;
  out->config = c;
  out->tensors = model.tensors;
  out->eos_token_ids = model.eos_token_ids;
  out->bos_token_id = model.bos_token_id;
  ModelConfig& p = out->config;
  p.head_dim = head_dim;
  p.rotary_dim = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim;
  if (p.attention_scale <= 0) p.attention_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  for (LayerTensors& L : out->tensors.layers) {
    for (TensorDesc* rows : {&L.q_proj, &L.k_proj, &L.v_proj}) Pad(rows, c.head_dim, head_dim, false);
    for (TensorDesc* columns : {&L.q_bias, &L.k_bias, &L.v_bias, &L.o_proj}) Pad(columns, c.head_dim, head_dim, true);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> PaddedForAttentionKernels(const Model& model) {
  const int32_t run_head_dim = kernels::AttentionRunHeadDim(model.config.head_dim);
  if (run_head_dim == 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim = ", model.config.head_dim,
                                                   " is not run by the attention kernels; allowed: even, up to 256"));
  }
  if (run_head_dim == model.config.head_dim) return nullptr;
  return WithPaddedHeads(model, run_head_dim);
}

}  // namespace inferd
