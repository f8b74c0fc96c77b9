// The GGUF reader: well-formed files, every kind of hostile file (each refused with a message naming the
// problem), dequantization against llama.cpp's gguf package, and the tokenizer and model built from GGUF.
#include "engine/model/formats/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "engine/backends/cpu/cpu_weights.h"
#include "engine/model/formats/gguf_model.h"
#include "engine/model/model.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/gguf_builder.h"

namespace inferd {
namespace {

using testing::GgufBuilder;

constexpr uint64_t kHuge = uint64_t{1} << 63;

std::string ParseError(const GgufBuilder& b) {
  auto g = ParseGguf(b.bytes);
  return g.ok() ? "(parsed)" : std::string(g.status().message());
}

// A valid file with one F32 tensor of 8 elements.
GgufBuilder OneTensor() {
  GgufBuilder b;
  b.Header(3, 1, 1).KvStr("general.architecture", "llama").Tensor("t", {8}, 0, 0).Align().Zeros(32);
  return b;
}

TEST(GgufReader, ParsesMetadataOfEveryTypeAndTensors) {
  GgufBuilder b;
  b.Header(3, 2, 5).KvU32("a.u32", 7).KvF32("a.f32", 1.5f).KvStr("a.str", "héllo").KvStrings("a.strs", {"x", "", "yz"});
  b.Str("a.nested").U32(9).U32(9).U64(2);  // an array of two arrays of i8
  b.U32(1).U64(2).U8(0xFF).U8(3).U32(1).U64(0);
  b.Tensor("w", {32, 2}, 8, 0).Tensor("v", {4}, 0, 96).Align().Zeros(96 + 16);
  auto g = ParseGguf(b.bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->Find("a.u32")->i, 7);
  EXPECT_EQ(g->Find("a.f32")->f, 1.5);
  EXPECT_EQ(g->Find("a.str")->s, "héllo");
  EXPECT_EQ(g->Find("a.strs")->strings, (std::vector<std::string>{"x", "", "yz"}));
  ASSERT_EQ(g->Find("a.nested")->arrays.size(), 2u);
  EXPECT_EQ(g->Find("a.nested")->arrays[0].ints, (std::vector<int64_t>{-1, 3}));
  ASSERT_EQ(g->tensors.size(), 2u);
  EXPECT_EQ(g->FindTensor("w")->size, 68u);  // 2 Q8_0 blocks
  EXPECT_EQ(g->FindTensor("v")->numel, 4);
}

struct BadCase {
  const char* name;
  GgufBuilder file;
  const char* message;
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  auto add = [&](const char* name, GgufBuilder b, const char* msg) { cases.push_back({name, std::move(b), msg}); };
  {
    GgufBuilder b;
    b.Raw("GGML", 4).U32(3);
    add("bad_magic", b, "not a GGUF file");
  }
  {
    GgufBuilder b;
    b.Header(1, 0, 0);
    add("version_1", b, "version 1 is not supported");
  }
  {
    GgufBuilder b;
    b.Raw("GGUF", 4).U32(3).U64(0);
    add("truncated_header", b, "runs past the end");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, kHuge);
    add("kv_count_2_63", b, "metadata_kv_count");
  }
  {
    GgufBuilder b;
    b.Header(3, kHuge, 0);
    add("tensor_count_2_63", b, "tensor_count");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 1).U64(kHuge).Zeros(64);
    add("key_length_2_63", b, "string length");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 1).Str("k").U32(8).U64(100).Raw("abc", 3);
    add("string_past_eof", b, "runs past the end of the file");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 1).Str("k").U32(9).U32(0).U64(kHuge);
    add("array_2_63", b, "cannot fit");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 1).Str("k").U32(13).U32(0);
    add("unknown_value_type", b, "unknown value type 13");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 1).Str("k").U32(7).U8(2);
    add("bool_2", b, "neither 0 nor 1");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 2).KvU32("k", 1).KvU32("k", 2);
    add("duplicate_key", b, "repeats");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 1).Str("general.alignment").U32(4).U32(48);
    add("alignment_48", b, "power of two");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0);
    add("dims_overflow", b, "overflow");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {0}, 0, 0);
    add("zero_dim", b, "zero");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {1, 1, 1, 1, 1}, 0, 0);
    add("five_dims", b, "5 dimensions");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {32}, 13, 0);
    add("unsupported_type", b, "type 13");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {33}, 8, 0);
    add("partial_block", b, "not a multiple");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {8}, 0, 4).Align().Zeros(64);
    add("misaligned_offset", b, "alignment");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {8}, 0, 64).Align().Zeros(32);
    add("offset_out_of_range", b, "outside the data section");
  }
  {
    GgufBuilder b;
    b.Header(3, 1, 0).Tensor("t", {uint64_t{1} << 32}, 0, 0).Align().Zeros(32);
    add("larger_than_file", b, "larger than the file");
  }
  {
    GgufBuilder b;
    b.Header(3, 2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {16}, 0, 32).Align().Zeros(128);
    add("overlapping_tensors", b, "overlap");
  }
  {
    GgufBuilder b;
    b.Header(3, 2, 0).Tensor("a", {8}, 0, 0).Tensor("a", {8}, 0, 32).Align().Zeros(64);
    add("duplicate_tensor", b, "repeats");
  }
  {
    GgufBuilder b;
    b.Header(3, 0, 1).Str("k").U32(9).U32(9).U64(1).U32(9).U64(1).U32(9).U64(1).U32(4).U64(1).U32(1);
    add("arrays_nested_too_deep", b, "nested too deep");
  }
  return cases;
}

