#include "engine/model/model_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "engine/model/model.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

// A config ParseModelConfig refuses, with `mention` in its message.
void ExpectError(const nlohmann::json& cfg, const std::string& mention) {
  auto c = ParseModelConfig(cfg.dump());
  ASSERT_FALSE(c.ok()) << mention;
  EXPECT_NE(c.status().message().find(mention), std::string::npos) << c.status().message();
}

TEST(ModelConfig, ReadsTransformers5RopeParametersWithLlama3Scaling) {
  auto c = ParseModelConfig(testing::ReadJson(testing::ModelDir("llama3-tiny") + "/config.json").dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, "llama3");
  EXPECT_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->num_kv_heads, 2);
  const std::vector<float> inv = RopeInverseFrequencies(*c);
  // The highest frequency (wavelength 2π < 64/4) is untouched; the lowest is divided by the factor.
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv.back(), std::pow(500000.0, -14.0 / 16) / 8.0, 1e-12);
}

TEST(ModelConfig, ExplicitHeadDimAndQkvBias) {
  auto m = ParseModelConfig(testing::ReadJson(testing::ModelDir("mistral-tiny") + "/config.json").dump());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->head_dim, 32);
  auto q = ParseModelConfig(testing::ReadJson(testing::ModelDir("qwen2-tiny") + "/config.json").dump());
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->arch, &Qwen2Architecture());
  EXPECT_TRUE(q->arch->qkv_bias());
  EXPECT_TRUE(q->tie_word_embeddings);
}

// Each config.json architecture is served by one family; Qwen3's layer is Llama's with the per-head q/k norm
// inserted before the rotary embedding, and nothing else differs.
TEST(ModelConfig, EachArchitectureFindsItsFamilyAndItsLayerProgram) {
  nlohmann::json j = testing::ReadJson(testing::ModelDir("llama2-tiny") + "/config.json");
  for (const auto& [name, family] :
       std::vector<std::pair<std::string, const Architecture*>>{{"LlamaForCausalLM", &LlamaArchitecture()},
                                                                {"MistralForCausalLM", &LlamaArchitecture()},
                                                                {"Qwen2ForCausalLM", &Qwen2Architecture()},
                                                                {"Qwen3ForCausalLM", &Qwen3Architecture()},
                                                                {"Phi3ForCausalLM", &Phi3Architecture()}}) {
    j["architectures"] = {name};
    auto c = ParseModelConfig(j.dump());
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->arch, family) << name;
  }
  std::vector<LayerOp> qwen3 = Qwen3Architecture().layer;
  const auto at = std::find(qwen3.begin(), qwen3.end(), LayerOp::kQkNorm);
  ASSERT_NE(at, qwen3.end());
  EXPECT_EQ(*std::next(at), LayerOp::kRope);
  qwen3.erase(at);
  EXPECT_EQ(qwen3, LlamaArchitecture().layer);
  EXPECT_TRUE(Qwen3Architecture().qk_norm());
  EXPECT_FALSE(Qwen3Architecture().qkv_bias());
  EXPECT_EQ(FindGgufArchitecture("qwen3"), &Qwen3Architecture());
  EXPECT_EQ(FindGgufArchitecture("gpt2"), nullptr);
  // One GGUF name, a dense family and a mixture: llama.cpp writes Mixtral as "llama" with experts.
  EXPECT_EQ(FindGgufArchitecture("llama"), &LlamaArchitecture());
  EXPECT_EQ(FindGgufArchitecture("llama", /*experts=*/true), &MixtralArchitecture());
  EXPECT_EQ(FindGgufArchitecture("qwen3moe", /*experts=*/true), &Qwen3MoeArchitecture());
  EXPECT_EQ(FindGgufArchitecture("qwen3moe"), nullptr);
  EXPECT_NE(SupportedGgufArchitectures().find("qwen3moe (with experts)"), std::string::npos);
  EXPECT_NE(SupportedArchitectures().find("Qwen3ForCausalLM"), std::string::npos);
}

