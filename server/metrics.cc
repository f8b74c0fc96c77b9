#include "server/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/http/http_server.h"

namespace inferd {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

constexpr std::array<const char*, 17> kCodeNames = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

Histogram::BucketBoundaries Seconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60};
}
Histogram::BucketBoundaries Ratios() {  // past 1 where a small model's weights stay in cache (cpu)
  return {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1, 1.25, 1.5, 2, 4};
}
Histogram::BucketBoundaries Joules() {
  return {0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50};
}
Histogram::BucketBoundaries Tokens() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
}

// A registered metric with these labels (a family is shared when its name is registered again).
prometheus::Gauge* AddGauge(prometheus::Registry& r, const std::string& name, const std::string& help,
                            const prometheus::Labels& labels = {}) {
  return &BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}
prometheus::Counter* AddCounter(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &BuildCounter().Name(name).Help(help).Register(r).Add({});
}
Histogram* AddHistogram(prometheus::Registry& r, const std::string& name, const std::string& help,
                        Histogram::BucketBoundaries buckets, const prometheus::Labels& labels = {}) {
  return &BuildHistogram().Name(name).Help(help).Register(r).Add(labels, std::move(buckets));
}

prometheus::MetricFamily Gauge(const std::string& name, const std::string& help,
                               std::vector<std::pair<std::vector<prometheus::ClientMetric::Label>, double>> values) {
  prometheus::MetricFamily f{name, help, prometheus::MetricType::Gauge, {}};
  for (auto& [labels, v] : values) {
    prometheus::ClientMetric m;
    m.label = labels;
    m.gauge.value = v;
    f.metric.push_back(m);
  }
  return f;
}
prometheus::MetricFamily Counter(const std::string& name, const std::string& help, double v,
                                 std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::MetricFamily f{name, help, prometheus::MetricType::Counter, {}};
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = v;
  f.metric.push_back(m);
  return f;
}

// The same state under vLLM's names (with its model_name label), which the Gateway API Inference Extension's
// endpoint picker and the community dashboards read.
std::vector<prometheus::MetricFamily> VllmAliases(const EngineStats& s, const std::string& model) {
  const std::vector<prometheus::ClientMetric::Label> label = {{"model_name", model}};
  const double usage = s.total_blocks > 0 ? double(s.total_blocks - s.free_blocks) / s.total_blocks : 0.0;
  return {
      Gauge("vllm:num_requests_running", "Requests in the running batch (inferd_num_requests_running).",
            {{label, double(s.running)}}),
      Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled (inferd_num_requests_waiting).",
            {{label, double(s.waiting)}}),
      Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = all of it (inferd_kv_cache_usage_ratio).",
            {{label, usage}}),
      Gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = all of it (vLLM's older name).", {{label, usage}}),
      Counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
              double(s.prefix_query_tokens), label),
      Counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", double(s.prefix_hit_tokens),
              label),
      Counter("vllm:spec_decode_num_drafts_total", "Speculative decoding: drafts checked (a sequence's in a step).",
              double(s.spec_drafts), label),
      Counter("vllm:spec_decode_num_draft_tokens_total", "Speculative decoding: drafted tokens checked.",
              double(s.spec_draft_tokens), label),
      Counter("vllm:spec_decode_num_accepted_tokens_total", "Speculative decoding: drafted tokens accepted.",
              double(s.spec_accepted_tokens), label),
  };
}

