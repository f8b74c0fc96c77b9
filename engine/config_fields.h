// Every config key: section, name, type, allowed values and one line of doc; its default is the member initializer
// of its struct in engine/config.h (the table shows it, read from a default-constructed Config). The
// parser, the validator, the effective-config dump and the README's reference all read this table.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/config.h"
#include "yaml-cpp/yaml.h"

namespace inferd {

struct ConfigField {
  std::string section;  // "model", "engine", "scheduler", "server"
  std::string key;
  std::string default_text;  // as the README shows it
  std::string allowed;       // as the README and error messages show it
  std::string doc;
  // Reads the YAML value into the config, checking its type and range; the message names the key.
  std::function<absl::Status(const YAML::Node&, Config*)> read;
  // The current value as YAML, for the effective-config dump.
  std::function<void(const Config&, YAML::Emitter*)> write;

  std::string name() const { return section + "." + key; }
};

const std::vector<ConfigField>& ConfigFields();

// The README's reference table (markdown), made from ConfigFields().
std::string ConfigReferenceMarkdown();

// server.listen: HOST:PORT with PORT in 0..65535.
absl::Status CheckListenAddress(const std::string& listen);

}  // namespace inferd
