// The typed configuration of inferd: one struct per YAML section, parsed and validated in one place.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace inferd {

struct ModelSection {
  std::string path;                  // Hugging Face directory (config.json + *.safetensors + tokenizer.json)
  std::string name;                  // name reported by GetModelInfo; default: the path's last component
  int32_t max_model_len = 0;         // 0 = the model's max_position_embeddings
  std::string load_format = "auto";  // auto | dummy (random weights made where they are used: benchmarks only)
};

struct EngineSection {
  std::string backend = "auto";         // auto | cpu | cuda
  std::string dtype = "auto";           // cuda weights and activations: auto (bfloat16) | bfloat16 | float16
  std::string quantization = "none";    // cuda linear layers: none | fp8 (e4m3 weights and activations)
  std::string kv_cache_dtype = "auto";  // auto | float32 | float16 | bfloat16 | fp8_e4m3 (cuda: auto = dtype)
  bool cuda_graphs = true;              // cuda: decode steps replay CUDA graphs captured at start-up
  std::string plan_ahead = "auto";      // auto, on, off: plan and launch step N + 1 while step N runs
  int32_t block_size = 16;              // tokens per KV block: 1..256
  int32_t num_blocks = 0;               // 0 = from the memory plan
  double gpu_memory_utilization = 0.9;  // share of device memory inferd may use: (0, 1]
  double cpu_kv_cache_gib = 1.0;        // KV pool size of the cpu backend: (0, 1024]
  double swap_space_gib = 0;            // host memory for preempted requests' KV (swap instead of recompute)
  double host_kv_cache_gib = 0;         // host tier of the prefix cache (evicted prefix blocks kept on the host)
  int32_t num_threads = 0;              // cpu backend threads; 0 = all cores
  std::string cpu_weights = "fp32";     // fp32 (the reference arithmetic), as_stored (GGUF blocks, bf16: fast)
  int32_t tensor_parallel_size = 1;     // devices one model is split across (tensor parallelism): 1, 2, 4, 8
  int32_t profile_steps = 0;            // log a time breakdown of each of the first N steps
  int64_t structured_output_max_bytes = 64 << 10;        // of a schema, regex, grammar or choice list: 1..2^24
  int32_t structured_output_cache_mib = 256;             // compiled constraints kept for reuse: 1..65536
  bool structured_output_in_reasoning = false;           // a constraint holds for a thinking model's reasoning too
  int64_t structured_output_compile_timeout_ms = 10000;  // a constraint that compiles longer is refused: 1..3.6e6
};

struct SchedulerSection {
  int32_t max_num_seqs = 64;              // requests in one step: 1..4096
  int32_t max_num_batched_tokens = 2048;  // tokens in one step: 1..1048576, >= max_num_seqs
  bool prefix_caching = true;             // new requests reuse the KV blocks of a known prompt prefix
  int32_t max_queue = 256;                // accepted, not yet started requests before RESOURCE_EXHAUSTED: 1..1000000
  int64_t max_queued_tokens = 1 << 20;    // their prompt tokens before RESOURCE_EXHAUSTED: 1..2^31
  int32_t long_prefill_chunk = 0;         // prompt tokens of one request per step while others wait; 0 = budget / 4
  double priority_aging_s = 30;           // waiting this long raises a request's priority by one; 0 = no aging
};

struct ServerSection {
  std::string listen = "0.0.0.0:50051";
  double drain_timeout_s = 30;          // graceful shutdown: how long running requests may finish
  int64_t max_request_bytes = 4 << 20;  // a larger GenerateRequest or Tokenize text is INVALID_ARGUMENT: 1..64 MiB
  std::string metrics_listen = "0.0.0.0:9090";  // Prometheus /metrics; "" = off
  double liveness_timeout_s = 30;       // health NOT_SERVING when no step ran this long with work pending; 0 = off
  std::string http_listen;              // the OpenAI-compatible HTTP API; "" = off
  double http_request_timeout_s = 30;   // a request's head and body arrive within this; idle connections close after it
  std::string tls_cert_file;            // PEM certificate chain: TLS on both front ends; "" = plaintext
  std::string tls_key_file;             // its PEM private key
  std::string tls_client_ca_file;       // PEM CA bundle: clients must present a certificate it signed (mutual TLS)
  std::string api_keys_file;            // one key per line, reloaded on SIGHUP; "" = no keys asked
  bool api_keys_exempt_health = true;   // health (HTTP /health; gRPC health is always open) without a key
  bool api_keys_exempt_metrics = true;  // /metrics on http_listen without a key
  std::string http_unknown_fields = "ignore";  // request body fields inferd does not know: "ignore" or "refuse"
};

// KV-cache events for routers (vLLM's schema: ZeroMQ PUB, msgpack batches of BlockStored / BlockRemoved /
// AllBlocksCleared from the prefix cache's hash chain, both tiers).
struct KvEventsSection {
  bool enabled = false;
  std::string endpoint = "tcp://*:5557";  // the PUB socket's bind address
  std::string replay_endpoint;   // a ROUTER socket that resends buffered batches from a sequence number; "" = off
  std::string topic;             // the first frame of every message
  int32_t buffer_steps = 10000;  // batches kept for replay: 1..10^6
};

// Speculative decoding (engine/spec/): a sequence's next tokens drafted from text it has seen, checked in one step.
struct SpeculativeSection {
  std::string method = "off";             // off | ngram (prompt lookup) | suffix (suffix decoding)
  int32_t max_tokens = 4;                 // drafted tokens a sequence checks in one step at most: 1..16
  int32_t ngram_min = 2;                  // ngram: the shortest run of last tokens matched
  int32_t ngram_max = 5;                  // ngram: the longest
  int32_t suffix_max_depth = 24;          // suffix: the longest run indexed (matches up to half of it)
  int64_t suffix_cache_tokens = 1 << 20;  // suffix: tokens of finished outputs every sequence drafts from
  double min_acceptance = 0.2;            // a sequence drafts the k-th token while acceptance^k stays above this
  int32_t max_batch = 32;                 // sequences in a step above which no one drafts
  bool adaptive = true;                   // draft at a batch size only while its steps measure faster that way
};

struct Config {
  ModelSection model;
  EngineSection engine;
  SchedulerSection scheduler;
  ServerSection server;
  KvEventsSection kv_events;
  SpeculativeSection speculative;
};

// Parses YAML text; unknown keys and out-of-range values are errors that name the key.
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text);
absl::StatusOr<Config> LoadConfigFile(const std::string& path);
// The effective config as YAML, for the start-up log.
std::string ConfigToYaml(const Config& config);

// Errors caused by a config value, wherever found (parsing, or start-up checking it against the model and the
// machine), say so by starting with "config: "; the server exits 2 for them.
bool IsConfigError(const absl::Status& status);

}  // namespace inferd
