// FP8 checkpoints as published (tests/fixtures/models/*-fp8, written by tools/make_fp8_checkpoint.py from the bf16
// test models): compressed-tensors "float-quantized" with per-channel weight scales (llama3-tiny-fp8, and
// mixtral-tiny-fp8: a mixture's experts) and the older `quant_method: fp8` with per-tensor scales and static input
// scales (qwen2-tiny-fp8). The loader reads the e4m3 weights with their scales; the cpu backend serves them
// dequantized; unsupported quantization configs are refused naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/model/model_tensors.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

namespace fs = std::filesystem;

std::vector<float> Rows(const TensorDesc& t) {
  std::vector<float> out(t.numel());
  EXPECT_TRUE(DecodeRows(t, 0, t.rows, out.data()).ok()) << t.name;
  return out;
}

// Each dequantized weight within half an e4m3 step of the bf16 original (relative 1/16 of normal values, half the
// smallest subnormal step below), and each row's scale its largest magnitude / 448.
void ExpectCloseToOriginal(const TensorDesc& fp8, const TensorDesc& bf16, bool per_channel) {
  ASSERT_EQ(fp8.dtype, DType::kF8E4M3) << fp8.name;
  ASSERT_EQ(fp8.scales.size(), per_channel ? static_cast<size_t>(fp8.rows) : 1u) << fp8.name;
  const std::vector<float> got = Rows(fp8), want = Rows(bf16);
  float tensor_max = 0;
  for (float v : want) tensor_max = std::max(tensor_max, std::abs(v));
  int bad = 0;
  for (int64_t r = 0; r < fp8.rows; ++r) {
    float row_max = 0;
    for (int64_t c = 0; c < fp8.cols; ++c) row_max = std::max(row_max, std::abs(want[r * fp8.cols + c]));
    const float scale = fp8.scales[per_channel ? r : 0];
    EXPECT_FLOAT_EQ(scale, (per_channel ? row_max : tensor_max) / 448.f) << fp8.name << " row " << r;
    for (int64_t c = 0; c < fp8.cols; ++c) {
      const float w = want[r * fp8.cols + c], q = got[r * fp8.cols + c];
      if (!(std::abs(q - w) <= std::abs(w) / 16 + scale * std::ldexp(1.f, -10) * 1.0001f) && ++bad <= 3) {
        ADD_FAILURE() << fp8.name << "[" << r << ", " << c << "] = " << q << ", bf16 " << w;
      }
    }
  }
  EXPECT_EQ(bad, 0) << fp8.name;
}

TEST(Fp8Checkpoint, CompressedTensorsPerChannelWeightsLoadWithTheirScales) {
  auto fp8 = LoadModel(testing::ModelDir("llama3-tiny-fp8"));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  auto bf16 = LoadModel(testing::ModelDir("llama3-tiny"));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE((*fp8)->config.quantization.fp8);
  EXPECT_EQ((*fp8)->config.quantization.description,
            "compressed-tensors float-quantized: weights per channel, inputs per token");
  EXPECT_TRUE((*fp8)->tensors.fp8_checkpoint);
  EXPECT_FALSE((*bf16)->tensors.fp8_checkpoint);
  for (size_t l = 0; l < (*fp8)->tensors.layers.size(); ++l) {
    const LayerTensors& q = (*fp8)->tensors.layers[l];
    const LayerTensors& o = (*bf16)->tensors.layers[l];
    for (auto [a, b] :
         {std::pair{&q.q_proj, &o.q_proj}, std::pair{&q.k_proj, &o.k_proj}, std::pair{&q.v_proj, &o.v_proj},
          std::pair{&q.o_proj, &o.o_proj}, std::pair{&q.gate_proj, &o.gate_proj}, std::pair{&q.up_proj, &o.up_proj},
          std::pair{&q.down_proj, &o.down_proj}}) {
      ExpectCloseToOriginal(*a, *b, /*per_channel=*/true);
    }
    EXPECT_EQ(q.input_norm.dtype, DType::kBF16);  // norms are not quantized
  }
  EXPECT_EQ((*fp8)->tensors.lm_head.dtype, DType::kBF16);  // ignore: ["lm_head"]
}