// The engine's state, read at scrape time.
class EngineCollector final : public prometheus::Collectable {
 public:
  explicit EngineCollector(std::shared_ptr<Engine> engine)
      : engine_(std::move(engine)), method_(engine_->config().speculative.method) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    const EngineStats s = engine_->Stats();
    const double used = s.total_blocks - s.free_blocks;
    std::vector<prometheus::MetricFamily> families = VllmAliases(s, engine_->model().name);
    std::vector<prometheus::MetricFamily> own = {
        Gauge("inferd_num_requests_running", "Requests in the running batch.", {{{}, double(s.running)}}),
        Gauge("inferd_num_requests_waiting", "Requests waiting to be scheduled.", {{{}, double(s.waiting)}}),
        Gauge("inferd_kv_blocks", "KV cache blocks by state (cached blocks are free and hold a reusable prefix).",
              {{{{"state", "used"}}, used},
               {{{"state", "free"}}, double(s.free_blocks)},
               {{{"state", "cached"}}, double(s.cached_blocks)}}),
        Gauge("inferd_kv_cache_usage_ratio", "Share of KV cache blocks held by requests.",
              {{{}, s.total_blocks > 0 ? used / s.total_blocks : 0.0}}),
        Gauge("inferd_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / prompt tokens looked up.",
              {{{}, s.prefix_query_tokens > 0 ? double(s.prefix_hit_tokens) / s.prefix_query_tokens : 0.0}}),
        Counter("inferd_prefix_cache_queries_tokens_total", "Prompt tokens looked up in the prefix cache.",
                double(s.prefix_query_tokens)),
        Counter("inferd_prefix_cache_hits_tokens_total", "Prompt tokens found in the prefix cache.",
                double(s.prefix_hit_tokens)),
        Counter("inferd_preemptions_total", "Requests sent back to waiting to free KV blocks or a slot.",
                double(s.preemptions)),
        Counter("inferd_swapped_preemptions_total", "Preemptions whose KV waited in host swap space.",
                double(s.swapped_preemptions)),
        Gauge("inferd_host_kv_blocks", "Host KV pool blocks by state (swap space and the prefix cache's host tier).",
              {{{{"state", "swapped"}}, double(s.host_swap_blocks)},
               {{{"state", "cached"}}, double(s.host_cached_blocks)},
               {{{"state", "total"}}, double(s.host_blocks)}}),
        Counter("inferd_prefix_cache_host_hits_tokens_total",
                "Prompt tokens found in the prefix cache's host tier (copied back, not computed).",
                double(s.host_hit_tokens)),
        Counter("inferd_kv_copied_to_host_bytes_total", "KV bytes copied to host memory (swap-outs, write-backs).",
                double(s.copied_to_host_bytes)),
        Counter("inferd_kv_copied_to_device_bytes_total", "KV bytes copied back (swap-ins, host-tier restores).",
                double(s.copied_to_device_bytes)),
        Counter("inferd_kv_copy_seconds_total", "Device time of KV block copies (cuda: their own stream).", s.copy_s),
        Counter("inferd_kv_copy_waited_seconds_total", "Of the KV copy time, what a step waited for.", s.copy_waited_s),
        Counter("inferd_structured_output_mask_seconds_total",
                "Host time computing structured output's next-token masks (all of a step's rows at once).",
                s.constraint_mask_s),
        Counter("inferd_structured_output_masked_rows_total", "Tokens sampled under a structured output mask.",
                double(s.constraint_masked_rows)),
        Counter("inferd_preempted_tokens_total", "Computed tokens thrown away by preemptions (recomputed).",
                double(s.preempted_tokens)),
        Counter("inferd_steps_total", "Steps the engine ran.", double(s.engine_steps)),
        Counter("inferd_spec_decode_drafts_total",
                "Speculative decoding: drafts checked, one per sequence and step that checked any.",
                double(s.spec_drafts), {{"method", method_}}),
        Counter("inferd_spec_decode_draft_tokens_total", "Speculative decoding: drafted tokens checked.",
                double(s.spec_draft_tokens), {{"method", method_}}),
        Counter("inferd_spec_decode_accepted_tokens_total",
                "Speculative decoding: drafted tokens accepted (each draft also yields the token sampled after them; "
                "mean accepted length per draft = accepted / drafts).",
                double(s.spec_accepted_tokens), {{"method", method_}}),
        Counter("inferd_device_busy_seconds_total", "Device time of the steps (cuda: CUDA events).", s.device_busy_s),
    };
    families.insert(families.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
    return families;
  }

 private:
  std::shared_ptr<Engine> engine_;
  std::string method_;  // speculative.method: the spec_decode counters' label
};

}  // namespace

