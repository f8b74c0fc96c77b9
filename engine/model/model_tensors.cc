#include "engine/model/model_tensors.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/formats/gguf.h"
#include "engine/status_macros.h"
#include "kernels/random_weights.h"

namespace inferd {

namespace {

template <typename Tensors, typename Desc>
std::vector<Desc*> Collect(Tensors& t) {
  std::vector<Desc*> all = {&t.embed, &t.final_norm, &t.lm_head};
  for (auto& L : t.layers) {
    for (Desc* d : {&L.input_norm, &L.q_proj, &L.k_proj, &L.v_proj, &L.q_bias, &L.k_bias, &L.v_bias, &L.q_norm,
                    &L.k_norm, &L.attn_out_norm, &L.mlp_out_norm, &L.o_proj, &L.post_norm, &L.gate_proj, &L.up_proj,
                    &L.down_proj, &L.router}) {
      all.push_back(d);
    }
    for (auto& e : L.experts) {
      for (Desc* d : {&e.gate, &e.up, &e.down}) all.push_back(d);
    }
  }
  return all;
}

}  // namespace

std::vector<TensorDesc*> AllTensors(ModelTensors* t) {
  return Collect<ModelTensors, TensorDesc>(*t);
}
std::vector<const TensorDesc*> AllTensors(const ModelTensors& t) {
  return Collect<const ModelTensors, const TensorDesc>(t);
}

std::vector<std::shared_ptr<const void>> ReleaseTensorBytes(ModelTensors* t) {
  for (TensorDesc* d : AllTensors(t)) d->bytes = {};
  return std::exchange(t->files, {});
}

namespace {

// The nearest bfloat16 (ties to even), as a float: what a bf16 checkpoint would hold.
float RoundToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

namespace {

absl::Status DecodeRowsAsStored(const TensorDesc& t, int64_t first, int64_t count, float* out) {
  if (t.random()) {
    if (first < 0 || count < 0 || first + count > t.rows) {
      return absl::OutOfRangeError(
          absl::StrCat("tensor '", t.name, "': rows [", first, ", ", first + count, ") outside [0, ", t.rows, ")"));
    }
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t c = 0; c < t.cols; ++c) {
        const float v = kernels::RandomWeight(t.random_seed, first + r, c, t.random_mean, t.random_std);
        out[r * t.cols + c] = t.dtype == DType::kBF16 ? RoundToBf16(v) : v;  // as stored, as the device holds it
      }
    }
    return absl::OkStatus();
  }
  if (t.present() && t.bytes.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("tensor '", t.name, "': its bytes were released"));
  }
  if (first < 0 || count < 0 || first + count > t.rows) {
    return absl::OutOfRangeError(
        absl::StrCat("tensor '", t.name, "': rows [", first, ", ", first + count, ") outside [0, ", t.rows, ")"));
  }
  INFERD_ASSIGN_OR_RETURN(const int64_t row_bytes, StoredRowBytes(t));
  for (int64_t r = first; r < first + count; ++r) {
    const int64_t src = StoredRow(t, r);
    const std::span<const uint8_t> row = t.bytes.subspan(src * row_bytes, row_bytes);
    float* dst = out + (r - first) * t.cols;
    if (t.ggml) {
      INFERD_RETURN_IF_ERROR(DequantizeGgml(t.ggml_type, row, t.cols, dst));
    } else {
      ConvertToF32(t.dtype, row, dst);
    }
    if (!t.scales.empty()) {
      const float scale = t.scales[t.scales.size() == 1 ? 0 : src];
      for (int64_t i = 0; i < t.cols; ++i) dst[i] *= scale;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> StoredRowBytes(const TensorDesc& t) {
  int64_t row_bytes = t.cols * static_cast<int64_t>(DTypeSize(t.dtype));
  if (t.ggml) {
    int64_t block_elems = 0, block_bytes = 0;
    if (!GgmlBlockLayout(t.ggml_type, &block_elems, &block_bytes) || t.cols % block_elems != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", GgmlTypeName(t.ggml_type), " rows of ",
                                                     t.cols, " elements are not whole blocks"));
    }
    row_bytes = t.cols / block_elems * block_bytes;
  }
  if (static_cast<int64_t>(t.bytes.size()) != row_bytes * t.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "' holds ", t.bytes.size(), " bytes, not ", row_bytes * t.rows));
  }
  return row_bytes;
}

