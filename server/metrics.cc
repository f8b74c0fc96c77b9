#include "server/metrics.h"

#include <httplib.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <array>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace inferd {
namespace {

using prometheus::BuildCounter;
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
Histogram::BucketBoundaries Tokens() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
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
prometheus::MetricFamily Counter(const std::string& name, const std::string& help, double v) {
  prometheus::MetricFamily f{name, help, prometheus::MetricType::Counter, {}};
  prometheus::ClientMetric m;
  m.counter.value = v;
  f.metric.push_back(m);
  return f;
}

// The engine's state, read at scrape time.
class EngineCollector final : public prometheus::Collectable {
 public:
  explicit EngineCollector(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    const EngineStats s = engine_->Stats();
    const double used = s.total_blocks - s.free_blocks;
    return {
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
        Counter("inferd_preempted_tokens_total", "Computed tokens thrown away by preemptions (recomputed).",
                double(s.preempted_tokens)),
        Counter("inferd_steps_total", "Steps the engine ran.", double(s.engine_steps)),
        Counter("inferd_device_busy_seconds_total", "Device time of the steps (cuda: CUDA events).", s.device_busy_s),
    };
  }

 private:
  std::shared_ptr<Engine> engine_;
};

}  // namespace

// The HTTP side is cpp-httplib, not prometheus-cpp's civetweb Exposer: civetweb starts its threads with fixed
// 100 KiB stacks, smaller than the static TLS that cuBLASLt and OpenBLAS bring into this process (~160 KiB),
// so glibc refuses them (EINVAL). The exposition text is prometheus-cpp's own serializer.
struct Metrics::Impl {
  ~Impl() {
    http.stop();
    if (thread.joinable()) thread.join();
  }
  httplib::Server http;
  std::thread thread;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<EngineCollector> engine;
  std::mutex mu;  // histograms and counters are thread-safe; this guards `engine`
  prometheus::Family<prometheus::Counter>* finished = nullptr;
  prometheus::Family<prometheus::Counter>* calls = nullptr;
  Histogram *ttft = nullptr, *tpot = nullptr, *itl = nullptr, *e2e = nullptr, *queue = nullptr;
  Histogram *prompt = nullptr, *generated = nullptr, *batch = nullptr, *step_tokens = nullptr, *step_s = nullptr;
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen) {
  auto impl = std::make_unique<Impl>();
  prometheus::Registry& r = *impl->registry;
  impl->finished =
      &BuildCounter().Name("inferd_request_success_total").Help("Requests that ended, by finish reason.").Register(r);
  impl->calls = &BuildCounter()
                     .Name("inferd_requests_total")
                     .Help("Generate and GenerateStream calls that ended, by gRPC status code.")
                     .Register(r);
  auto hist = [&](const char* name, const char* help, Histogram::BucketBoundaries b) {
    return &BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(b));
  };
  impl->ttft = hist("inferd_time_to_first_token_seconds", "Arrival to first token.", Seconds());
  impl->tpot = hist("inferd_time_per_output_token_seconds", "(End - first token) / (output tokens - 1).", Seconds());
  impl->itl = hist("inferd_inter_token_latency_seconds", "Between consecutive output tokens.", Seconds());
  impl->e2e = hist("inferd_e2e_request_latency_seconds", "Arrival to finish.", Seconds());
  impl->queue = hist("inferd_request_queue_time_seconds", "Arrival to first scheduled.", Seconds());
  impl->prompt = hist("inferd_request_prompt_tokens", "Prompt tokens per request.", Tokens());
  impl->generated = hist("inferd_request_generation_tokens", "Output tokens per request.", Tokens());
  impl->batch = hist("inferd_step_batch_size", "Sequences per step.", Tokens());
  impl->step_tokens = hist("inferd_step_tokens", "Tokens computed per step.", Tokens());
  impl->step_s = hist("inferd_step_duration_seconds", "Host time of a step, scheduling to sampled tokens.", Seconds());
  Impl* m = impl.get();
  m->http.Get("/metrics", [m](const httplib::Request&, httplib::Response& res) {
    std::vector<prometheus::MetricFamily> families = m->registry->Collect();
    std::shared_ptr<EngineCollector> engine;
    {
      std::lock_guard<std::mutex> lock(m->mu);
      engine = m->engine;
    }
    if (engine) {
      for (prometheus::MetricFamily& f : engine->Collect()) families.push_back(std::move(f));
    }
    res.set_content(prometheus::TextSerializer().Serialize(families), "text/plain; version=0.0.4; charset=utf-8");
  });
  const size_t colon = listen.rfind(':');
  const std::string host = listen.substr(0, colon);
  const int port = std::atoi(listen.c_str() + colon + 1);
  if (colon == std::string::npos || !m->http.bind_to_port(host, port)) {
    return absl::InvalidArgumentError(absl::StrCat("config: server.metrics_listen = '", listen,
                                                   "': cannot listen there (in use, or not an address of this host)"));
  }
  m->thread = std::thread([m] { m->http.listen_after_bind(); });
  // Until it listens, stop() would not reach it: wait, so that a start-up failure right after can shut it down.
  for (int i = 0; i < 5000 && !m->http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

void Metrics::Attach(std::shared_ptr<Engine> engine) {
  Impl* m = impl_.get();
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
      });
  std::lock_guard<std::mutex> lock(m->mu);
  m->engine = std::make_shared<EngineCollector>(std::move(engine));
}

void Metrics::CountCall(grpc::StatusCode code) {
  const size_t i = static_cast<size_t>(code);
  impl_->calls->Add({{"code", i < kCodeNames.size() ? kCodeNames[i] : "UNKNOWN"}}).Increment();
}

}  // namespace inferd