// The HTTP side is inferd's own HTTP server (as the API's: asynchronous, so slow clients hold no thread, with head
// timeouts and a bound on connections), not prometheus-cpp's civetweb Exposer: civetweb starts its threads with
// fixed 100 KiB stacks, smaller than the static TLS that cuBLASLt and OpenBLAS bring into this process (~160 KiB),
// so glibc refuses them (EINVAL). The exposition text is prometheus-cpp's own serializer.
struct Metrics::Impl {
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(sampler_mu);
      stop_sampler = true;
    }
    sampler_cv.notify_all();
    if (sampler.joinable()) sampler.join();
    if (http) http->Stop();
  }
  std::unique_ptr<HttpServer> http;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<EngineCollector> engine;
  std::mutex mu;  // histograms and counters are thread-safe; this guards `engine`
  prometheus::Family<prometheus::Counter>* finished = nullptr;
  prometheus::Family<prometheus::Counter>* calls = nullptr;
  prometheus::Family<prometheus::Counter>* auth_failures = nullptr;
  prometheus::Counter* ignored_fields = nullptr;
  Histogram *ttft = nullptr, *tpot = nullptr, *itl = nullptr, *e2e = nullptr, *queue = nullptr;
  Histogram *prompt = nullptr, *generated = nullptr, *batch = nullptr, *step_tokens = nullptr, *step_s = nullptr;

  // How close each step ran to the device's ceilings, by kind of step ("decode" or "prefill").
  struct Utilisation {
    prometheus::Gauge *bandwidth = nullptr, *flops = nullptr;
    Histogram *bandwidth_hist = nullptr, *flops_hist = nullptr;
  };
  Utilisation decode, prefill;
  prometheus::Gauge* idle = nullptr;
  Histogram* idle_hist = nullptr;
  prometheus::Counter *bytes_read = nullptr, *flops = nullptr, *generated_tokens = nullptr;
  DeviceCeilings ceilings;  // set before the engine serves; read on its thread

  // The device's sensors, sampled every kSampleInterval on their own thread (cuda: NVML).
  void Sample();
  std::shared_ptr<Engine> sampled_engine;
  std::thread sampler;
  std::mutex sampler_mu;
  std::condition_variable sampler_cv;
  bool stop_sampler = false;
  prometheus::Gauge *gpu_util = nullptr, *gpu_memory = nullptr, *gpu_power = nullptr, *gpu_temp = nullptr,
                    *gpu_clock = nullptr, *energy_per_token = nullptr;
  prometheus::Counter* energy = nullptr;
  Histogram* energy_per_token_hist = nullptr;
};

constexpr std::chrono::milliseconds kSampleInterval{1000};

