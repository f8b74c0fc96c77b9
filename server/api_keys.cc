#include "server/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace inferd {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<std::vector<ApiKeys::Digest>> ApiKeys::Read(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("server.api_keys_file = '", path, "' cannot be read"));
  std::vector<Digest> digests;
  std::string line;
  while (std::getline(in, line)) {
    const std::string_view key = Trim(line);
    if (key.empty() || key.front() == '#') continue;
    Digest d;
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), d.data());
    digests.push_back(d);
  }
  if (digests.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("server.api_keys_file = '", path, "' holds no key; allowed: one key per line"));
  }
  return digests;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(const std::string& path) {
  auto digests = Read(path);
  if (!digests.ok()) return digests.status();
  std::unique_ptr<ApiKeys> keys(new ApiKeys(path));
  keys->digests_ = std::make_shared<const std::vector<Digest>>(*std::move(digests));
  return keys;
}

absl::Status ApiKeys::Reload() {
  auto digests = Read(path_);
  if (!digests.ok()) return digests.status();
  std::lock_guard<std::mutex> lock(mu_);
  digests_ = std::make_shared<const std::vector<Digest>>(*std::move(digests));
  return absl::OkStatus();
}

bool ApiKeys::Check(std::string_view presented) const {
  std::shared_ptr<const std::vector<Digest>> digests;
  {
    std::lock_guard<std::mutex> lock(mu_);
    digests = digests_;
  }
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(presented.data()), presented.size(), d.data());
  bool found = false;
  for (const Digest& k : *digests) found |= CRYPTO_memcmp(d.data(), k.data(), d.size()) == 0;
  return found;
}

size_t ApiKeys::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return digests_->size();
}

std::optional<std::string_view> BearerToken(std::string_view authorization) {
  authorization = Trim(authorization);
  if (authorization.size() < 7 || absl::AsciiStrToLower(std::string(authorization.substr(0, 7))) != "bearer ") {
    return std::nullopt;
  }
  const std::string_view key = Trim(authorization.substr(7));
  if (key.empty()) return std::nullopt;
  return key;
}

}  // namespace inferd