// A mixture's checkpoint as llm-compressor writes it (mixtral-tiny-fp8): every expert's products F8_E4M3 per
// channel, the routers left in 16 bits (their logits choose the experts).
TEST(Fp8Checkpoint, AMixturesExpertsLoadPerChannelAndItsRoutersStayBf16) {
  auto fp8 = LoadModel(testing::ModelDir("mixtral-tiny-fp8"));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  auto bf16 = LoadModel(testing::ModelDir("mixtral-tiny"));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE((*fp8)->tensors.fp8_checkpoint);
  ASSERT_EQ((*fp8)->tensors.layers.size(), (*bf16)->tensors.layers.size());
  int experts = 0;
  for (size_t l = 0; l < (*fp8)->tensors.layers.size(); ++l) {
    const LayerTensors& q = (*fp8)->tensors.layers[l];
    const LayerTensors& o = (*bf16)->tensors.layers[l];
    EXPECT_EQ(q.router.dtype, DType::kBF16) << "layer " << l;
    ASSERT_EQ(q.experts.size(), o.experts.size());
    for (size_t e = 0; e < q.experts.size(); ++e, ++experts) {
      ExpectCloseToOriginal(q.experts[e].gate, o.experts[e].gate, /*per_channel=*/true);
      ExpectCloseToOriginal(q.experts[e].up, o.experts[e].up, /*per_channel=*/true);
      ExpectCloseToOriginal(q.experts[e].down, o.experts[e].down, /*per_channel=*/true);
    }
  }
  EXPECT_GT(experts, 0);
}

TEST(Fp8Checkpoint, OlderFp8FormatPerTensorScalesLoad) {
  auto fp8 = LoadModel(testing::ModelDir("qwen2-tiny-fp8"));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  auto bf16 = LoadModel(testing::ModelDir("qwen2-tiny"));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*fp8)->config.quantization.description, "fp8: weights per tensor, inputs static per tensor");
  const LayerTensors& q = (*fp8)->tensors.layers[0];
  const LayerTensors& o = (*bf16)->tensors.layers[0];
  ExpectCloseToOriginal(q.q_proj, o.q_proj, /*per_channel=*/false);
  ExpectCloseToOriginal(q.down_proj, o.down_proj, /*per_channel=*/false);
  EXPECT_EQ(q.q_bias.dtype, DType::kBF16);
}

// The cpu backend serves an FP8 checkpoint dequantized (fp32 arithmetic on the e4m3 values times their scales).
TEST(Fp8Checkpoint, TheCpuBackendServesItDequantized) {
  for (const char* name : {"llama3-tiny-fp8", "qwen2-tiny-fp8", "mixtral-tiny-fp8"}) {
    Config config;
    config.model.path = testing::ModelDir(name);
    config.engine.backend = "cpu";
    config.engine.cpu_kv_cache_gib = 0.05;
    auto engine = Engine::Create(config);
    ASSERT_TRUE(engine.ok()) << name << ": " << engine.status();
    auto sink = std::make_shared<testing::CollectingSink>();
    Request r;
    r.id = "fp8";
    r.prompt = {5, 17, 42, 99, 7};
    r.sampling.temperature = 0;
    r.stopping.max_tokens = 12;
    r.stopping.ignore_eos = true;
    r.top_logprobs = 1;
    r.sink = sink;
    ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
    ASSERT_TRUE(sink->WaitFor(absl::Seconds(60)));
    EXPECT_EQ(sink->finish, FinishReason::kLength) << sink->error;
    EXPECT_EQ(sink->tokens.size(), 12u);
    for (const auto& lp : sink->logprobs) EXPECT_TRUE(std::isfinite(lp.logprob) && lp.logprob <= 0) << name;
  }
}