TEST(GgufReader, RefusesEveryHostileFileWithAClearMessage) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    const std::string err = ParseError(c.file);
    EXPECT_NE(err.find(c.message), std::string::npos) << err;
    // Any prefix of a hostile file is refused too, without reading past its end.
    for (size_t n = 0; n < c.file.bytes.size(); n += 7) {
      EXPECT_FALSE(ParseGguf(std::span(c.file.bytes.data(), n)).ok());
    }
  }
  EXPECT_EQ(ParseError(OneTensor()), "(parsed)");
}

TEST(GgufDequantize, MatchesLlamaCppGgufPackage) {
  auto f = GgufFile::Open(testing::SourcePath("tests/fixtures/gguf/quants.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  const nlohmann::json expected = testing::ReadJson(testing::SourcePath("tests/fixtures/gguf/quants.json"))["expected"];
  ASSERT_EQ(expected.size(), 9u);
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    SCOPED_TRACE(it.key());
    const GgufTensor* t = (*f)->contents().FindTensor(it.key());
    ASSERT_NE(t, nullptr);
    const std::vector<float> want = it.value().get<std::vector<float>>();
    ASSERT_EQ(static_cast<size_t>(t->numel), want.size());
    std::vector<float> got(t->numel);
    ASSERT_TRUE(DequantizeGgml(t->type, (*f)->Bytes(*t), t->numel, got.data()).ok());
    int nonzero = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::abs(want[i]) + 1e-9f) << "element " << i;
      nonzero += want[i] != 0;
    }
    EXPECT_GT(nonzero, static_cast<int>(want.size()) / 2);
  }
  std::vector<float> out(64);
  EXPECT_FALSE(DequantizeGgml(8, std::span<const uint8_t>(), 32, out.data()).ok()) << "bytes must match the count";
}

// GGUF tokenizers against Hugging Face tokenizers of the same model on the hard-string corpus.
struct TokCase {
  const char* gguf;
  const char* fixture;
};
class GgufTokenizer : public ::testing::TestWithParam<TokCase> {};