// A family's tensor table (Architecture::tensors) fills each role once, has every tensor a decoder layer needs, and
// agrees with its program: a block that reads a tensor (the q/k norms, the norms on the halves' outputs) is in the
// program exactly when its tensor is in the table. The parts of a fused tensor share both names.
TEST(ModelConfig, EveryFamilysTensorsFillEachRoleOnceAndAgreeWithItsProgram) {
  using enum LayerRole;
  for (const Architecture* a :
       {&LlamaArchitecture(), &Qwen2Architecture(), &Qwen3Architecture(), &Gemma2Architecture(), &Gemma3Architecture(),
        &Phi3Architecture(), &MixtralArchitecture(), &Qwen3MoeArchitecture()}) {
    std::set<LayerRole> roles;
    for (const TensorSpec& t : a->tensors)
      EXPECT_TRUE(roles.insert(t.role).second) << a->name << " " << LayerRoleName(t.role);
    for (const TensorSpec& t : a->expert_tensors) {
      EXPECT_TRUE(roles.insert(t.role).second) << a->name << " " << LayerRoleName(t.role);
      EXPECT_EQ(IsExpertRole(t.role), t.hf.find("{e}") != std::string_view::npos) << a->name << " " << t.hf;
    }
    for (LayerRole needed : {kInputNorm, kQProj, kKProj, kVProj, kOProj, kPostNorm}) {
      EXPECT_TRUE(a->has(needed)) << a->name << " lacks " << LayerRoleName(needed);
    }
    // A dense MLP's tensors where a program runs one; a mixture's router and experts where the layer runs kMoe.
    const bool dense =
        std::ranges::count(a->layer, LayerOp::kGateUpProj) + std::ranges::count(a->dense_layer, LayerOp::kGateUpProj) >
        0;
    const bool sparse = std::ranges::count(a->layer, LayerOp::kMoe) > 0;
    for (LayerRole r : {kGateProj, kUpProj, kDownProj}) EXPECT_EQ(a->has(r), dense) << a->name;
    for (LayerRole r : {kRouter, kExpertGate, kExpertUp, kExpertDown}) EXPECT_EQ(a->has(r), sparse) << a->name;
    const auto in_program = [&](LayerOp op) { return std::ranges::count(a->layer, op) > 0; };
    EXPECT_EQ(in_program(LayerOp::kQkNorm), a->has(kQNorm) && a->has(kKNorm)) << a->name;
    EXPECT_EQ(in_program(LayerOp::kAttnOutNorm), a->has(kAttnOutNorm)) << a->name;
    EXPECT_EQ(in_program(LayerOp::kMlpOutNorm), a->has(kMlpOutNorm)) << a->name;
    EXPECT_EQ(a->has(kQBias), a->has(kKBias) && a->has(kVBias)) << a->name;
    for (size_t i = 1; i < a->tensors.size(); ++i) {
      EXPECT_EQ(a->tensors[i].hf == a->tensors[i - 1].hf, a->tensors[i].gguf == a->tensors[i - 1].gguf)
          << a->name << ": " << a->tensors[i].hf << " is fused in one format only";
    }
  }
  EXPECT_STREQ(LayerRoleName(kGateProj), "gate_proj");
}

