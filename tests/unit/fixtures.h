// Paths of committed fixtures for the engine tests.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"

namespace inferd::testing {

inline std::string SourcePath(const std::string& relative) {
  return std::string(INFERD_SOURCE_DIR) + "/" + relative;
}
inline std::string ModelDir(const std::string& name) {
  return SourcePath("tests/fixtures/models/" + name);
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline const char* kTestModels[] = {"llama2-tiny", "llama3-tiny", "mistral-tiny", "qwen2-tiny"};

}  // namespace inferd::testing
