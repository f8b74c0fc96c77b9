#include "engine/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "engine/config_fields.h"

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
    ::testing::Values(
        BadCase{"model: {path: /m}\nengine: {blok_size: 4}\n", "engine.blok_size"},
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
        BadCase{"model: {path: /m}\nserver: {listen: '127.0.0.1:99999'}\n", "PORT in 0..65535"},
        BadCase{"model: {path: /m}\nserver: {listen: ':80'}\n", "server.listen = ':80'"},
        BadCase{"model: {path: /m}\nengine: {block_size: 8, block_size: 16}\n", "engine.block_size is given twice"},
        BadCase{"model: {path: /m}\nengine: {}\nengine: {block_size: 8}\n", "section 'engine' is given twice"},
        BadCase{"model: {path: /m}\nengine: {num_blocks: 1.5}\n", "engine.num_blocks"},
        BadCase{"- a\n- b\n", "must be a mapping"}, BadCase{"model: [1, 2\n", "not valid YAML"}),
    [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(Config, TheReadmeReferenceIsTheFieldTable) {
  std::ifstream in(std::string(INFERD_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str();
  const std::string table = ConfigReferenceMarkdown();
  EXPECT_NE(readme.find(table), std::string::npos)
      << "README.md's configuration table differs from `inferd --config-reference`:\n"
      << table;
  // Every key of the table parses with its documented default, and the dump lists every key.
  auto c = ParseConfig("model: {path: /m}\n");
  ASSERT_TRUE(c.ok());
  const std::string dump = ConfigToYaml(*c);
  for (const ConfigField& f : ConfigFields()) EXPECT_NE(dump.find(f.key + ":"), std::string::npos) << f.name();
}

}  // namespace
}  // namespace inferd
