#include "engine/config_fields.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace inferd {
namespace {

absl::Status WrongType(const std::string& name, const YAML::Node& v, const char* type) {
  return absl::InvalidArgumentError(
      absl::StrCat("config: ", name, " has value '", YAML::Dump(v), "' of the wrong type; allowed: ", type));
}

template <typename T>
absl::Status OutOfRange(const std::string& name, T value, const std::string& allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat("config: ", name, " = ", value, " is out of range; allowed: ", allowed));
}

template <typename T>
using Member = std::function<T&(Config&)>;

// A key's default as the README shows it: the value of a default-constructed Config, so that the struct's member
// initializer is the one place a default is declared.
template <typename T>
std::string DefaultText(const Member<T>& member) {
  static const Config defaults;
  const T& value = member(const_cast<Config&>(defaults));
  if constexpr (std::is_same_v<T, double>) {
    return absl::StrCat(value);  // shortest: 0.9, not 0.90000000000000002
  } else {
    YAML::Emitter out;
    out << value;
    return out.c_str();
  }
}

// An integer in [lo, hi].
template <typename T>
ConfigField Int(std::string section, std::string key, Member<T> member, T lo, T hi, std::string allowed,
                std::string doc) {
  ConfigField f{section, key, DefaultText(member), allowed, doc, nullptr, nullptr};
  const std::string name = f.name();
  f.read = [=](const YAML::Node& v, Config* c) -> absl::Status {
    long long x = 0;
    try {
      x = v.as<long long>();
    } catch (const YAML::Exception&) {
      return WrongType(name, v, "an integer");
    }
    if (x < lo || x > hi) return OutOfRange(name, x, allowed);
    member(*c) = static_cast<T>(x);
    return absl::OkStatus();
  };
  f.write = [=](const Config& c, YAML::Emitter* out) { *out << member(const_cast<Config&>(c)); };
  return f;
}

// A real number in (lo, hi] (lo_open) or [lo, hi].
ConfigField Real(std::string section, std::string key, Member<double> member, double lo, double hi, bool lo_open,
                 std::string allowed, std::string doc) {
  ConfigField f{section, key, DefaultText(member), allowed, doc, nullptr, nullptr};
  const std::string name = f.name();
  f.read = [=](const YAML::Node& v, Config* c) -> absl::Status {
    double x = 0;
    try {
      x = v.as<double>();
    } catch (const YAML::Exception&) {
      return WrongType(name, v, "a number");
    }
    if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi) return OutOfRange(name, x, allowed);
    member(*c) = x;
    return absl::OkStatus();
  };
  f.write = [=](const Config& c, YAML::Emitter* out) { *out << member(const_cast<Config&>(c)); };
  return f;
}

// A string; `choices` non-empty restricts it to those. `empty_means`: what the README shows for a default of "".
ConfigField Text(std::string section, std::string key, Member<std::string> member, std::vector<std::string> choices,
                 std::string allowed, std::string doc, std::string empty_means = "") {
  const std::string def = DefaultText(member);
  ConfigField f{section, key, def.empty() || def == "\"\"" ? empty_means : def, allowed, doc, nullptr, nullptr};
  const std::string name = f.name();
  f.read = [=](const YAML::Node& v, Config* c) -> absl::Status {
    if (!v.IsScalar()) return WrongType(name, v, "a string");
    const std::string s = v.as<std::string>();
    if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: ", name, " = '", s, "' is not allowed; allowed: ", absl::StrJoin(choices, ", ")));
    }
    member(*c) = s;
    return absl::OkStatus();
  };
  f.write = [=](const Config& c, YAML::Emitter* out) { *out << member(const_cast<Config&>(c)); };
  return f;
}