int64_t StoredRow(const TensorDesc& t, int64_t r) {
  if (t.rotary_heads <= 0) return r;
  // llama.cpp's rotary order: Hugging Face row (half i, pair j) of a head is stored at 2j + i.
  const int64_t head_rows = t.rows / t.rotary_heads, h = r / head_rows, within = r % head_rows, half = head_rows / 2;
  return h * head_rows + 2 * (within % half) + within / half;
}

absl::StatusOr<TensorDesc> RowsOf(const TensorDesc& t, int64_t first, int64_t count, std::string name) {
  if (first < 0 || count <= 0 || first + count > t.rows || t.rotary_heads > 0 || t.padded()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': rows [", first, ", ", first + count,
                                                   ") cannot be split from its ", t.rows, " rows"));
  }
  TensorDesc part = t;
  part.name = std::move(name);
  part.rows = count;
  if (!t.random()) {
    int64_t row_bytes = t.cols * static_cast<int64_t>(DTypeSize(t.dtype));
    if (t.ggml) {
      int64_t block_elems = 0, block_bytes = 0;
      if (!GgmlBlockLayout(t.ggml_type, &block_elems, &block_bytes) || t.cols % block_elems != 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': rows are not whole blocks"));
      }
      row_bytes = t.cols / block_elems * block_bytes;
    }
    if (static_cast<int64_t>(t.bytes.size()) != row_bytes * t.rows) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' holds ", t.bytes.size(), " bytes"));
    }
    part.bytes = t.bytes.subspan(first * row_bytes, count * row_bytes);
  }
  if (t.scales.size() > 1) part.scales.assign(t.scales.begin() + first, t.scales.begin() + first + count);
  return part;
}

namespace {

// The tensor as stored, without its head padding.
TensorDesc Unpadded(const TensorDesc& t) {
  TensorDesc s = t;
  int64_t& padded_dim = t.pad_columns ? s.cols : s.rows;
  padded_dim = padded_dim / t.head_padded * t.head_stored;
  s.head_stored = s.head_padded = 0;
  return s;
}

// Rows of a padded tensor: the stored rows (or each row's stored columns) in their places, zeros between.
absl::Status DecodePaddedRows(const TensorDesc& t, int64_t first, int64_t count, float* out) {
  const TensorDesc stored = Unpadded(t);
  if (first < 0 || count < 0 || first + count > t.rows) {
    return absl::OutOfRangeError(
        absl::StrCat("tensor '", t.name, "': rows [", first, ", ", first + count, ") outside [0, ", t.rows, ")"));
  }
  std::fill(out, out + count * t.cols, 0.f);
  if (t.pad_columns) {
    std::vector<float> row(stored.cols);
    for (int64_t r = 0; r < count; ++r) {
      INFERD_RETURN_IF_ERROR(DecodeRowsAsStored(stored, first + r, 1, row.data()));
      for (int64_t c = 0; c < stored.cols; ++c) {
        out[r * t.cols + c / t.head_stored * t.head_padded + c % t.head_stored] = row[c];
      }
    }
    return absl::OkStatus();
  }
  for (int64_t r = first; r < first + count; ++r) {
    const int64_t head = r / t.head_padded, within = r % t.head_padded;
    if (within >= t.head_stored) continue;
    INFERD_RETURN_IF_ERROR(DecodeRowsAsStored(stored, head * t.head_stored + within, 1, out + (r - first) * t.cols));
  }
  return absl::OkStatus();
}

}  // namespace

TensorDesc& RoleOf(LayerTensors& L, LayerRole role, int32_t expert) {
  switch (role) {
    case LayerRole::kRouter:
      return L.router;
    case LayerRole::kExpertGate:
      return L.experts.at(expert).gate;
    case LayerRole::kExpertUp:
      return L.experts.at(expert).up;
    case LayerRole::kExpertDown:
      return L.experts.at(expert).down;
    case LayerRole::kInputNorm:
      return L.input_norm;
    case LayerRole::kQProj:
      return L.q_proj;
    case LayerRole::kKProj:
      return L.k_proj;
    case LayerRole::kVProj:
      return L.v_proj;
    case LayerRole::kQBias:
      return L.q_bias;
    case LayerRole::kKBias:
      return L.k_bias;
    case LayerRole::kVBias:
      return L.v_bias;
    case LayerRole::kQNorm:
      return L.q_norm;
    case LayerRole::kKNorm:
      return L.k_norm;
    case LayerRole::kOProj:
      return L.o_proj;
    case LayerRole::kAttnOutNorm:
      return L.attn_out_norm;
    case LayerRole::kPostNorm:
      return L.post_norm;
    case LayerRole::kGateProj:
      return L.gate_proj;
    case LayerRole::kUpProj:
      return L.up_proj;
    case LayerRole::kDownProj:
      return L.down_proj;
    case LayerRole::kMlpOutNorm:
      return L.mlp_out_norm;
  }
  return L.input_norm;  // unreachable: every role is listed
}