// Mixtral's and Qwen3-MoE's experts: their counts, widths and normalisation from either family's keys, which layers
// are sparse (Qwen3-MoE's mlp_only_layers and decoder_sparse_step), and the program of each layer.
TEST(ModelConfig, MixturesOfExpertsReadTheirExpertsAndSparseLayers) {
  auto mixtral = ParseModelConfig(testing::ReadJson(testing::ModelDir("mixtral-tiny") + "/config.json").dump());
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->arch, &MixtralArchitecture());
  EXPECT_EQ(mixtral->num_experts, 4);
  EXPECT_EQ(mixtral->experts_per_token, 2);
  EXPECT_EQ(mixtral->moe_intermediate_size, mixtral->intermediate_size) << "Mixtral's experts are the MLP's width";
  EXPECT_TRUE(mixtral->normalize_top_k);
  EXPECT_EQ(mixtral->sparse_layers, std::vector<bool>(mixtral->num_layers, true));
  EXPECT_EQ(mixtral->program(0), MixtralArchitecture().layer);

  nlohmann::json j = testing::ReadJson(testing::ModelDir("qwen3-moe-tiny") + "/config.json");
  auto qwen = ParseModelConfig(j.dump());
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->num_experts, 8);
  EXPECT_EQ(qwen->moe_intermediate_size, 32);
  EXPECT_FALSE(qwen->normalize_top_k);
  EXPECT_EQ(qwen->sparse_layers, (std::vector<bool>{true, false, true})) << "layer 1 is in mlp_only_layers";
  EXPECT_EQ(qwen->program(1), Qwen3MoeArchitecture().dense_layer);
  EXPECT_EQ(qwen->program(2), Qwen3MoeArchitecture().layer);
  j["mlp_only_layers"] = nlohmann::json::array();
  j["decoder_sparse_step"] = 2;
  j.erase("norm_topk_prob");
  qwen = ParseModelConfig(j.dump());
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->sparse_layers, (std::vector<bool>{false, true, false})) << "every 2nd layer";
  EXPECT_FALSE(qwen->normalize_top_k) << "transformers' Qwen3MoeConfig default";
  // A dense model has no experts and one program.
  auto dense = ParseModelConfig(testing::ReadJson(testing::ModelDir("qwen3-tiny") + "/config.json").dump());
  ASSERT_TRUE(dense.ok());
  EXPECT_FALSE(dense->has_experts());
  EXPECT_EQ(dense->program(0), Qwen3Architecture().layer);
}

TEST(ModelConfig, RefusesBadExpertCountsAndLayers) {
  const nlohmann::json qwen = testing::ReadJson(testing::ModelDir("qwen3-moe-tiny") + "/config.json");
  const nlohmann::json mixtral = testing::ReadJson(testing::ModelDir("mixtral-tiny") + "/config.json");
  nlohmann::json bad = qwen;
  bad["num_experts_per_tok"] = 9;
  ExpectError(bad, "num_experts_per_tok");
  bad = qwen;
  bad.erase("num_experts");
  ExpectError(bad, "num_experts");
  bad = qwen;
  bad["mlp_only_layers"] = {3};
  ExpectError(bad, "mlp_only_layers holds 3");
  bad = qwen;
  bad["moe_intermediate_size"] = 0;
  ExpectError(bad, "moe_intermediate_size");
  bad = mixtral;
  bad["decoder_sparse_step"] = 2;
  ExpectError(bad, "MixtralForCausalLM has no dense layers");
  bad = mixtral;
  bad["num_local_experts"] = 0;
  ExpectError(bad, "num_local_experts");
}

// The window the sliding-window layers share: none (no list, or every layer global), one, or differing sizes.
TEST(ModelConfig, TheSlidingWindowIsTheOneTheWindowLayersShare) {
  ModelConfig c;
  EXPECT_EQ(c.sliding_window(), 0);
  c.layer_window = {0, 0, 0};
  EXPECT_EQ(c.sliding_window(), 0);
  EXPECT_FALSE(c.has_windows());
  c.layer_window = {512, 512, 0, 512};
  EXPECT_EQ(c.sliding_window(), 512);
  EXPECT_TRUE(c.has_windows());
  c.layer_window = {512, 1024, 0};
  EXPECT_EQ(c.sliding_window(), -1) << "windows of different sizes";
}