// Float tensors to add to a checkpoint, by name: shape and values.
using ExtraTensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

// compressed-tensors' kv_cache_scheme as llm-compressor writes it, with the given strategy.
nlohmann::json KvScheme(const std::string& strategy) {
  return {{"num_bits", 8}, {"type", "float"}, {"strategy", strategy}, {"dynamic", false}, {"symmetric", true}};
}

// A copy of llama3-tiny-fp8 whose config.json has `edit` applied to its quantization_config. Extra tensors go into
// a second shard (model-extra.safetensors, F32) named with model.safetensors by a model.safetensors.index.json.
class EditedCheckpoint {
 public:
  explicit EditedCheckpoint(const std::function<void(nlohmann::json&)>& edit, const ExtraTensors& extra = {})
      : dir_(fs::temp_directory_path() / ("inferd-fp8-" + std::to_string(::getpid()) + "-" + std::to_string(n_++))) {
    fs::create_directories(dir_);
    for (const auto& f : fs::directory_iterator(testing::ModelDir("llama3-tiny-fp8"))) {
      fs::copy(f.path(), dir_ / f.path().filename());
    }
    nlohmann::json config = testing::ReadJson((dir_ / "config.json").string());
    edit(config);
    std::ofstream(dir_ / "config.json") << config.dump();
    if (!extra.empty()) AddShard(extra);
  }
  ~EditedCheckpoint() { fs::remove_all(dir_); }
  std::string path() const { return dir_.string(); }

 private:
  void AddShard(const ExtraTensors& extra) {
    nlohmann::json header = nlohmann::json::object(), map = nlohmann::json::object();
    std::string data;
    for (const auto& [name, tensor] : extra) {
      const auto& [shape, values] = tensor;
      header[name] = {
          {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + 4 * values.size()}}};
      data.append(reinterpret_cast<const char*>(values.data()), 4 * values.size());
      map[name] = "model-extra.safetensors";
    }
    const std::string text = header.dump();
    const uint64_t n = text.size();
    std::ofstream shard(dir_ / "model-extra.safetensors", std::ios::binary);
    shard.write(reinterpret_cast<const char*>(&n), 8);
    shard << text << data;
    // The first shard's names, from its header.
    std::ifstream first(dir_ / "model.safetensors", std::ios::binary);
    uint64_t len = 0;
    first.read(reinterpret_cast<char*>(&len), 8);
    std::string first_header(len, '\0');
    first.read(first_header.data(), static_cast<std::streamsize>(len));
    const nlohmann::json names = nlohmann::json::parse(first_header);
    for (const auto& [name, info] : names.items()) {
      if (name != "__metadata__") map[name] = "model.safetensors";
    }
    std::ofstream(dir_ / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  }

  static inline int n_ = 0;
  fs::path dir_;
};

