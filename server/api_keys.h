// API keys for both front ends (server.api_keys_file): one key per line, blank lines and lines starting with '#'
// skipped, reloaded on SIGHUP. Keys are kept as SHA-256 digests and a presented key is compared with every one
// of them in full, so neither the time taken nor the log tells anything about a key.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd {

class ApiKeys {
 public:
  // Fails naming server.api_keys_file when the file cannot be read or holds no key.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(const std::string& path);
  // Reads the file again; on failure the keys stay as they were and the error says why.
  absl::Status Reload();
  bool Check(std::string_view presented) const;
  size_t size() const;

 private:
  using Digest = std::array<unsigned char, 32>;
  explicit ApiKeys(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::vector<Digest>> Read(const std::string& path);

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<Digest>> digests_;
};

// The key of an "Authorization: Bearer KEY" header value (also gRPC's authorization metadata); nullopt otherwise.
std::optional<std::string_view> BearerToken(std::string_view authorization);

}  // namespace inferd