void Metrics::Impl::Sample() {
  double last_energy = -1, last_tokens = generated_tokens->Value();
  std::unique_lock<std::mutex> lock(sampler_mu);
  while (!stop_sampler) {
    const DeviceReading r = sampled_engine->ReadDevice();
    if (r.utilization) gpu_util->Set(*r.utilization);
    if (r.memory_used_bytes) gpu_memory->Set(*r.memory_used_bytes);
    if (r.power_w) gpu_power->Set(*r.power_w);
    if (r.temperature_c) gpu_temp->Set(*r.temperature_c);
    if (r.sm_clock_hz) gpu_clock->Set(*r.sm_clock_hz);
    const double tokens = generated_tokens->Value();
    if (r.energy_j) {
      if (last_energy >= 0 && *r.energy_j >= last_energy) {
        const double joules = *r.energy_j - last_energy;
        energy->Increment(joules);
        if (tokens > last_tokens) {
          energy_per_token->Set(joules / (tokens - last_tokens));
          energy_per_token_hist->Observe(joules / (tokens - last_tokens));
        }
      }
      last_energy = *r.energy_j;
    }
    last_tokens = tokens;
    sampler_cv.wait_for(lock, kSampleInterval, [&] { return stop_sampler; });
  }
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen, double request_timeout_s) {
  auto impl = std::make_unique<Impl>();
  prometheus::Registry& r = *impl->registry;
  impl->finished =
      &BuildCounter().Name("inferd_request_success_total").Help("Requests that ended, by finish reason.").Register(r);
  impl->calls = &BuildCounter()
                     .Name("inferd_requests_total")
                     .Help("Generate and GenerateStream calls that ended, by gRPC status code.")
                     .Register(r);
  impl->ttft = AddHistogram(r, "inferd_time_to_first_token_seconds", "Arrival to first token.", Seconds());
  impl->tpot =
      AddHistogram(r, "inferd_time_per_output_token_seconds", "(End - first token) / (output tokens - 1).", Seconds());
  impl->itl = AddHistogram(r, "inferd_inter_token_latency_seconds", "Between consecutive output tokens.", Seconds());
  impl->e2e = AddHistogram(r, "inferd_e2e_request_latency_seconds", "Arrival to finish.", Seconds());
  impl->queue = AddHistogram(r, "inferd_request_queue_time_seconds", "Arrival to first scheduled.", Seconds());
  impl->prompt = AddHistogram(r, "inferd_request_prompt_tokens", "Prompt tokens per request.", Tokens());
  impl->generated = AddHistogram(r, "inferd_request_generation_tokens", "Output tokens per request.", Tokens());
  impl->batch = AddHistogram(r, "inferd_step_batch_size", "Sequences per step.", Tokens());
  impl->step_tokens = AddHistogram(r, "inferd_step_tokens", "Tokens computed per step.", Tokens());
  impl->step_s =
      AddHistogram(r, "inferd_step_duration_seconds", "Host time of a step, scheduling to sampled tokens.", Seconds());
  const std::string bandwidth = "weight and KV bytes it must read / its device time / the read ceiling.";
  const std::string flops = "model FLOPs / its device time / the GEMM ceiling.";
  for (const char* kind : {"decode", "prefill"}) {
    Impl::Utilisation& u = std::string(kind) == "decode" ? impl->decode : impl->prefill;
    const prometheus::Labels labels = {{"kind", kind}};
    u.bandwidth = AddGauge(r, "inferd_model_bandwidth_utilization_ratio", "Last step: " + bandwidth, labels);
    u.flops = AddGauge(r, "inferd_model_flops_utilization_ratio", "Last step: " + flops, labels);
    u.bandwidth_hist =
        AddHistogram(r, "inferd_step_model_bandwidth_utilization_ratio", "Per step: " + bandwidth, Ratios(), labels);
    u.flops_hist = AddHistogram(r, "inferd_step_model_flops_utilization_ratio", "Per step: " + flops, Ratios(), labels);
  }
  const std::string idle = "share of the engine loop's iteration the device ran nothing.";
  impl->idle = AddGauge(r, "inferd_device_idle_ratio", "Last step: " + idle);
  impl->idle_hist = AddHistogram(r, "inferd_step_device_idle_ratio", "Per step: " + idle, Ratios());
  impl->bytes_read = AddCounter(r, "inferd_model_read_bytes_total",
                                "Weight and KV bytes the steps had to read (over device busy seconds: bandwidth).");
  impl->flops =
      AddCounter(r, "inferd_model_flops_total", "Model FLOPs of the steps (over device busy seconds: FLOP/s).");
  impl->generated_tokens = AddCounter(r, "inferd_generation_tokens_total", "Tokens generated.");
  impl->ignored_fields = AddCounter(r, "inferd_http_ignored_fields_total",
                                    "Fields of OpenAI-API request bodies inferd does not know, ignored "
                                    "(server.http_unknown_fields: ignore).");
  impl->auth_failures = &BuildCounter()
                             .Name("inferd_auth_failures_total")
                             .Help("Requests refused for a missing or wrong API key, by front end.")
                             .Register(r);
  Impl* m = impl.get();
  auto metrics = std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
  if (listen.empty()) return metrics;
  Metrics* self = metrics.get();
  auto http = HttpServer::Start(
      {.listen = listen,
       .threads = 1,
       .max_body_bytes = 64 << 10,
       .request_timeout_s = request_timeout_s,
       .max_connections = kMaxMetricsConnections,
       .config_key = "server.metrics_listen"},
      [self](std::shared_ptr<HttpExchange> exchange) {
        const HttpRequest& req = exchange->request();
        const std::string path = req.target.substr(0, req.target.find('?'));
        if (path != "/metrics") {
          return exchange->Respond(404, "text/plain; charset=utf-8", "not found; this port serves /metrics\n");
        }
        if (req.method != "GET" && req.method != "HEAD") {
          return exchange->Respond(405, "text/plain; charset=utf-8", "allowed: GET, HEAD\n", {{"Allow", "GET, HEAD"}});
        }
        exchange->Respond(200, kContentType, self->Render());
      });
  if (!http.ok()) return absl::InvalidArgumentError(absl::StrCat("config: ", http.status().message()));
  m->http = *std::move(http);
  return metrics;
}

