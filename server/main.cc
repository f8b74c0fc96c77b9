// inferd: serves a Llama-family model over gRPC and the OpenAI-compatible HTTP API.
// Usage: inferd --config FILE [--listen HOST:PORT] [--http-listen HOST:PORT|""] [--metrics-listen HOST:PORT|""]
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "engine/config.h"
#include "engine/config_fields.h"
#include "engine/engine.h"
#include "server/api_keys.h"
#include "server/health_probe.h"
#include "server/http/http_server.h"
#include "server/http/openai_front_end.h"
#include "server/inference_service.h"
#include "server/kv_event_publisher.h"
#include "server/liveness.h"
#include "server/metrics.h"
#include "server/plan.h"
#include "spdlog/spdlog.h"

namespace {

int g_signal_pipe[2] = {-1, -1};

extern "C" void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t unused = write(g_signal_pipe[1], &b, 1);  // async-signal-safe
  (void)unused;
}

// Blocks until SIGINT or SIGTERM arrives; returns its number. SIGHUP reloads the API keys meanwhile.
int WaitForSignal(inferd::ApiKeys* keys) {
  while (true) {
    unsigned char b = 0;
    while (read(g_signal_pipe[0], &b, 1) != 1) {
    }
    if (b != SIGHUP) return b;
    if (!keys) {
      spdlog::info("SIGHUP: no server.api_keys_file to reload");
    } else if (absl::Status st = keys->Reload(); st.ok()) {
      spdlog::info("SIGHUP: reloaded {} API keys", keys->size());
    } else {
      spdlog::error("SIGHUP: {}; the {} keys before stay", std::string(st.message()), keys->size());
    }
  }
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* key) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("config: server.", key, " = '", path, "' cannot be read"));
  }
  return text.str();
}

