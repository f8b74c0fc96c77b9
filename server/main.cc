// inferd: serves a Llama-family model over gRPC. Usage: inferd --config FILE [--listen HOST:PORT]
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "engine/config.h"
#include "engine/engine.h"
#include "server/inference_service.h"
#include "spdlog/spdlog.h"

namespace {

constexpr const char* kUsage = "usage: inferd --config FILE [--listen HOST:PORT]";

int Run(int argc, char** argv) {
  std::string config_path, listen;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--config" || arg == "--listen") && i + 1 < argc) {
      (arg == "--config" ? config_path : listen) = argv[++i];
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
  if (!listen.empty()) {
    config->server.listen = listen;
    auto checked = inferd::ParseConfig(inferd::ConfigToYaml(*config));
    if (!checked.ok()) {
      std::cerr << "inferd: --listen: " << checked.status().message() << "\n";
      return 2;
    }
  }
  spdlog::info("effective config:\n{}", inferd::ConfigToYaml(*config));

  // Signals are taken by sigwait below, so every thread started from here on blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

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
  spdlog::info("listening on {} (port {}); loading the model", config->server.listen, port);

  auto engine = inferd::Engine::Create(*config);
  if (!engine.ok()) {
    std::cerr << "inferd: cannot start: " << engine.status().message() << "\n";
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  std::shared_ptr<inferd::Engine> live = std::move(*engine);
  service.SetEngine(live);
  health->SetServingStatus(true);
  spdlog::info("ready: model '{}' on the {} backend, max_model_len {}", live->model().name, live->backend_name(),
               live->max_model_len());

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: draining (up to {} s)", sig, config->server.drain_timeout_s);
  health->SetServingStatus(false);
  live->StartDraining();
  const auto drain_end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(config->server.drain_timeout_s * 1000));
  while (std::chrono::steady_clock::now() < drain_end) {
    const inferd::EngineStats s = live->Stats();
    if (s.running == 0 && s.waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // What still runs ends with UNAVAILABLE; then the server closes once those last writes are out.
  live->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  service.SetEngine(nullptr);
  live.reset();
  server->Wait();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return Run(argc, argv);
}
