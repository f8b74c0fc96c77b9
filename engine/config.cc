#include "engine/config.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace inferd {
namespace {

absl::Status CheckKeys(const YAML::Node& node, const std::string& section, const std::set<std::string>& allowed) {
  if (!node.IsMap()) return absl::InvalidArgumentError(absl::StrCat("config: '", section, "' must be a mapping"));
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (!allowed.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("config: unknown key '", section.empty() ? "" : section + ".", key,
                                                     "'; allowed: ", absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Read(const YAML::Node& node, const std::string& section, const char* key, T* out) {
  const YAML::Node value = node[key];
  if (!value) return absl::OkStatus();
  try {
    *out = value.as<T>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: ", section, ".", key, " has value '", YAML::Dump(value), "' of the wrong type"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status InRange(const std::string& key, T value, T lo, T hi) {
  if (!(value >= lo && value <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: ", key, " = ", value, " is out of range; allowed: [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const Config& c) {
  if (c.model.path.empty()) return absl::InvalidArgumentError("config: model.path is required (a model directory)");
  INFERD_RETURN_IF_ERROR(InRange("model.max_model_len", c.model.max_model_len, 0, 1 << 24));
  if (c.engine.backend != "auto" && c.engine.backend != "cpu" && c.engine.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("config: engine.backend = '", c.engine.backend, "' is not allowed; allowed: auto, cpu, cuda"));
  }
  if (c.engine.dtype != "auto" && c.engine.dtype != "bfloat16" && c.engine.dtype != "float16") {
    return absl::InvalidArgumentError(
        absl::StrCat("config: engine.dtype = '", c.engine.dtype, "' is not allowed; allowed: auto, bfloat16, float16"));
  }
  INFERD_RETURN_IF_ERROR(InRange("engine.block_size", c.engine.block_size, 1, 256));
  INFERD_RETURN_IF_ERROR(InRange("engine.num_blocks", c.engine.num_blocks, 0, 1 << 24));
  if (!(c.engine.gpu_memory_utilization > 0 && c.engine.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: engine.gpu_memory_utilization = ", c.engine.gpu_memory_utilization,
                     " is out of range; allowed: (0, 1]"));
  }
  if (!(c.engine.cpu_kv_cache_gib > 0 && c.engine.cpu_kv_cache_gib <= 1024)) {
    return absl::InvalidArgumentError(absl::StrCat("config: engine.cpu_kv_cache_gib = ", c.engine.cpu_kv_cache_gib,
                                                   " is out of range; allowed: (0, 1024]"));
  }
  INFERD_RETURN_IF_ERROR(InRange("engine.num_threads", c.engine.num_threads, 0, 1024));
  INFERD_RETURN_IF_ERROR(InRange("scheduler.max_num_seqs", c.scheduler.max_num_seqs, 1, 4096));
  INFERD_RETURN_IF_ERROR(InRange("scheduler.max_num_batched_tokens", c.scheduler.max_num_batched_tokens,
                                 c.scheduler.max_num_seqs, 1 << 20));
  INFERD_RETURN_IF_ERROR(InRange("scheduler.max_queue", c.scheduler.max_queue, 1, 1000000));
  if (c.server.listen.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: server.listen = '", c.server.listen, "' is not allowed; expected HOST:PORT"));
  }
  INFERD_RETURN_IF_ERROR(InRange("server.drain_timeout_s", c.server.drain_timeout_s, 0.0, 3600.0));
  INFERD_RETURN_IF_ERROR(InRange<int64_t>("server.max_request_bytes", c.server.max_request_bytes, 1, 64 << 20));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: not valid YAML: ", e.what()));
  }
  Config c;
  if (root.IsNull()) {
    INFERD_RETURN_IF_ERROR(Validate(c));
    return c;
  }
  INFERD_RETURN_IF_ERROR(CheckKeys(root, "", {"model", "engine", "scheduler", "server"}));
  if (const auto n = root["model"]) {
    INFERD_RETURN_IF_ERROR(CheckKeys(n, "model", {"path", "name", "max_model_len"}));
    INFERD_RETURN_IF_ERROR(Read(n, "model", "path", &c.model.path));
    INFERD_RETURN_IF_ERROR(Read(n, "model", "name", &c.model.name));
    INFERD_RETURN_IF_ERROR(Read(n, "model", "max_model_len", &c.model.max_model_len));
  }
  if (const auto n = root["engine"]) {
    INFERD_RETURN_IF_ERROR(CheckKeys(
        n, "engine",
        {"backend", "dtype", "block_size", "num_blocks", "gpu_memory_utilization", "cpu_kv_cache_gib", "num_threads"}));
    INFERD_RETURN_IF_ERROR(Read(n, "engine", "backend", &c.engine.backend));
    INFERD_RETURN_IF_ERROR(Read(n, "engine", "dtype", &c.engine.dtype));
    INFERD_RETURN_IF_ERROR(Read(n, "engine", "block_size", &c.engine.block_size));
    INFERD_RETURN_IF_ERROR(Read(n, "engine", "num_blocks", &c.engine.num_blocks));
    INFERD_RETURN_IF_ERROR(Read(n, "engine", "gpu_memory_utilization", &c.engine.gpu_memory_utilization));
    INFERD_RETURN_IF_ERROR(Read(n, "engine", "cpu_kv_cache_gib", &c.engine.cpu_kv_cache_gib));
    INFERD_RETURN_IF_ERROR(Read(n, "engine", "num_threads", &c.engine.num_threads));
  }
  if (const auto n = root["scheduler"]) {
    INFERD_RETURN_IF_ERROR(CheckKeys(n, "scheduler", {"max_num_seqs", "max_num_batched_tokens", "max_queue"}));
    INFERD_RETURN_IF_ERROR(Read(n, "scheduler", "max_num_seqs", &c.scheduler.max_num_seqs));
    INFERD_RETURN_IF_ERROR(Read(n, "scheduler", "max_num_batched_tokens", &c.scheduler.max_num_batched_tokens));
    INFERD_RETURN_IF_ERROR(Read(n, "scheduler", "max_queue", &c.scheduler.max_queue));
  }
  if (const auto n = root["server"]) {
    INFERD_RETURN_IF_ERROR(CheckKeys(n, "server", {"listen", "drain_timeout_s", "max_request_bytes"}));
    INFERD_RETURN_IF_ERROR(Read(n, "server", "listen", &c.server.listen));
    INFERD_RETURN_IF_ERROR(Read(n, "server", "drain_timeout_s", &c.server.drain_timeout_s));
    INFERD_RETURN_IF_ERROR(Read(n, "server", "max_request_bytes", &c.server.max_request_bytes));
  }
  INFERD_RETURN_IF_ERROR(Validate(c));
  return c;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config: cannot open '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str());
}

std::string ConfigToYaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap << YAML::Key << "path" << YAML::Value << c.model.path
      << YAML::Key << "name" << YAML::Value << c.model.name << YAML::Key << "max_model_len" << YAML::Value
      << c.model.max_model_len << YAML::EndMap;
  out << YAML::Key << "engine" << YAML::Value << YAML::BeginMap << YAML::Key << "backend" << YAML::Value
      << c.engine.backend << YAML::Key << "dtype" << YAML::Value << c.engine.dtype << YAML::Key << "block_size"
      << YAML::Value << c.engine.block_size << YAML::Key << "num_blocks" << YAML::Value << c.engine.num_blocks
      << YAML::Key << "gpu_memory_utilization" << YAML::Value << c.engine.gpu_memory_utilization << YAML::Key
      << "cpu_kv_cache_gib" << YAML::Value << c.engine.cpu_kv_cache_gib << YAML::Key << "num_threads" << YAML::Value
      << c.engine.num_threads << YAML::EndMap;
  out << YAML::Key << "scheduler" << YAML::Value << YAML::BeginMap << YAML::Key << "max_num_seqs" << YAML::Value
      << c.scheduler.max_num_seqs << YAML::Key << "max_num_batched_tokens" << YAML::Value
      << c.scheduler.max_num_batched_tokens << YAML::Key << "max_queue" << YAML::Value << c.scheduler.max_queue
      << YAML::EndMap;
  out << YAML::Key << "server" << YAML::Value << YAML::BeginMap << YAML::Key << "listen" << YAML::Value
      << c.server.listen << YAML::Key << "drain_timeout_s" << YAML::Value << c.server.drain_timeout_s << YAML::Key
      << "max_request_bytes" << YAML::Value << c.server.max_request_bytes << YAML::EndMap;
  out << YAML::EndMap;
  return out.c_str();
}

}  // namespace inferd