// gRPC's credentials from the server.tls_* files: plaintext when none is set.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcCredentials(const inferd::ServerSection& s) {
  if (s.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  auto cert = ReadPem(s.tls_cert_file, "tls_cert_file");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(s.tls_key_file, "tls_key_file");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(s.tls_client_ca_file.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!s.tls_client_ca_file.empty()) {
    auto ca = ReadPem(s.tls_client_ca_file, "tls_client_ca_file");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

constexpr const char* kUsage =
    "usage: inferd --config FILE [--listen HOST:PORT] [--http-listen HOST:PORT|\"\"] [--metrics-listen "
    "HOST:PORT|\"\"]\n"
    "       inferd --config-reference    (every config key as a markdown table)\n"
    "       inferd plan --config FILE [--gpu-memory-gib N]    (the cuda memory plan, without starting)\n"
    "       inferd health-probe [--address HOST:PORT]    (exit 0 when the server there is SERVING)";

int Run(int argc, char** argv) {
  std::string config_path, listen;
  std::optional<std::string> metrics_listen, http_listen;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--config" || arg == "--listen") && i + 1 < argc) {
      (arg == "--config" ? config_path : listen) = argv[++i];
    } else if (arg == "--metrics-listen" && i + 1 < argc) {
      metrics_listen = argv[++i];
    } else if (arg == "--http-listen" && i + 1 < argc) {
      http_listen = argv[++i];
    } else if (arg == "--config-reference") {
      std::cout << inferd::ConfigReferenceMarkdown();
      return 0;
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage << "\n";
      return 0;
    } else {
      std::cerr << "inferd: unknown argument '" << arg << "'\n" << kUsage << "\n";
      return 2;
    }
  }
  if (config_path.empty()) {
    std::cerr << "inferd: --config is required\n" << kUsage << "\n";
    return 2;
  }
  auto config = inferd::LoadConfigFile(config_path);
  if (!config.ok()) {
    std::cerr << "inferd: " << config.status().message() << "\n";
    return 2;
  }
  if (!listen.empty() || metrics_listen || http_listen) {
    if (!listen.empty()) config->server.listen = listen;
    if (metrics_listen) config->server.metrics_listen = *metrics_listen;
    if (http_listen) config->server.http_listen = *http_listen;
    auto checked = inferd::ParseConfig(inferd::ConfigToYaml(*config));
    if (!checked.ok()) {
      std::cerr << "inferd: --listen / --http-listen / --metrics-listen: " << checked.status().message() << "\n";
      return 2;
    }
  }
  spdlog::info("effective config:\n{}", inferd::ConfigToYaml(*config));

  // SIGINT and SIGTERM become bytes on a pipe, whichever thread the kernel picks (libraries start threads of
  // their own before main, so blocking the signals in ours is not enough).
  if (pipe(g_signal_pipe) != 0) {
    std::cerr << "inferd: cannot create the signal pipe: " << std::strerror(errno) << "\n";
    return 1;
  }
  struct sigaction action {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);

  std::unique_ptr<inferd::ApiKeys> keys;
  if (!config->server.api_keys_file.empty()) {
    auto loaded = inferd::ApiKeys::Load(config->server.api_keys_file);
    if (!loaded.ok()) {
      std::cerr << "inferd: config: " << loaded.status().message() << "\n";
      return 2;
    }
    keys = *std::move(loaded);
    spdlog::info("API keys: {} from {} (SIGHUP reloads them)", keys->size(), config->server.api_keys_file);
  }
  auto credentials = GrpcCredentials(config->server);
  if (!credentials.ok()) {
    std::cerr << "inferd: " << credentials.status().message() << "\n";
    return 2;
  }

  // Request preparation (parsing, chat rendering, tokenizing) gets half the cores, at least two threads.
  const int request_workers = std::max(2, static_cast<int>(std::thread::hardware_concurrency() / 2));
  inferd::InferenceService service(
      {.max_request_bytes = config->server.max_request_bytes, .max_queue = config->scheduler.max_queue},
      request_workers);
  service.SetApiKeys(keys.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config->server.listen, *credentials, &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, inferd::kTransportMetadataBytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "inferd: cannot listen on server.listen = '" << config->server.listen << "'\n";
    return 1;
  }
  auto* grpc_health = server->GetHealthCheckService();
  // What grpc.health.v1 says, and HTTP's /health with it.
  auto serving = std::make_shared<std::atomic<bool>>(false);
  auto set_serving = [grpc_health, serving](bool on) {
    serving->store(on);
    grpc_health->SetServingStatus(on);
  };
  set_serving(false);
  std::unique_ptr<inferd::Metrics> metrics;
  if (!config->server.metrics_listen.empty() || !config->server.http_listen.empty()) {
    auto started = inferd::Metrics::Start(config->server.metrics_listen, config->server.http_request_timeout_s);
    if (!started.ok()) {
      std::cerr << "inferd: " << started.status().message() << "\n";
      server->Shutdown(std::chrono::system_clock::now());
      return 2;
    }
    metrics = *std::move(started);
    service.SetMetrics(metrics.get());
    if (!config->server.metrics_listen.empty())
      spdlog::info("metrics on {} at /metrics", config->server.metrics_listen);
  }
  std::unique_ptr<inferd::OpenAiFrontEnd> front_end;
  std::unique_ptr<inferd::HttpServer> http;
  if (!config->server.http_listen.empty()) {
    front_end = std::make_unique<inferd::OpenAiFrontEnd>(
        inferd::OpenAiFrontEnd::Hooks{.services = [&service] { return service.Services(); },
                                      .active_calls = service.call_counter(),
                                      .serving = [serving] { return serving->load(); },
                                      .metrics = metrics.get(),
                                      .keys = keys.get(),
                                      .keys_exempt_health = config->server.api_keys_exempt_health,
                                      .keys_exempt_metrics = config->server.api_keys_exempt_metrics,
                                      .refuse_unknown_fields = config->server.http_unknown_fields == "refuse"});
    const inferd::TlsFiles tls{config->server.tls_cert_file, config->server.tls_key_file,
                               config->server.tls_client_ca_file};
    auto started = inferd::HttpServer::Start(
        {.listen = config->server.http_listen,
         .threads = 2,
         .max_body_bytes = config->server.max_request_bytes,
         .request_timeout_s = config->server.http_request_timeout_s,
         .tls = config->server.tls_cert_file.empty() ? nullptr : &tls},
        [fe = front_end.get()](std::shared_ptr<inferd::HttpExchange> exchange) { fe->Handle(std::move(exchange)); });
    if (!started.ok()) {
      std::cerr << "inferd: config: " << started.status().message() << "\n";
      server->Shutdown(std::chrono::system_clock::now());
      return 2;
    }
    http = *std::move(started);
    spdlog::info("OpenAI-compatible HTTP{} on {} (port {})", config->server.tls_cert_file.empty() ? "" : "S",
                 config->server.http_listen, http->port());
  }
  std::unique_ptr<inferd::KvEventPublisher> kv_events;
  if (config->kv_events.enabled) {  // bound before the model loads, as the listeners are: a taken port fails fast
    auto started = inferd::KvEventPublisher::Start(config->kv_events, config->engine.block_size);
    if (!started.ok()) {
      std::cerr << "inferd: " << started.status().message() << "\n";
      server->Shutdown(std::chrono::system_clock::now());
      return 2;
    }
    kv_events = *std::move(started);
  }
  spdlog::info("listening on {} (port {}); loading the model", config->server.listen, port);

  auto engine = inferd::Engine::Create(*config);
  if (!engine.ok()) {
    std::cerr << "inferd: cannot start: " << engine.status().message() << "\n";
    server->Shutdown(std::chrono::system_clock::now());
    return inferd::IsConfigError(engine.status()) ? 2 : 1;  // a config value the model or machine cannot take
  }
  std::shared_ptr<inferd::Engine> live = std::move(*engine);
  if (metrics) metrics->Attach(live);
  if (kv_events) {
    live->SetKvEventObserver([publisher = kv_events.get()](std::vector<inferd::KvCacheEvent> events) {
      publisher->Publish(std::move(events));
    });
  }
  service.SetEngine(live);
  set_serving(true);  // after the engine's warm-up step
  inferd::Liveness liveness(live, config->server.liveness_timeout_s, set_serving);
  spdlog::info("ready: model '{}' on the {} backend, max_model_len {}", live->model().name, live->backend_name(),
               live->max_model_len());

  const int sig = WaitForSignal(keys.get());
  spdlog::info("signal {}: draining (up to {} s)", sig, config->server.drain_timeout_s);
  // A second signal while draining ends the process at once.
  std::thread([keys = keys.get()] {
    const int again = WaitForSignal(keys);
    spdlog::warn("signal {} again: exiting now without finishing the drain (exit code {})", again, 128 + again);
    spdlog::default_logger()->flush();
    std::_Exit(128 + again);
  }).detach();
  liveness.Stop();
  set_serving(false);
  live->StartDraining();
  const auto drain_end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(config->server.drain_timeout_s * 1000));
  while (std::chrono::steady_clock::now() < drain_end) {
    const inferd::EngineStats s = live->Stats();
    if (s.unfinished == 0) break;  // running and waiting lag a step behind: a request mid-step counts in neither
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // What still runs ends with UNAVAILABLE; once those last writes are out (at most 5 s), the server closes
  // everything else at once: health watches and idle connections would otherwise hold it to a deadline.
  live->Stop();
  const auto writes_end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (service.active_generate_calls() > 0 && std::chrono::steady_clock::now() < writes_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server->Shutdown(std::chrono::system_clock::now());
  if (http) http->Stop();
  service.SetEngine(nullptr);
  live->SetKvEventObserver(nullptr);  // the publisher goes before the engine's last reference may
  live.reset();
  server->Wait();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "plan") return inferd::RunPlan(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "health-probe") return inferd::RunHealthProbe(argc, argv);
  return Run(argc, argv);
}
