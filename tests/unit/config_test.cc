#include "engine/config.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

TEST(Config, DefaultsAndOverrides) {
  auto c = ParseConfig("model: {path: /m}\nscheduler: {max_num_seqs: 8, max_num_batched_tokens: 64}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.path, "/m");
  EXPECT_EQ(c->scheduler.max_num_seqs, 8);
  EXPECT_EQ(c->engine.block_size, 16);
  EXPECT_EQ(c->server.listen, "0.0.0.0:50051");
}

TEST(Config, RoundTripsThroughTheEffectiveYaml) {
  auto c = ParseConfig("model: {path: /m}\nengine: {block_size: 8, backend: cpu}\nserver: {listen: '127.0.0.1:9'}\n");
  ASSERT_TRUE(c.ok());
  auto again = ParseConfig(ConfigToYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->engine.block_size, 8);
  EXPECT_EQ(again->server.listen, "127.0.0.1:9");
}

struct BadCase {
  const char* yaml;
  const char* must_mention;
};

class ConfigErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(ConfigErrors, NameTheKey) {
  auto c = ParseConfig(GetParam().yaml);
  ASSERT_FALSE(c.ok()) << GetParam().yaml;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(GetParam().must_mention), std::string::npos) << c.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    All, ConfigErrors,
    ::testing::Values(BadCase{"model: {path: /m}\nengine: {blok_size: 4}\n", "engine.blok_size"},
                      BadCase{"modle: {path: /m}\n", "modle"}, BadCase{"engine: {block_size: 4}\n", "model.path"},
                      BadCase{"model: {path: /m}\nengine: {block_size: 0}\n", "engine.block_size = 0"},
                      BadCase{"model: {path: /m}\nengine: {block_size: many}\n", "engine.block_size"},
                      BadCase{"model: {path: /m}\nengine: {backend: tpu}\n", "engine.backend = 'tpu'"},
                      BadCase{"model: {path: /m}\nengine: {gpu_memory_utilization: 1.5}\n", "gpu_memory_utilization"},
                      BadCase{"model: {path: /m}\nscheduler: {max_num_seqs: 64, max_num_batched_tokens: 8}\n",
                              "max_num_batched_tokens = 8"},
                      BadCase{"model: {path: /m}\nscheduler: {max_queue: -1}\n", "scheduler.max_queue = -1"},
                      BadCase{"model: {path: /m}\nscheduler: {max_queue: 0}\n", "scheduler.max_queue = 0"},
                      BadCase{"model: {path: /m}\nengine: {dtype: float8}\n", "engine.dtype = 'float8'"},
                      BadCase{"model: {path: /m}\nserver: {max_request_bytes: 0}\n", "server.max_request_bytes = 0"},
                      BadCase{"model: {path: /m}\nserver: {listen: nowhere}\n", "server.listen = 'nowhere'"},
                      BadCase{"model: [1, 2\n", "not valid YAML"}),
    [](const auto& info) { return "case" + std::to_string(info.index); });

}  // namespace
}  // namespace inferd