TEST(ModelConfig, RefusesUnsupportedAndInconsistentConfigs) {
  nlohmann::json j = testing::ReadJson(testing::ModelDir("llama2-tiny") + "/config.json");
  nlohmann::json bad = j;
  bad["architectures"] = {"GPT2LMHeadModel"};
  ExpectError(bad, "GPT2LMHeadModel");
  bad = j;
  bad["num_key_value_heads"] = 3;
  ExpectError(bad, "num_key_value_heads = 3");
  bad = j;
  bad.erase("hidden_size");
  ExpectError(bad, "hidden_size");
  bad = j;
  bad["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectError(bad, "yarn");
  bad = j;
  bad["vocab_size"] = -5;
  ExpectError(bad, "vocab_size");
}

// The new families' options: wrong ones are refused naming the field.
TEST(ModelConfig, RefusesBadWindowsRotaryAndActivations) {
  const nlohmann::json gemma = testing::ReadJson(testing::ModelDir("gemma3-tiny") + "/config.json");
  auto g = ParseModelConfig(gemma.dump());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->layer_window, (std::vector<int32_t>{16, 16, 16, 16, 16, 0}));
  EXPECT_EQ(g->rope_local_theta, 1e4);
  EXPECT_EQ(g->rope.theta, 1e6);
  EXPECT_NEAR(g->embedding_scale(), 8.0, 1e-12);  // √64
  nlohmann::json bad = gemma;
  bad["layer_types"] = {"sliding_attention"};
  ExpectError(bad, "layer_types has 1 entries");
  bad = gemma;
  bad["layer_types"][2] = "local";
  ExpectError(bad, "layer_types[2]");
  bad = gemma;
  bad["hidden_activation"] = "silu";
  ExpectError(bad, "hidden_activation");
  bad = gemma;
  bad["final_logit_softcapping"] = -1;
  ExpectError(bad, "final_logit_softcapping");
  nlohmann::json llama = testing::ReadJson(testing::ModelDir("llama2-tiny") + "/config.json");
  llama["sliding_window"] = 16;
  ExpectError(llama, "sliding-window attention is not supported for LlamaForCausalLM");

  const nlohmann::json phi = testing::ReadJson(testing::ModelDir("phi3-tiny") + "/config.json");
  auto p = ParseModelConfig(phi.dump());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rotary_dim, 12);
  EXPECT_EQ(p->rope.type, "longrope");
  EXPECT_NEAR(p->rope.attention_factor, std::sqrt(1 + std::log(8.0) / std::log(256.0)), 1e-12);
  bad = phi;
  bad["partial_rotary_factor"] = 0.1;
  ExpectError(bad, "partial_rotary_factor");
  bad = phi;
  bad["rope_scaling"].erase("long_factor");
  ExpectError(bad, "long_factor");
  bad = phi;
  bad["rope_scaling"]["short_factor"] = {1.0, 1.0};
  ExpectError(bad, "longrope factors hold 2 values");
  bad = phi;
  bad.erase("original_max_position_embeddings");
  ExpectError(bad, "original_max_position_embeddings");
}

TEST(LoadModel, LoadsEveryTestModelAndItsEosIds) {
  for (const char* name : testing::kTestModels) {
    auto m = LoadModel(testing::ModelDir(name));
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_FALSE((*m)->eos_token_ids.empty()) << name;
    EXPECT_EQ((*m)->tensors.layers.size(), 2u);
  }
  auto llama3 = LoadModel(testing::ModelDir("llama3-tiny"));
  EXPECT_EQ((*llama3)->eos_token_ids.size(), 2u) << "end_of_text from config + eot_id from generation_config";
  EXPECT_EQ((*llama3)->tensors.stored_dtype, "bfloat16");
}

TEST(LoadModel, MissingDirectoryAndTruncatedWeightsAreClearErrors) {
  auto missing = LoadModel("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model"), std::string::npos);

  // A copy of llama2-tiny whose weights file lost its tail.
  const std::string dir = ::testing::TempDir() + "/truncated-model";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(testing::ModelDir("llama2-tiny"), dir);
  const auto file = dir + "/model.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1000);
  auto truncated = LoadModel(dir);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos) << truncated.status().message();
}

}  // namespace
}  // namespace inferd
