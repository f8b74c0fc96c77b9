// model.load_format dummy: a directory with config.json and tokenizer.json alone loads, every tensor the config
// implies is random (seeded by its name, nothing mapped), values have the scale asked for and are the same on every
// read of any rows, and the cpu backend serves it; a GGUF file or a directory without config.json is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

namespace fs = std::filesystem;

// A model's config.json and tokenizer files and no weights, in a directory of the test's own (ctest may run this
// file's tests at once).
std::string ConfigOnlyDir(const std::string& model) {
  const std::string dir = ::testing::TempDir() + "/config-only-" + model + "-" +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
    if (fs::exists(testing::ModelDir(model) + "/" + f)) fs::copy(testing::ModelDir(model) + "/" + f, dir + "/" + f);
  }
  return dir;
}

TEST(RandomWeights, ConfigAndTokenizerAloneDescribeEveryTensorAsRandom) {
  const std::string dir = ConfigOnlyDir("llama3-tiny");
  EXPECT_FALSE(LoadModel(dir).ok()) << "without dummy, the weights are needed";
  auto model = LoadModel(dir, {.random_weights = true});
  ASSERT_TRUE(model.ok()) << model.status();
  auto real = LoadModel(testing::ModelDir("llama3-tiny"));
  ASSERT_TRUE(real.ok());
  const auto random = AllTensors((*model)->tensors), stored = AllTensors((*real)->tensors);
  ASSERT_EQ(random.size(), stored.size());
  std::map<uint64_t, std::string> seeds;
  for (size_t i = 0; i < random.size(); ++i) {
    EXPECT_EQ(random[i]->present(), stored[i]->present()) << stored[i]->name;
    if (!random[i]->present()) continue;
    EXPECT_EQ(random[i]->name, stored[i]->name);
    EXPECT_EQ(random[i]->rows, stored[i]->rows) << stored[i]->name;
    EXPECT_EQ(random[i]->cols, stored[i]->cols) << stored[i]->name;
    EXPECT_TRUE(random[i]->random()) << random[i]->name;
    EXPECT_TRUE(random[i]->bytes.empty());
    EXPECT_TRUE(seeds.emplace(random[i]->random_seed, random[i]->name).second) << "two tensors share a seed";
  }
  EXPECT_TRUE((*model)->tensors.files.empty()) << "nothing is mapped";
}

TEST(RandomWeights, ValuesHaveTheirScaleAndAreTheSameForAnyRowsRead) {
  auto model = LoadModel(ConfigOnlyDir("llama3-tiny"), {.random_weights = true});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelTensors& t = (*model)->tensors;
  for (const TensorDesc* d : {&t.layers[0].q_proj, &t.layers[1].down_proj, &t.layers[0].input_norm, &t.embed}) {
    std::vector<float> all(d->numel());
    ASSERT_TRUE(DecodeRows(*d, 0, d->rows, all.data()).ok());
    double sum = 0, sq = 0;
    for (float v : all) {
      sum += v;
      sq += double{v} * v;
    }
    const double mean = sum / all.size(), std = std::sqrt(sq / all.size() - mean * mean);
    EXPECT_NEAR(mean, d->random_mean, 4 * d->random_std / std::sqrt(all.size())) << d->name;
    EXPECT_NEAR(std, d->random_std, 0.1 * d->random_std) << d->name;
    // Rows read on their own (as a shard's upload reads them) are the same values.
    const int64_t first = d->rows / 3, count = d->rows - first;
    std::vector<float> part(count * d->cols);
    ASSERT_TRUE(DecodeRows(*d, first, count, part.data()).ok());
    for (int64_t i = 0; i < count * d->cols; ++i) ASSERT_EQ(part[i], all[first * d->cols + i]) << d->name << " " << i;
  }
  EXPECT_EQ(t.layers[0].input_norm.random_mean, 1.0f) << "norms are near 1";
}

TEST(RandomWeights, TheCpuBackendServesThemAndOtherFormsAreRefused) {
  Config config;
  config.model.path = ConfigOnlyDir("llama3-tiny");
  config.model.load_format = "dummy";
  config.engine.backend = "cpu";
  config.engine.num_blocks = 32;
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto sink = std::make_shared<testing::CollectingSink>();
  Request r;
  r.id = "random";
  r.prompt = {1, 2, 3, 4};
  r.stopping.max_tokens = 5;
  r.stopping.ignore_eos = true;
  r.sink = sink;
  ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(30)));
  EXPECT_TRUE(sink->error.ok()) << sink->error;
  EXPECT_EQ(sink->tokens.size(), 5u);
  (*engine)->Stop();

  auto gguf = LoadModel(testing::ModelDir("llama2-tiny") + ".gguf", {.random_weights = true});
  if (fs::exists(testing::ModelDir("llama2-tiny") + ".gguf")) {
    ASSERT_FALSE(gguf.ok());
    EXPECT_NE(gguf.status().message().find("needs a Hugging Face directory"), std::string::npos) << gguf.status();
  }
  const std::string empty = ::testing::TempDir() + "/no-config";
  fs::remove_all(empty);
  fs::create_directories(empty);
  auto none = LoadModel(empty, {.random_weights = true});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("config.json"), std::string::npos) << none.status();
}

}  // namespace
}  // namespace inferd