std::string Metrics::Render() const {
  Impl* m = impl_.get();
  std::vector<prometheus::MetricFamily> families = m->registry->Collect();
  std::shared_ptr<EngineCollector> engine;
  {
    std::lock_guard<std::mutex> lock(m->mu);
    engine = m->engine;
  }
  if (engine) {
    for (prometheus::MetricFamily& f : engine->Collect()) families.push_back(std::move(f));
  }
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::CountIgnoredFields(int64_t fields) {
  impl_->ignored_fields->Increment(static_cast<double>(fields));
}

void Metrics::CountAuthFailure(const char* front_end) {
  impl_->auth_failures->Add({{"api", front_end}}).Increment();
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

void Metrics::Attach(std::shared_ptr<Engine> engine) {
  Impl* m = impl_.get();
  m->ceilings = engine->ceilings();
  engine->SetObservers(
      [m](const FinishedRequest& f) {
        m->finished->Add({{"finish_reason", FinishReasonName(f.finish)}}).Increment();
        m->e2e->Observe(f.timing.total_s);
        m->queue->Observe(f.timing.queue_s);
        m->prompt->Observe(f.usage.prompt_tokens);
        m->generated->Observe(f.usage.completion_tokens);
        if (f.usage.completion_tokens > 0) m->ttft->Observe(f.timing.time_to_first_token_s);
        if (f.usage.completion_tokens > 1) {
          m->tpot->Observe((f.timing.total_s - f.timing.time_to_first_token_s) / (f.usage.completion_tokens - 1));
        }
        for (double s : f.inter_token_s) m->itl->Observe(s);
      },
      [m](const StepRecord& s) {
        m->batch->Observe(s.num_seqs);
        m->step_tokens->Observe(s.num_tokens);
        m->step_s->Observe(s.wall_s);
        m->generated_tokens->Increment(s.num_generated);
        m->bytes_read->Increment(s.cost.bytes);
        m->flops->Increment(s.cost.flops);
        if (s.device_s > 0 && m->ceilings.read_bytes_per_s > 0) {
          Impl::Utilisation& u = s.decode() ? m->decode : m->prefill;
          const double bandwidth = s.cost.bytes / s.device_s / m->ceilings.read_bytes_per_s;
          const double flops = s.cost.flops / s.device_s / m->ceilings.gemm_flops_per_s;
          u.bandwidth->Set(bandwidth);
          u.bandwidth_hist->Observe(bandwidth);
          u.flops->Set(flops);
          u.flops_hist->Observe(flops);
        }
        if (s.cycle_s > 0) {
          const double idle = std::clamp(1 - s.device_s / s.cycle_s, 0.0, 1.0);
          m->idle->Set(idle);
          m->idle_hist->Observe(idle);
        }
      });
  prometheus::Registry& r = *m->registry;
  if (m->ceilings.read_bytes_per_s > 0) {
    AddGauge(r, "inferd_device_read_bandwidth_ceiling_bytes_per_second",
             "Read-streaming bandwidth measured at start-up (" + m->ceilings.read_test + ").")
        ->Set(m->ceilings.read_bytes_per_s);
    AddGauge(r, "inferd_device_gemm_ceiling_flops_per_second",
             "Matrix product rate measured at start-up (" + m->ceilings.gemm_test + ").")
        ->Set(m->ceilings.gemm_flops_per_s);
  }
  // The sensors' families exist only where the device has sensors (not on the cpu backend).
  if (const DeviceReading first = engine->ReadDevice(); first.energy_j || first.power_w) {
    m->gpu_util = AddGauge(r, "inferd_gpu_utilization_ratio", "NVML: share of the last sample period a kernel ran.");
    m->gpu_memory = AddGauge(r, "inferd_gpu_memory_used_bytes", "NVML: device memory in use (all processes).");
    m->gpu_power = AddGauge(r, "inferd_gpu_power_watts", "NVML: board power draw.");
    m->gpu_temp = AddGauge(r, "inferd_gpu_temperature_celsius", "NVML: GPU core temperature.");
    m->gpu_clock = AddGauge(r, "inferd_gpu_sm_clock_hertz", "NVML: SM clock.");
    m->energy_per_token = AddGauge(r, "inferd_energy_per_generated_token_joules",
                                   "NVML energy of the last one-second period that generated tokens / those tokens.");
    m->energy = AddCounter(r, "inferd_gpu_energy_joules_total", "NVML: energy the GPU consumed since inferd started.");
    m->energy_per_token_hist = AddHistogram(r, "inferd_sampled_energy_per_generated_token_joules",
                                            "Per sample period with tokens: NVML energy / tokens generated.", Joules());
    m->sampled_engine = engine;
    m->sampler = std::thread([m] { m->Sample(); });
  }
  std::lock_guard<std::mutex> lock(m->mu);
  m->engine = std::make_shared<EngineCollector>(std::move(engine));
}

void Metrics::CountCall(grpc::StatusCode code) {
  const size_t i = static_cast<size_t>(code);
  impl_->calls->Add({{"code", i < kCodeNames.size() ? kCodeNames[i] : "UNKNOWN"}}).Increment();
}

}  // namespace inferd