const TensorDesc& RoleOf(const LayerTensors& L, LayerRole role, int32_t expert) {
  return RoleOf(const_cast<LayerTensors&>(L), role, expert);
}

int64_t DimOf(const ModelConfig& c, Dim dim) {
  switch (dim) {
    case Dim::kOne:
      return 1;
    case Dim::kHidden:
      return c.hidden_size;
    case Dim::kQ:
      return c.q_width();
    case Dim::kKv:
      return c.kv_width();
    case Dim::kFf:
      return c.intermediate_size;
    case Dim::kHeadDim:
      return c.head_dim;
    case Dim::kExperts:
      return c.num_experts;
    case Dim::kMoeFf:
      return c.moe_intermediate_size;
  }
  return 0;
}

absl::Status DescribeLayer(const ModelConfig& c, bool gguf, int32_t index, const std::string& prefix,
                           const DescribeTensor& describe, LayerTensors* L) {
  std::vector<TensorSpec> specs = c.arch->tensors;
  if (c.sparse(index)) {  // the router and every expert's gate, up and down in place of the dense MLP
    specs = WithoutDenseMlp(std::move(specs));
    L->experts.resize(c.num_experts);
    for (const TensorSpec& t : c.arch->expert_tensors) {
      if (!IsExpertRole(t.role)) {
        specs.push_back(t);
        continue;
      }
      const std::string_view name = gguf ? t.gguf : t.hf;
      const size_t at = name.find("{e}");
      const int64_t rows = DimOf(c, t.rows), cols = DimOf(c, t.cols);
      if (at == std::string_view::npos) {  // the experts stacked in one [experts, rows, cols] tensor
        TensorDesc stacked;
        INFERD_RETURN_IF_ERROR(describe(prefix + std::string(name), {c.num_experts, rows, cols}, &stacked));
        for (int32_t e = 0; e < c.num_experts; ++e) {
          INFERD_ASSIGN_OR_RETURN(RoleOf(*L, t.role, e),
                                  RowsOf(stacked, e * rows, rows, absl::StrCat(stacked.name, "[", e, "]")));
        }
        continue;
      }
      for (int32_t e = 0; e < c.num_experts; ++e) {
        const std::string full = std::string(name.substr(0, at)) + std::to_string(e) + std::string(name.substr(at + 3));
        INFERD_RETURN_IF_ERROR(describe(prefix + full, {rows, cols}, &RoleOf(*L, t.role, e)));
      }
    }
  }
  const auto name_of = [&](const TensorSpec& t) { return gguf ? t.gguf : t.hf; };
  for (size_t i = 0; i < specs.size();) {
    size_t end = i + 1;  // the parts of one stored tensor: the specs after it with its name
    int64_t rows = DimOf(c, specs[i].rows);
    while (end < specs.size() && name_of(specs[end]) == name_of(specs[i])) rows += DimOf(c, specs[end++].rows);
    const int64_t cols = DimOf(c, specs[i].cols);
    const std::vector<int64_t> shape =
        specs[i].rows == Dim::kOne ? std::vector<int64_t>{cols} : std::vector{rows, cols};
    const std::string name = prefix + std::string(name_of(specs[i]));
    if (end == i + 1) {
      INFERD_RETURN_IF_ERROR(describe(name, shape, &RoleOf(*L, specs[i].role)));
      i = end;
      continue;
    }
    TensorDesc stored;
    INFERD_RETURN_IF_ERROR(describe(name, shape, &stored));
    for (int64_t first = 0; i < end; first += DimOf(c, specs[i++].rows)) {
      const TensorSpec& part = specs[i];
      INFERD_ASSIGN_OR_RETURN(
          RoleOf(*L, part.role),
          RowsOf(stored, first, DimOf(c, part.rows), absl::StrCat(stored.name, "[", LayerRoleName(part.role), "]")));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeRows(const TensorDesc& t, int64_t first, int64_t count, float* out) {
  absl::Status s = t.padded() ? DecodePaddedRows(t, first, count, out) : DecodeRowsAsStored(t, first, count, out);
  if (s.ok() && t.add != 0) {
    for (int64_t i = 0; i < count * t.cols; ++i) out[i] += t.add;
  }
  return s;
}

}  // namespace inferd