// true or false.
ConfigField Flag(std::string section, std::string key, Member<bool> member, std::string doc) {
  ConfigField f{section, key, DefaultText(member), "true, false", doc, nullptr, nullptr};
  const std::string name = f.name();
  f.read = [=](const YAML::Node& v, Config* c) -> absl::Status {
    try {
      member(*c) = v.as<bool>();
    } catch (const YAML::Exception&) {
      return WrongType(name, v, "true or false");
    }
    return absl::OkStatus();
  };
  f.write = [=](const Config& c, YAML::Emitter* out) { *out << member(const_cast<Config&>(c)); };
  return f;
}

// HOST:PORT with a port in 0..65535 (0: any free port).
absl::Status CheckListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  bool digits = !port.empty() && port.size() <= 5;
  for (char ch : port) digits = digits && ch >= '0' && ch <= '9';
  if (colon == std::string::npos || colon == 0 || !digits || std::stoi(port) > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("config: server.listen = '", listen,
                                                   "' is not allowed; allowed: HOST:PORT with PORT in 0..65535"));
  }
  return absl::OkStatus();
}

std::vector<ConfigField> MakeFields() {
  std::vector<ConfigField> f;
  // model
  f.push_back(Text(
      "model", "path", [](Config& c) -> std::string& { return c.model.path; }, {}, "file or directory",
      "a GGUF file, or a Hugging Face model directory; default config: "
      "`models/SmolLM2-135M-Instruct.Q4_1.gguf`",
      "(required)"));
  f.push_back(Text(
      "model", "name", [](Config& c) -> std::string& { return c.model.name; }, {}, "string",
      "name reported by `GetModelInfo`", "GGUF `general.name` or directory name"));
  f.push_back(Int<int32_t>(
      "model", "max_model_len", [](Config& c) -> int32_t& { return c.model.max_model_len; }, 0, 1 << 24, "0..2^24",
      "0 = the model's `max_position_embeddings`; larger than the model's is refused; always "
      "capped by the KV pool"));
  f.push_back(Text(
      "model", "load_format", [](Config& c) -> std::string& { return c.model.load_format; }, {"auto", "dummy"},
      "auto, dummy",
      "`dummy`: read only config.json and tokenizer.json of the Hugging Face directory and make every weight random "
      "(seeded, in the config's torch_dtype) where it is used: on each GPU for its shard, with nothing read or "
      "written on disk, so any shape starts in seconds. For benchmarks and tests only: the answers mean nothing, "
      "and the log says so"));
  // engine
  f.push_back(Text(
      "engine", "backend", [](Config& c) -> std::string& { return c.engine.backend; }, {"auto", "cpu", "cuda"},
      "auto, cpu, cuda",
      "`auto` = cuda when the build has CUDA, a GPU is visible and the model's head_dim is 64, 128 or "
      "256; else cpu, and the log says why"));
  f.push_back(Text(
      "engine", "dtype", [](Config& c) -> std::string& { return c.engine.dtype; }, {"auto", "bfloat16", "float16"},
      "auto, bfloat16, float16",
      "cuda weights and activations; auto = bfloat16 (GGUF and fp32 files are converted at load)"));
  f.push_back(Text(
      "engine", "quantization", [](Config& c) -> std::string& { return c.engine.quantization; }, {"none", "fp8"},
      "none, fp8",
      "cuda: `fp8` quantizes the layers' linear weights to e4m3 at load (one scale per output channel) and their "
      "inputs per token (steps of more than a few rows); embeddings, norms and the LM head stay in `dtype`. The "
      "cpu backend refuses it. An FP8 checkpoint (compressed-tensors float-quantized, or `quant_method: fp8`) "
      "runs as fp8 on cuda whatever this says, and dequantized on cpu"));
  f.push_back(Text(
      "engine", "kv_cache_dtype", [](Config& c) -> std::string& { return c.engine.kv_cache_dtype; },
      {"auto", "float32", "float16", "bfloat16", "fp8_e4m3"}, "auto, float32, float16, bfloat16, fp8_e4m3",
      "cuda: `auto` = `dtype` (a 16-bit name must equal it); `fp8_e4m3` stores K and V as e4m3 (saturating; RoPE's "
      "kernel writes them, FlashInfer's attention reads them), divided by each layer's `k_scale` and `v_scale` when "
      "the checkpoint has them (compressed-tensors `kv_cache_scheme`), else by 1: a block takes half the bytes, so "
      "the pool holds twice the tokens. Needs `dtype` bfloat16 and head_dim 128 or 256. cpu: float32, float16 or "
      "bfloat16 (rounded to nearest as written, fp32 arithmetic); `auto` = float16 with `cpu_weights: as_stored` "
      "(half the memory, as llama.cpp's cache), float32 with `fp32` (the reference); fp8_e4m3 is refused"));
  f.push_back(Flag(
      "engine", "cuda_graphs", [](Config& c) -> bool& { return c.engine.cuda_graphs; },
      "cuda: decode steps replay CUDA graphs captured at start-up for batches of 1, 2, 4, … "
      "max_num_seqs rows (padded)"));
  f.push_back(Text(
      "engine", "plan_ahead", [](Config& c) -> std::string& { return c.engine.plan_ahead; }, {"auto", "on", "off"},
      "auto, on, off",
      "schedule, pack and launch step N + 1 while the device runs step N, and emit step N's tokens while N + 1 "
      "runs (a sequence takes its next step before its last token reaches the host); auto = on for cuda, off "
      "for cpu, whose steps run on the engine thread itself"));
  f.push_back(Int<int32_t>(
      "engine", "block_size", [](Config& c) -> int32_t& { return c.engine.block_size; }, 1, 256, "1..256",
      "tokens per KV block"));
  f.push_back(Int<int32_t>(
      "engine", "num_blocks", [](Config& c) -> int32_t& { return c.engine.num_blocks; }, 0, 1 << 24, "0..2^24",
      "0 = from the memory plan; more than fit the device (cuda) or the host's memory (cpu) is "
      "refused, naming both numbers"));
  f.push_back(Real(
      "engine", "gpu_memory_utilization", [](Config& c) -> double& { return c.engine.gpu_memory_utilization; }, 0, 1,
      true, "(0, 1]",
      "cuda: share of the device memory free at start-up that inferd may take; the KV pool gets what "
      "weights, the measured peak activations and library workspaces leave"));
  f.push_back(Real(
      "engine", "cpu_kv_cache_gib", [](Config& c) -> double& { return c.engine.cpu_kv_cache_gib; }, 0, 1024, true,
      "(0, 1024]", "KV pool of the cpu backend; more than the host's memory is refused"));
  f.push_back(Real(
      "engine", "swap_space_gib", [](Config& c) -> double& { return c.engine.swap_space_gib; }, 0, 1024, false,
      "0..1024",
      "host memory where a preempted request's KV blocks wait (pinned on cuda), so it resumes without "
      "recomputing; 0 = preemption recomputes; more than the host's memory is refused"));
  f.push_back(Real(
      "engine", "host_kv_cache_gib", [](Config& c) -> double& { return c.engine.host_kv_cache_gib; }, 0, 1024, false,
      "0..1024",
      "host tier of the prefix cache (pinned on cuda): a prefix block evicted from the device is written back "
      "there, and a later request with that prefix copies it in instead of computing it; shares one host pool "
      "with swap_space_gib (swaps hold at most theirs, the tier caches in the rest); needs "
      "scheduler.prefix_caching; 0 = off; more than the host's memory is refused"));
  f.push_back(Int<int32_t>(
      "engine", "num_threads", [](Config& c) -> int32_t& { return c.engine.num_threads; }, 0, 1024, "0..1024",
      "cpu backend threads, 0 = all cores: the engine thread and N − 1 workers pinned to their own CPUs (where "
      "there are enough), spinning between a step's loops and sleeping after 500 µs idle"));
  f.push_back(Text(
      "engine", "cpu_weights", [](Config& c) -> std::string& { return c.engine.cpu_weights; }, {"fp32", "as_stored"},
      "fp32, as_stored",
      "the cpu backend's weights: fp32 (every weight decoded, OpenBLAS products: the reference arithmetic the "
      "parity tests trust), or as_stored (the checkpoint's own format in memory — GGUF's quantized blocks, bf16, "
      "fp16 — multiplied through llama.cpp's ggml CPU kernels, each input row quantized to 8 bits or rounded to 16 "
      "bits; Q4_1, Q5_0, Q8_0 and Q4_K interleaved at load, eight rows a record, for int8 kernels of our own "
      "(AVX-512 VNNI or AVX2) at every step; other formats' steps of 32 or more rows decode tiles of the weights "
      "into OpenBLAS's sgemm; the loops split over `engine.num_threads` threads of a pinned team of our own; needs "
      "AVX2 on x86 and tensor_parallel_size 1; the routers of mixtures stay fp32). The quick start's "
      "configs/default.yaml sets as_stored"));
  {
    ConfigField tp = Int<int32_t>(
        "engine", "tensor_parallel_size", [](Config& c) -> int32_t& { return c.engine.tensor_parallel_size; }, 1, 8,
        "1, 2, 4, 8",
        "devices one model is split across (tensor parallelism: attention heads and MLP columns sharded, a sum over "
        "the devices after each layer's attention and MLP); cuda: GPUs 0..N-1 of those `CUDA_VISIBLE_DEVICES` shows, "
        "one thread each, sums through NCCL (`libnccl.so.2` on the library path) or one-shot peer kernels; cpu: "
        "shards on threads, for testing the split");
    tp.read = [read = tp.read](const YAML::Node& v, Config* c) -> absl::Status {
      if (absl::Status s = read(v, c); !s.ok()) return s;
      const int32_t n = c->engine.tensor_parallel_size;
      return (n & (n - 1)) == 0 ? absl::OkStatus() : OutOfRange("engine.tensor_parallel_size", n, "1, 2, 4, 8");
    };
    f.push_back(std::move(tp));
  }
  f.push_back(Int<int32_t>(
      "engine", "profile_steps", [](Config& c) -> int32_t& { return c.engine.profile_steps; }, 0, 1000000, "0..10^6",
      "log where each of the first N steps' time went: scheduling, preparing and launching (pack, copy, attention "
      "plan), GPU compute, waiting for the sampled tokens, output processing; cuda: each step's compute and each KV "
      "copy batch on one device clock"));
  f.push_back(Int<int64_t>(
      "engine", "structured_output_max_bytes",
      [](Config& c) -> int64_t& { return c.engine.structured_output_max_bytes; }, 1, int64_t{1} << 24, "1..2^24",
      "the largest JSON schema, regular expression, grammar or choice list a request may constrain its output with "
      "(larger ones are refused naming the field)"));
  f.push_back(Int<int32_t>(
      "engine", "structured_output_cache_mib",
      [](Config& c) -> int32_t& { return c.engine.structured_output_cache_mib; }, 1, 65536, "1..65536",
      "memory for compiled output constraints kept for reuse (the least recently used go first)"));
  f.push_back(Int<int64_t>(
      "engine", "structured_output_compile_timeout_ms",
      [](Config& c) -> int64_t& { return c.engine.structured_output_compile_timeout_ms; }, 1, 3600000, "1..3600000",
      "the longest a request's output constraint may take to compile (a 400 naming the field beyond; the compilation "
      "goes on, and while two such still run, requests to compile are 503s)"));
  f.push_back(Flag(
      "engine", "structured_output_in_reasoning",
      [](Config& c) -> bool& { return c.engine.structured_output_in_reasoning; },
      "a constraint holds for the whole output of a model that thinks in <think>…</think>, its reasoning included; "
      "off (as vLLM's enable_in_reasoning), the model reasons freely and the constraint holds for its answer"));
  // scheduler
  f.push_back(Int<int32_t>(
      "scheduler", "max_num_seqs", [](Config& c) -> int32_t& { return c.scheduler.max_num_seqs; }, 1, 4096, "1..4096",
      "sequences per step"));
  f.push_back(Int<int32_t>(
      "scheduler", "max_num_batched_tokens", [](Config& c) -> int32_t& { return c.scheduler.max_num_batched_tokens; },
      1, 1 << 20, "max_num_seqs..2^20", "tokens per step (prefill is chunked to fit)"));
  f.push_back(Flag(
      "scheduler", "prefix_caching", [](Config& c) -> bool& { return c.scheduler.prefix_caching; },
      "a new request reuses the cached KV blocks of its longest known prompt prefix (full blocks, "
      "chained hashes checked against their tokens); free cached blocks are evicted least recently "
      "used first; `usage.cached_prompt_tokens` reports the reuse"));
  f.push_back(Int<int32_t>(
      "scheduler", "max_queue", [](Config& c) -> int32_t& { return c.scheduler.max_queue; }, 1, 1000000, "1..10^6",
      "requests accepted and not yet started before RESOURCE_EXHAUSTED; the bound holds exactly"));
  f.push_back(Int<int64_t>(
      "scheduler", "max_queued_tokens", [](Config& c) -> int64_t& { return c.scheduler.max_queued_tokens; }, 1,
      int64_t{1} << 31, "1..2^31",
      "prompt tokens of the requests accepted and not yet started; one more is RESOURCE_EXHAUSTED"));
  f.push_back(Int<int32_t>(
      "scheduler", "long_prefill_chunk", [](Config& c) -> int32_t& { return c.scheduler.long_prefill_chunk; }, 0,
      1 << 20, "0..max_num_batched_tokens",
      "prompt tokens one request may compute in a step while others wait (alone it takes the whole "
      "step), so a long prompt never holds back a newcomer's first token; 0 = max_num_batched_tokens / 4"));
  f.push_back(Real(
      "scheduler", "priority_aging_s", [](Config& c) -> double& { return c.scheduler.priority_aging_s; }, 0, 86400,
      false, "0..86400",
      "each this many seconds of waiting raise a request's priority by one, so low priorities cannot starve; "
      "0 = no aging"));
  // server
  f.push_back(Text(
      "server", "listen", [](Config& c) -> std::string& { return c.server.listen; }, {}, "HOST:PORT, PORT 0..65535",
      "0 picks a free port"));
  f.push_back(Real(
      "server", "drain_timeout_s", [](Config& c) -> double& { return c.server.drain_timeout_s; }, 0, 3600, false,
      "0..3600", "on SIGTERM, how long running requests may finish"));
  f.push_back(Int<int64_t>(
      "server", "max_request_bytes", [](Config& c) -> int64_t& { return c.server.max_request_bytes; }, 1, 64 << 20,
      "1..64 MiB",
      "a larger GenerateRequest (or Tokenize text) is INVALID_ARGUMENT; over 64 MiB gRPC refuses "
      "it with RESOURCE_EXHAUSTED"));
  f.push_back(Text(
      "server", "metrics_listen", [](Config& c) -> std::string& { return c.server.metrics_listen; }, {},
      "HOST:PORT, or empty",
      "Prometheus metrics at /metrics; empty = off; slow clients closed after http_request_timeout_s, at most 64 "
      "connections open"));
  f.push_back(Real(
      "server", "liveness_timeout_s", [](Config& c) -> double& { return c.server.liveness_timeout_s; }, 0, 86400, false,
      "0..86400",
      "health reports NOT_SERVING while requests are pending and for this long no step has finished nor the "
      "running step advanced (cpu: a layer or an attention row) (and SERVING again once steps resume); 0 = off"));
  f.push_back(Text(
      "server", "http_listen", [](Config& c) -> std::string& { return c.server.http_listen; }, {},
      "HOST:PORT, or empty",
      "the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics); "
      "the default config serves it on 127.0.0.1:8000",
      "(off)"));
  f.push_back(Real(
      "server", "http_request_timeout_s", [](Config& c) -> double& { return c.server.http_request_timeout_s; }, 1, 3600,
      false, "1..3600",
      "an HTTP request's head and body must arrive within this (slow clients are closed), and a kept-alive "
      "connection without a request closes after it"));
  f.push_back(Text(
      "server", "tls_cert_file", [](Config& c) -> std::string& { return c.server.tls_cert_file; }, {}, "PEM file",
      "TLS for gRPC and HTTP with this certificate chain (and tls_key_file); plaintext is refused then",
      "(plaintext)"));
  f.push_back(Text(
      "server", "tls_key_file", [](Config& c) -> std::string& { return c.server.tls_key_file; }, {}, "PEM file",
      "the private key of tls_cert_file", "(none)"));
  f.push_back(Text(
      "server", "tls_client_ca_file", [](Config& c) -> std::string& { return c.server.tls_client_ca_file; }, {},
      "PEM file", "mutual TLS: clients must present a certificate this CA signed", "(no client certificates)"));
  f.push_back(Text(
      "server", "api_keys_file", [](Config& c) -> std::string& { return c.server.api_keys_file; }, {}, "file",
      "API keys, one per line (# comments), reloaded on SIGHUP: every request needs one (HTTP `Authorization: "
      "Bearer KEY`, gRPC `authorization: Bearer KEY` metadata); keys are never logged",
      "(no keys asked)"));
  f.push_back(Flag(
      "server", "api_keys_exempt_health", [](Config& c) -> bool& { return c.server.api_keys_exempt_health; },
      "HTTP /health answers without a key (gRPC health always does: Kubernetes' gRPC probes send no metadata)"));
  f.push_back(Flag(
      "server", "api_keys_exempt_metrics", [](Config& c) -> bool& { return c.server.api_keys_exempt_metrics; },
      "/metrics on http_listen answers without a key (metrics_listen never asks for one: keep it internal)"));
  f.push_back(Text(
      "server", "http_unknown_fields", [](Config& c) -> std::string& { return c.server.http_unknown_fields; },
      {"ignore", "refuse"}, "ignore, refuse",
      "OpenAI-API request fields inferd does not know (routers and SDKs add their own): ignore them, named in "
      "the log, the X-Inferd-Ignored-Fields response header and inferd_http_ignored_fields_total; or refuse the "
      "request with a 400 naming the first. Fields inferd knows but cannot honour are always refused"));
  // kv_events
  f.push_back(Flag(
      "kv_events", "enabled", [](Config& c) -> bool& { return c.kv_events.enabled; },
      "publish KV-cache events for KV-aware routers: every prefix block the cache starts or stops holding (device "
      "tier medium GPU, host tier CPU), in vLLM's schema (ZeroMQ PUB of [topic, sequence number, msgpack batch])"));
  f.push_back(Text(
      "kv_events", "endpoint", [](Config& c) -> std::string& { return c.kv_events.endpoint; }, {}, "a ZeroMQ address",
      "where the PUB socket binds"));
  f.push_back(Text(
      "kv_events", "replay_endpoint", [](Config& c) -> std::string& { return c.kv_events.replay_endpoint; }, {},
      "a ZeroMQ address, or empty",
      "a ROUTER socket: a subscriber that missed batches sends the first sequence number it wants and gets every "
      "buffered batch from there, then an end marker (sequence -1, empty payload)",
      "(off)"));
  f.push_back(Text(
      "kv_events", "topic", [](Config& c) -> std::string& { return c.kv_events.topic; }, {}, "text",
      "the first frame of every published message (subscribers filter on its prefix)", "(empty)"));
  f.push_back(Int<int32_t>(
      "kv_events", "buffer_steps", [](Config& c) -> int32_t& { return c.kv_events.buffer_steps; }, 1, 1000000,
      "1..10^6", "published batches kept for replay"));
  // speculative
  f.push_back(Text(
      "speculative", "method", [](Config& c) -> std::string& { return c.speculative.method; },
      {"off", "ngram", "suffix"}, "off, ngram, suffix",
      "speculative decoding: each decoding sequence drafts its next tokens from text it has seen and checks them "
      "in one step (1 + k rows; the tokens kept are those sampling without drafts gives: greedy the same tokens, "
      "seeded sampling the same tokens, unseeded the same distribution). ngram: prompt lookup, the tokens that "
      "followed the latest earlier occurrence of the sequence's last n tokens; suffix: suffix decoding, the most "
      "frequent continuation of its longest repeated suffix in its own prompt and output and in recent outputs. "
      "Pays where outputs repeat their input (edits, quotes, agents' transcripts); a request opts out with "
      "`speculative: false`"));
  f.push_back(Int<int32_t>(
      "speculative", "max_tokens", [](Config& c) -> int32_t& { return c.speculative.max_tokens; }, 1, 16, "1..16",
      "tokens a sequence drafts for one step at most (fewer while its drafts are rejected: min_acceptance); a "
      "step's drafted tokens and prompt-logprob rows together are at most scheduler.max_num_seqs"));
  f.push_back(Int<int32_t>(
      "speculative", "ngram_min", [](Config& c) -> int32_t& { return c.speculative.ngram_min; }, 1, 64, "1..ngram_max",
      "ngram: the fewest last tokens matched"));
  f.push_back(Int<int32_t>(
      "speculative", "ngram_max", [](Config& c) -> int32_t& { return c.speculative.ngram_max; }, 1, 64, "1..64",
      "ngram: the most last tokens matched (the longest match found wins)"));
  f.push_back(Int<int32_t>(
      "speculative", "suffix_max_depth", [](Config& c) -> int32_t& { return c.speculative.suffix_max_depth; }, 2, 256,
      "2..256", "suffix: the longest run of tokens indexed; suffixes of up to half of it are matched"));
  f.push_back(Int<int64_t>(
      "speculative", "suffix_cache_tokens", [](Config& c) -> int64_t& { return c.speculative.suffix_cache_tokens; }, 0,
      int64_t{1} << 30, "0..2^30",
      "suffix: output tokens of finished requests kept for every sequence to draft from (the oldest go first); "
      "0 = each sequence drafts from its own tokens only"));
  f.push_back(Real(
      "speculative", "min_acceptance", [](Config& c) -> double& { return c.speculative.min_acceptance; }, 0, 1, true,
      "(0, 1]",
      "a sequence drafts k tokens while its estimated acceptance a (decayed over its steps) keeps a^k above this; "
      "below it for one token it stops drafting, trying one again every 16 steps"));
  f.push_back(Int<int32_t>(
      "speculative", "max_batch", [](Config& c) -> int32_t& { return c.speculative.max_batch; }, 0, 4096, "0..4096",
      "a step of more sequences than this drafts nothing (in a large batch a step reads the weights once for "
      "many rows already, and checking drafts costs more than it saves); 0 = no limit"));
  f.push_back(Flag(
      "speculative", "adaptive", [](Config& c) -> bool& { return c.speculative.adaptive; },
      "steps draft only while, at their batch size (1, 2-3, 4-7, ...), the steps that checked drafts made tokens "
      "faster than plain decode steps, by their measured wall times and the tokens kept (each side tried again "
      "every 64 steps); off: every step up to max_batch drafts"));
  return f;
}

}  // namespace

const std::vector<ConfigField>& ConfigFields() {
  static const std::vector<ConfigField> fields = MakeFields();
  return fields;
}

absl::Status CheckListenAddress(const std::string& listen) {
  return CheckListen(listen);
}

std::string ConfigReferenceMarkdown() {
  std::string s = "| key | default | allowed | meaning |\n|---|---|---|---|\n";
  for (const ConfigField& f : ConfigFields()) {
    absl::StrAppend(&s, "| `", f.name(), "` | ", f.default_text, " | ", f.allowed, " | ", f.doc, " |\n");
  }
  return s;
}

}  // namespace inferd