TEST(Fp8Checkpoint, UnsupportedQuantizationConfigsAreRefusedNamingTheField) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& c) {
         c["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
       },
       "quantization_config.quant_method = \"awq\" is not supported; supported: \"compressed-tensors\""},
      {[](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4; },
       "quantization_config.config_groups.group_0.weights.num_bits = 4 is not supported; supported: 8"},
      {[](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] = "int"; },
       "quantization_config.config_groups.group_0.weights.type = \"int\""},
      {[](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "group"; },
       "weights.strategy = \"group\" is not supported; supported: \"tensor\", \"channel\""},
      {[](nlohmann::json& c) { c["quantization_config"]["format"] = "pack-quantized"; },
       "quantization_config.format = \"pack-quantized\""},
      {[](nlohmann::json& c) {
         c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
       },
       "quantization_config.weight_block_size = [128,128] is not supported"},
      {[](nlohmann::json& c) { c.erase("quantization_config"); },
       "is F8_E4M3 but config.json has no quantization_config"},
      {[](nlohmann::json& c) { c["quantization_config"]["kv_cache_scheme"] = KvScheme("attn_head"); },
       "quantization_config.kv_cache_scheme.strategy = \"attn_head\" is not supported; supported: \"tensor\""},
      {[](nlohmann::json& c) {
         c["quantization_config"]["kv_cache_scheme"] = KvScheme("tensor");
         c["quantization_config"]["kv_cache_scheme"]["dynamic"] = true;
       },
       "quantization_config.kv_cache_scheme.dynamic = true is not supported; supported: false"},
      {[](nlohmann::json& c) { c["quantization_config"]["kv_cache_scheme"] = KvScheme("tensor"); },
       "weights: missing tensor 'model.layers.0.self_attn.k_scale' (config.json's "
       "quantization_config.kv_cache_scheme needs one)"},
  };
  for (const Case& c : cases) {
    EditedCheckpoint dir(c.edit);
    auto model = LoadModel(dir.path());
    ASSERT_FALSE(model.ok()) << c.message;
    EXPECT_NE(model.status().message().find(c.message), std::string::npos) << model.status();
  }
}

// An 8-bit float KV cache's per-tensor scales (kv_cache_scheme): each layer's self_attn.k_scale and v_scale are
// read ([1] or [] tensors); a missing one, one of several values or one not finite and positive is refused naming
// the tensor.
TEST(Fp8Checkpoint, KvCacheScalesAreReadPerLayerAndBadOnesRefusedNamingTheTensor) {
  const auto with_scheme = [](nlohmann::json& c) { c["quantization_config"]["kv_cache_scheme"] = KvScheme("tensor"); };
  const int32_t layers = LoadModel(testing::ModelDir("llama3-tiny-fp8")).value()->config.num_layers;
  ExtraTensors scales;
  for (int32_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    scales[p + "k_scale"] = {{1}, {0.25f + l}};
    scales[p + "v_scale"] = {{}, {3.5f * (l + 1)}};
  }
  {
    EditedCheckpoint dir(with_scheme, scales);
    auto model = LoadModel(dir.path());
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE((*model)->tensors.kv_cache_scales);
    EXPECT_EQ((*model)->config.quantization.description,
              "compressed-tensors float-quantized: weights per channel, inputs per token, KV cache scales per tensor");
    for (int32_t l = 0; l < layers; ++l) {
      EXPECT_EQ((*model)->tensors.layers[l].k_cache_scale, 0.25f + l);
      EXPECT_EQ((*model)->tensors.layers[l].v_cache_scale, 3.5f * (l + 1));
    }
  }
  {  // without kv_cache_scheme the scales are not read: the cache (if fp8) uses 1
    EditedCheckpoint dir([](nlohmann::json&) {}, scales);
    auto model = LoadModel(dir.path());
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_FALSE((*model)->tensors.kv_cache_scales);
    EXPECT_EQ((*model)->tensors.layers[1].k_cache_scale, 1.f);
  }
  const std::string v1 = "model.layers.1.self_attn.v_scale";
  for (const auto& [values, message] :
       {std::pair{std::vector<float>{0.f},
                  "weights: 'model.layers.1.self_attn.v_scale' holds 0; allowed: a finite "
                  "value > 0"},
        std::pair{std::vector<float>{1.f, 2.f},
                  "weights: 'model.layers.1.self_attn.v_scale' must hold one float; it "
                  "holds 2 float32 values"}}) {
    ExtraTensors bad = scales;
    bad[v1] = {{static_cast<int64_t>(values.size())}, values};
    EditedCheckpoint dir(with_scheme, bad);
    auto model = LoadModel(dir.path());
    ASSERT_FALSE(model.ok()) << message;
    EXPECT_NE(model.status().message().find(message), std::string::npos) << model.status();
  }
}

}  // namespace
}  // namespace inferd
