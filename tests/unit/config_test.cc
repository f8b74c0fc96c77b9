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
        BadCase{"model: {path: /m}\nengine: {tensor_parallel_size: 3}\n",
                "engine.tensor_parallel_size = 3 is out of range; allowed: 1, 2, 4, 8"},
        BadCase{"model: {path: /m}\nengine: {tensor_parallel_size: 16}\n", "engine.tensor_parallel_size = 16"},
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
        BadCase{"model: {path: /m}\nspeculative: {method: eagle}\n", "speculative.method = 'eagle'"},
        BadCase{"model: {path: /m}\nspeculative: {max_tokens: 17}\n", "speculative.max_tokens = 17"},
        BadCase{"model: {path: /m}\nspeculative: {ngram_min: 4, ngram_max: 3}\n",
                "speculative.ngram_min = 4 is out of range; allowed: 1..speculative.ngram_max (3)"},
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
}

// Every key set to a value other than its default, written here by hand: the effective-config dump carries each
// value through a second parse unchanged, and differs from the defaults' dump on every key.
TEST(Config, EveryKeySurvivesTheDumpWithAValueOtherThanItsDefault) {
  const std::string yaml = R"(model: {path: /models/x, name: served-x, max_model_len: 4096, load_format: dummy}
engine: {backend: cpu, dtype: float16, quantization: fp8, kv_cache_dtype: fp8_e4m3, cuda_graphs: false, plan_ahead: "off", block_size: 32, num_blocks: 1000,
         gpu_memory_utilization: 0.75, cpu_kv_cache_gib: 2.5, swap_space_gib: 1.5, host_kv_cache_gib: 2.25, num_threads: 3, cpu_weights: as_stored, tensor_parallel_size: 4, profile_steps: 7,
         structured_output_max_bytes: 1000, structured_output_cache_mib: 32,
         structured_output_compile_timeout_ms: 2500, structured_output_in_reasoning: true}
scheduler: {max_num_seqs: 12, max_num_batched_tokens: 640, prefix_caching: false, max_queue: 99,
            max_queued_tokens: 12345, long_prefill_chunk: 128, priority_aging_s: 2.5}
server: {listen: '127.0.0.1:7000', drain_timeout_s: 4.5, max_request_bytes: 1000, metrics_listen: '',
         liveness_timeout_s: 0, http_listen: '127.0.0.1:7001', http_request_timeout_s: 7.5, tls_cert_file: /c.pem,
         tls_key_file: /k.pem, tls_client_ca_file: /ca.pem, api_keys_file: /keys, api_keys_exempt_health: false,
         api_keys_exempt_metrics: false, http_unknown_fields: refuse}
kv_events: {enabled: true, endpoint: 'tcp://127.0.0.1:6000', replay_endpoint: 'tcp://127.0.0.1:6001', topic: kv,
            buffer_steps: 50}
speculative: {method: suffix, max_tokens: 7, ngram_min: 3, ngram_max: 6, suffix_max_depth: 32,
              suffix_cache_tokens: 5000, min_acceptance: 0.35, max_batch: 8, adaptive: false})";
  auto c = ParseConfig(yaml);
  ASSERT_TRUE(c.ok()) << c.status();
  auto again = ParseConfig(ConfigToYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << ConfigToYaml(*c);
  for (const Config* x : {&*c, &*again}) {
    EXPECT_EQ(x->model.path, "/models/x");
    EXPECT_EQ(x->model.name, "served-x");
    EXPECT_EQ(x->model.max_model_len, 4096);
    EXPECT_EQ(x->model.load_format, "dummy");
    EXPECT_EQ(x->engine.backend, "cpu");
    EXPECT_EQ(x->engine.quantization, "fp8");
    EXPECT_EQ(x->engine.kv_cache_dtype, "fp8_e4m3");
    EXPECT_EQ(x->engine.dtype, "float16");
    EXPECT_FALSE(x->engine.cuda_graphs);
    EXPECT_EQ(x->engine.plan_ahead, "off");
    EXPECT_EQ(x->engine.block_size, 32);
    EXPECT_EQ(x->engine.num_blocks, 1000);
    EXPECT_DOUBLE_EQ(x->engine.gpu_memory_utilization, 0.75);
    EXPECT_DOUBLE_EQ(x->engine.cpu_kv_cache_gib, 2.5);
    EXPECT_DOUBLE_EQ(x->engine.swap_space_gib, 1.5);
    EXPECT_DOUBLE_EQ(x->engine.host_kv_cache_gib, 2.25);
    EXPECT_EQ(x->engine.num_threads, 3);
    EXPECT_EQ(x->engine.cpu_weights, "as_stored");
    EXPECT_EQ(x->engine.tensor_parallel_size, 4);
    EXPECT_EQ(x->engine.profile_steps, 7);
    EXPECT_EQ(x->engine.structured_output_max_bytes, 1000);
    EXPECT_EQ(x->engine.structured_output_cache_mib, 32);
    EXPECT_EQ(x->engine.structured_output_compile_timeout_ms, 2500);
    EXPECT_TRUE(x->engine.structured_output_in_reasoning);
    EXPECT_EQ(x->scheduler.max_num_seqs, 12);
    EXPECT_EQ(x->scheduler.max_num_batched_tokens, 640);
    EXPECT_FALSE(x->scheduler.prefix_caching);
    EXPECT_EQ(x->scheduler.max_queue, 99);
    EXPECT_EQ(x->scheduler.max_queued_tokens, 12345);
    EXPECT_EQ(x->scheduler.long_prefill_chunk, 128);
    EXPECT_DOUBLE_EQ(x->scheduler.priority_aging_s, 2.5);
    EXPECT_EQ(x->server.listen, "127.0.0.1:7000");
    EXPECT_DOUBLE_EQ(x->server.drain_timeout_s, 4.5);
    EXPECT_EQ(x->server.max_request_bytes, 1000);
    EXPECT_EQ(x->server.metrics_listen, "");
    EXPECT_DOUBLE_EQ(x->server.liveness_timeout_s, 0);
    EXPECT_EQ(x->server.http_listen, "127.0.0.1:7001");
    EXPECT_DOUBLE_EQ(x->server.http_request_timeout_s, 7.5);
    EXPECT_EQ(x->server.tls_cert_file, "/c.pem");
    EXPECT_EQ(x->server.tls_key_file, "/k.pem");
    EXPECT_EQ(x->server.tls_client_ca_file, "/ca.pem");
    EXPECT_EQ(x->server.api_keys_file, "/keys");
    EXPECT_FALSE(x->server.api_keys_exempt_health);
    EXPECT_FALSE(x->server.api_keys_exempt_metrics);
    EXPECT_TRUE(x->kv_events.enabled);
    EXPECT_EQ(x->kv_events.endpoint, "tcp://127.0.0.1:6000");
    EXPECT_EQ(x->kv_events.replay_endpoint, "tcp://127.0.0.1:6001");
    EXPECT_EQ(x->kv_events.topic, "kv");
    EXPECT_EQ(x->kv_events.buffer_steps, 50);
    EXPECT_EQ(x->speculative.method, "suffix");
    EXPECT_EQ(x->speculative.max_tokens, 7);
    EXPECT_EQ(x->speculative.ngram_min, 3);
    EXPECT_EQ(x->speculative.ngram_max, 6);
    EXPECT_EQ(x->speculative.suffix_max_depth, 32);
    EXPECT_EQ(x->speculative.suffix_cache_tokens, 5000);
    EXPECT_DOUBLE_EQ(x->speculative.min_acceptance, 0.35);
    EXPECT_EQ(x->speculative.max_batch, 8);
    EXPECT_FALSE(x->speculative.adaptive);
  }
  // Each key's line differs from the defaults' dump: none was dropped or written as its default.
  auto defaults = ParseConfig("model: {path: /m}\n");
  ASSERT_TRUE(defaults.ok());
  const std::string dump = ConfigToYaml(*c), default_dump = ConfigToYaml(*defaults);
  for (const ConfigField& f : ConfigFields()) {
    auto line = [&](const std::string& d) {
      const size_t section = d.find(f.section + ":");
      const size_t at = d.find("  " + f.key + ":", section);
      return at == std::string::npos ? std::string() : d.substr(at, d.find('\n', at) - at);
    };
    EXPECT_FALSE(line(dump).empty()) << f.name() << " is missing from the dump";
    EXPECT_NE(line(dump), line(default_dump)) << f.name();
  }
}

}  // namespace
}  // namespace inferd
