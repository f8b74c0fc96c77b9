// inferd: serves a Llama-family model over gRPC.
// Usage: inferd --config FILE [--listen HOST:PORT] [--metrics-listen HOST:PORT|""]
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
#include <iostream>
#include <optional>
#include <thread>

#include "engine/config.h"
#include "engine/config_fields.h"
#include "engine/engine.h"
#include "server/health_probe.h"
#include "server/inference_service.h"
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

// Blocks until SIGINT or SIGTERM arrives; returns its number.
int WaitForSignal() {
  unsigned char b = 0;
  while (read(g_signal_pipe[0], &b, 1) != 1) {
  }
  return b;
}

constexpr const char* kUsage =
    "usage: inferd --config FILE [--listen HOST:PORT] [--metrics-listen HOST:PORT|\"\"]\n"
    "       inferd --config-reference    (every config key as a markdown table)\n"
    "       inferd plan --config FILE [--gpu-memory-gib N]    (the cuda memory plan, without starting)\n"
    "       inferd health-probe [--address HOST:PORT]    (exit 0 when the server there is SERVING)";

int Run(int argc, char** argv) {
  std::string config_path, listen;
  std::optional<std::string> metrics_listen;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--config" || arg == "--listen") && i + 1 < argc) {
      (arg == "--config" ? config_path : listen) = argv[++i];
    } else if (arg == "--metrics-listen" && i + 1 < argc) {
      metrics_listen = argv[++i];
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
  if (!listen.empty() || metrics_listen) {
    if (!listen.empty()) config->server.listen = listen;
    if (metrics_listen) config->server.metrics_listen = *metrics_listen;
    auto checked = inferd::ParseConfig(inferd::ConfigToYaml(*config));
    if (!checked.ok()) {
      std::cerr << "inferd: --listen / --metrics-listen: " << checked.status().message() << "\n";
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

  // Request preparation (parsing, chat rendering, tokenizing) gets half the cores, at least two threads.
  const int request_workers = std::max(2, static_cast<int>(std::thread::hardware_concurrency() / 2));
  inferd::InferenceService service({.max_request_bytes = config->server.max_request_bytes}, request_workers);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config->server.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "inferd: cannot listen on server.listen = '" << config->server.listen << "'\n";
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus(false);
  std::unique_ptr<inferd::Metrics> metrics;
  if (!config->server.metrics_listen.empty()) {
    auto started = inferd::Metrics::Start(config->server.metrics_listen);
    if (!started.ok()) {
      std::cerr << "inferd: " << started.status().message() << "\n";
      server->Shutdown(std::chrono::system_clock::now());
      return 2;
    }
    metrics = *std::move(started);
    service.SetMetrics(metrics.get());
    spdlog::info("metrics on {} at /metrics", config->server.metrics_listen);
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
  service.SetEngine(live);
  health->SetServingStatus(true);  // after the engine's warm-up step
  inferd::Liveness liveness(live, config->server.liveness_timeout_s,
                            [health](bool serving) { health->SetServingStatus(serving); });
  spdlog::info("ready: model '{}' on the {} backend, max_model_len {}", live->model().name, live->backend_name(),
               live->max_model_len());

  const int sig = WaitForSignal();
  spdlog::info("signal {}: draining (up to {} s)", sig, config->server.drain_timeout_s);
  // A second signal while draining ends the process at once.
  std::thread([] {
    const int again = WaitForSignal();
    spdlog::warn("signal {} again: exiting now without finishing the drain (exit code {})", again, 128 + again);
    spdlog::default_logger()->flush();
    std::_Exit(128 + again);
  }).detach();
  liveness.Stop();
  health->SetServingStatus(false);
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
  service.SetEngine(nullptr);
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
