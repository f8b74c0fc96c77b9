#include "engine/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/config_fields.h"
#include "engine/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace inferd {
namespace {

constexpr const char* kSections[] = {"model", "engine", "scheduler", "server", "kv_events", "speculative"};

// Cross-field rules; each key's own type and range were checked as it was read.
absl::Status Validate(const Config& c) {
  if (c.model.path.empty()) return absl::InvalidArgumentError("config: model.path is required (a model directory)");
  if (c.scheduler.max_num_batched_tokens < c.scheduler.max_num_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: scheduler.max_num_batched_tokens = ", c.scheduler.max_num_batched_tokens,
                     " is out of range; allowed: scheduler.max_num_seqs (", c.scheduler.max_num_seqs, ") .. 1048576"));
  }
  if (c.scheduler.long_prefill_chunk > c.scheduler.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: scheduler.long_prefill_chunk = ", c.scheduler.long_prefill_chunk,
        " is out of range; allowed: 0..scheduler.max_num_batched_tokens (", c.scheduler.max_num_batched_tokens, ")"));
  }
  if (!c.server.metrics_listen.empty()) {
    if (absl::Status st = CheckListenAddress(c.server.metrics_listen); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config: server.metrics_listen = '", c.server.metrics_listen,
                                                     "' is not HOST:PORT with PORT 0..65535 (or empty for off)"));
    }
  }
  if (!c.server.http_listen.empty()) {
    if (absl::Status st = CheckListenAddress(c.server.http_listen); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config: server.http_listen = '", c.server.http_listen,
                                                     "' is not HOST:PORT with PORT 0..65535 (or empty for off)"));
    }
  }
  if (c.server.tls_cert_file.empty() != c.server.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "config: server.tls_cert_file and server.tls_key_file go together; allowed: both set, or neither");
  }
  if (!c.server.tls_client_ca_file.empty() && c.server.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "config: server.tls_client_ca_file needs server.tls_cert_file and server.tls_key_file (mutual TLS is TLS)");
  }
  if (c.speculative.ngram_min > c.speculative.ngram_max) {
    return absl::InvalidArgumentError(absl::StrCat("config: speculative.ngram_min = ", c.speculative.ngram_min,
                                                   " is out of range; allowed: 1..speculative.ngram_max (",
                                                   c.speculative.ngram_max, ")"));
  }
  return CheckListenAddress(c.server.listen);
}

absl::StatusOr<std::string> KeyOf(const YAML::Node& key, const std::string& where) {
  try {
    return key.as<std::string>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(absl::StrCat("config: a key in ", where, " is not a plain name"));
  }
}

absl::Status ReadSection(const std::string& section, const YAML::Node& node, Config* c) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return absl::InvalidArgumentError(absl::StrCat("config: '", section, "' must be a mapping"));
  std::vector<std::string> allowed;
  for (const ConfigField& f : ConfigFields()) {
    if (f.section == section) allowed.push_back(f.key);
  }
  std::set<std::string> seen;
  for (const auto& kv : node) {
    INFERD_ASSIGN_OR_RETURN(const std::string key, KeyOf(kv.first, section));
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("config: ", section, ".", key, " is given twice"));
    }
    const auto field = std::find_if(ConfigFields().begin(), ConfigFields().end(),
                                    [&](const ConfigField& f) { return f.section == section && f.key == key; });
    if (field == ConfigFields().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: unknown key '", section, ".", key, "'; allowed: ", absl::StrJoin(allowed, ", ")));
    }
    INFERD_RETURN_IF_ERROR(field->read(kv.second, c));
  }
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
  if (!root.IsNull()) {
    if (!root.IsMap()) return absl::InvalidArgumentError("config: the document must be a mapping of sections");
    std::set<std::string> seen;
    for (const auto& kv : root) {
      INFERD_ASSIGN_OR_RETURN(const std::string section, KeyOf(kv.first, "the document"));
      if (std::find(std::begin(kSections), std::end(kSections), section) == std::end(kSections)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: unknown key '", section, "'; allowed: ", absl::StrJoin(kSections, ", ")));
      }
      if (!seen.insert(section).second) {
        return absl::InvalidArgumentError(absl::StrCat("config: section '", section, "' is given twice"));
      }
      INFERD_RETURN_IF_ERROR(ReadSection(section, kv.second, &c));
    }
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
  for (const char* section : kSections) {
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const ConfigField& f : ConfigFields()) {
      if (f.section != section) continue;
      out << YAML::Key << f.key << YAML::Value;
      f.write(c, &out);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return out.c_str();
}

bool IsConfigError(const absl::Status& status) {
  return !status.ok() && absl::StartsWith(status.message(), "config: ");
}

}  // namespace inferd