TEST_P(GgufTokenizer, IdsAndDecodesEqualHuggingFace) {
  auto f = GgufFile::Open(testing::SourcePath(GetParam().gguf));
  ASSERT_TRUE(f.ok()) << f.status() << " (bash scripts/setup.sh fetches the bundled model)";
  auto json = GgufTokenizerJson((*f)->contents());
  ASSERT_TRUE(json.ok()) << json.status();
  auto tok = Tokenizer::FromSpec(*json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const nlohmann::json fixture = testing::ReadJson(testing::SourcePath(GetParam().fixture));
  ASSERT_GT(fixture["cases"].size(), 40u);
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["text"].dump());
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ((*tok)->Encode(text, true), c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ((*tok)->Encode(text, false), c["ids_no_special"].get<std::vector<int32_t>>());
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ((*tok)->Decode(ids, true), c["decoded"].get<std::string>());
    EXPECT_EQ((*tok)->Decode(ids, false), c["decoded_with_special"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Files, GgufTokenizer,
    ::testing::Values(TokCase{"models/SmolLM2-135M-Instruct.Q4_1.gguf", "tests/fixtures/tokenizer/smollm2-gguf.json"},
                      TokCase{"tests/fixtures/models/llama2-tiny.gguf", "tests/fixtures/tokenizer/llama2-tiny.json"},
                      TokCase{"tests/fixtures/models/qwen2-tiny.gguf", "tests/fixtures/tokenizer/qwen2-tiny.json"}),
    [](const auto& info) {
      return std::string(info.index == 0 ? "smollm2" : info.index == 1 ? "llama2" : "qwen2");
    });

// The GGUF conversion holds the same weights as the Hugging Face directory, q/k rows included; the mixtures' routers
// and experts (stacked in the GGUF file) too, and their experts' settings (qwen3-moe-tiny's layer 1 is dense).
TEST(GgufModel, WeightsEqualTheHuggingFaceDirectory) {
  for (const char* name :
       {"llama2-tiny", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny", "phi3-tiny", "mixtral-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(name);
    auto hf = LoadModel(testing::ModelDir(name));
    auto gg = LoadModel(testing::ModelDir(name) + ".gguf");
    ASSERT_TRUE(hf.ok()) << hf.status();
    ASSERT_TRUE(gg.ok()) << gg.status();
    const ModelConfig &a = (*hf)->config, &b = (*gg)->config;
    EXPECT_EQ(a.architecture, b.architecture);
    EXPECT_EQ(a.num_heads, b.num_heads);
    EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    EXPECT_EQ(a.arch, b.arch);
    EXPECT_EQ((*hf)->eos_token_ids, (*gg)->eos_token_ids);
    auto hw = BuildCpuWeights((*hf)->tensors);
    auto gw = BuildCpuWeights((*gg)->tensors);
    ASSERT_TRUE(hw.ok()) << hw.status();
    ASSERT_TRUE(gw.ok()) << gw.status();
    ASSERT_EQ(hw->layers.size(), gw->layers.size());
    EXPECT_EQ(hw->layers[1].qkv.data, gw->layers[1].qkv.data);
    EXPECT_EQ(hw->layers[1].qkv_bias.data, gw->layers[1].qkv_bias.data);
    EXPECT_EQ(hw->layers[1].q_norm.data, gw->layers[1].q_norm.data);
    EXPECT_EQ(hw->layers[1].k_norm.data, gw->layers[1].k_norm.data);
    EXPECT_EQ(hw->layers[1].q_norm.data.size(), a.arch->qk_norm() ? size_t(a.head_dim) : 0u);
    EXPECT_EQ(hw->layers[1].post_norm.data, gw->layers[1].post_norm.data);  // Gemma's: 1 + w from both
    EXPECT_EQ(hw->layers[1].attn_out_norm.data, gw->layers[1].attn_out_norm.data);
    EXPECT_EQ(hw->layers[1].mlp_out_norm.data, gw->layers[1].mlp_out_norm.data);
    EXPECT_EQ(hw->final_norm.data, gw->final_norm.data);
    EXPECT_EQ(a.num_experts, b.num_experts);
    EXPECT_EQ(a.experts_per_token, b.experts_per_token);
    EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
    EXPECT_EQ(a.normalize_top_k, b.normalize_top_k);
    EXPECT_EQ(a.sparse_layers, b.sparse_layers);
    for (size_t l = 0; l < hw->layers.size(); ++l) {
      EXPECT_EQ(hw->layers[l].gate_up.data, gw->layers[l].gate_up.data);
      EXPECT_EQ(hw->layers[l].router.data, gw->layers[l].router.data);
      ASSERT_EQ(hw->layers[l].expert_gate_up.size(), size_t(a.sparse(l) ? a.num_experts : 0));
      ASSERT_EQ(hw->layers[l].expert_gate_up.size(), gw->layers[l].expert_gate_up.size());
      for (size_t e = 0; e < hw->layers[l].expert_gate_up.size(); ++e) {
        EXPECT_EQ(hw->layers[l].expert_gate_up[e].data, gw->layers[l].expert_gate_up[e].data);
        EXPECT_EQ(hw->layers[l].expert_down[e].data, gw->layers[l].expert_down[e].data);
      }
    }
    EXPECT_EQ(a.layer_window, b.layer_window);
    EXPECT_EQ(a.rope_local_theta, b.rope_local_theta);
    EXPECT_EQ(a.embedding_scale(), b.embedding_scale());
    EXPECT_EQ(a.rotary_dim, b.rotary_dim);  // Phi-3's: partial rotary, LongRoPE
    EXPECT_EQ(a.rope.type, b.rope.type);
    EXPECT_EQ(a.rope.short_factor, b.rope.short_factor);
    EXPECT_EQ(a.rope.long_factor, b.rope.long_factor);
    EXPECT_NEAR(a.rope.attention_factor, b.rope.attention_factor, 1e-6);
    EXPECT_EQ(hw->layers[0].gate_up.data, gw->layers[0].gate_up.data);
    EXPECT_EQ(hw->lm_head().data, gw->lm_head().data);
    ASSERT_NE((*gg)->chat_template, nullptr);
  }
}

// Quantized stacked experts: each expert's rows are whole Q8_0 blocks cut from the 3-D tensor, and decode to that
// expert's own weights within Q8_0's rounding (half a step of each 32-value block's scale, the scale itself fp16:
// under 0.6 of a step), nowhere near another expert's.
TEST(GgufModel, QuantizedStackedExpertsDecodeToEachExpertsWeights) {
  auto hf = LoadModel(testing::ModelDir("qwen3-moe-tiny"));
  auto gg = LoadModel(testing::ModelDir("qwen3-moe-tiny") + "-experts-q8_0.gguf");
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(gg.ok()) << gg.status();
  auto hw = BuildCpuWeights((*hf)->tensors);
  auto gw = BuildCpuWeights((*gg)->tensors);
  ASSERT_TRUE(hw.ok()) << hw.status();
  ASSERT_TRUE(gw.ok()) << gw.status();
  int checked = 0;
  for (size_t l = 0; l < hw->layers.size(); ++l) {
    ASSERT_EQ(hw->layers[l].expert_down.size(), gw->layers[l].expert_down.size());
    for (size_t e = 0; e < hw->layers[l].expert_down.size(); ++e) {
      for (auto part : {&CpuLayerWeights::expert_gate_up, &CpuLayerWeights::expert_down}) {
        const Matrix &want = (hw->layers[l].*part)[e], &got = (gw->layers[l].*part)[e];
        ASSERT_EQ(want.data.size(), got.data.size());
        for (size_t b = 0; b < want.data.size(); b += 32) {  // rows are whole blocks: cols % 32 == 0
          float amax = 0.f;
          for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(want.data[i]));
          for (size_t i = b; i < b + 32; ++i) {
            ASSERT_LE(std::abs(got.data[i] - want.data[i]), amax / 127.f * 0.6f + 1e-6f)
                << "layer " << l << " expert " << e << " element " << i;
          }
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
  EXPECT_NE(gw->layers[0].expert_down[0].data, hw->layers[0].expert_down[0].data) << "the file's experts are Q8_0";
}

std::string WriteTemp(const std::vector<uint8_t>& bytes) {
  char path[] = "/tmp/inferd-gguf-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
  return path;
}

TEST(GgufModel, MetadataOfTheWrongTypeOrArchitectureIsRefusedByName) {
  GgufBuilder wrong_type;
  wrong_type.Header(3, 0, 2).KvStr("general.architecture", "llama").KvStr("llama.block_count", "thirty");
  GgufBuilder wrong_arch;
  wrong_arch.Header(3, 0, 1).KvStr("general.architecture", "gpt-neox");
  GgufBuilder missing;
  missing.Header(3, 0, 1).KvStr("general.architecture", "llama");
  GgufBuilder experts;  // experts in a family that has none
  experts.Header(3, 0, 3)
      .KvStr("general.architecture", "qwen2")
      .KvU32("qwen2.expert_count", 8)
      .KvU32("qwen2.block_count", 32);
  const std::pair<GgufBuilder*, const char*> cases[] = {
      {&wrong_type, "'llama.block_count' is a string, not an integer"},
      {&wrong_arch, "'gpt-neox' is not supported"},
      {&missing, "'llama.block_count' is missing"},
      {&experts, "'qwen2' with experts is not supported"}};
  for (const auto& [b, msg] : cases) {
    const std::string path = WriteTemp(b->bytes);
    auto m = LoadModel(path);
    unlink(path.c_str());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(msg), std::string::npos) << m.status();
  }
}

TEST(GgufModel, MissingFileNamesTheCommandThatFetchesIt) {
  auto m = LoadModel("models/no-such-model.gguf");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("scripts/setup.sh"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace inferd
