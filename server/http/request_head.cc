#include "server/http/request_head.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace inferd {
namespace {

RequestHeadCheck Refuse(int status, std::string message) {
  return {.status = status, .message = std::move(message)};
}

// Fields whose second line would make the request ambiguous (which one did a proxy before us read?).
constexpr std::string_view kSingle[] = {"host", "content-length", "authorization", "content-type", "expect"};

// The origin form of `target`, or empty when it is neither origin nor absolute form.
std::string OriginForm(std::string_view target) {
  if (!target.empty() && target[0] == '/') return std::string(target);
  for (std::string_view scheme : {"http://", "https://"}) {
    if (absl::StartsWithIgnoreCase(absl::string_view(target.data(), target.size()),
                                   absl::string_view(scheme.data(), scheme.size()))) {
      std::string_view rest = target.substr(scheme.size());
      const size_t path = rest.find_first_of("/?");
      if (path == 0) return "";  // no authority
      if (path == std::string_view::npos) return "/";
      return rest[path] == '/' ? std::string(rest.substr(path)) : "/" + std::string(rest.substr(path));
    }
  }
  return "";
}

}  // namespace

RequestHeadCheck CheckRequestHead(std::string_view method, std::string_view target, int version,
                                  const std::vector<std::pair<std::string_view, std::string_view>>& fields) {
  if (version != 11 && version != 10) {
    return Refuse(505, "only HTTP/1.1 and HTTP/1.0 are served");
  }
  int counts[std::size(kSingle)] = {};
  std::vector<std::string> codings;  // every Transfer-Encoding line's codings, in order
  std::string_view expect;
  for (const auto& [raw_name, value] : fields) {
    const std::string name = absl::AsciiStrToLower(absl::string_view(raw_name.data(), raw_name.size()));
    for (size_t i = 0; i < std::size(kSingle); ++i) {
      if (name == kSingle[i] && ++counts[i] > 1) {
        return Refuse(400, "the header " + std::string(kSingle[i]) + " is sent more than once; allowed: once");
      }
    }
    if (name == "content-length" &&
        (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string_view::npos)) {
      // RFC 9112 §6.3: an invalid length (a list such as "2, 2" included) is unrecoverable.
      return Refuse(400, "the header Content-Length is not a decimal number; allowed: 1 to 18 digits");
    }
    if (name == "transfer-encoding") {
      for (absl::string_view c : absl::StrSplit(absl::string_view(value.data(), value.size()), ',')) {
        codings.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(c)));
      }
    } else if (name == "expect") {
      const absl::string_view stripped = absl::StripAsciiWhitespace(absl::string_view(value.data(), value.size()));
      expect = std::string_view(stripped.data(), stripped.size());
    }
  }
  const bool has_length = counts[1] > 0;
  if (!codings.empty()) {
    // RFC 9112 §6.1 and §6.3: with a Content-Length too, or in HTTP/1.0, the framing is in doubt.
    if (has_length) {
      return Refuse(400, "Transfer-Encoding and Content-Length are both sent; allowed: one of them");
    }
    if (version == 10) return Refuse(400, "Transfer-Encoding in an HTTP/1.0 request is not allowed");
    if (codings.back() != "chunked") {
      return Refuse(400, "the last transfer coding is not chunked; allowed: Transfer-Encoding: chunked");
    }
    if (codings.size() > 1) return Refuse(501, "transfer codings other than chunked are not implemented");
  }
  if (version == 11 && counts[0] == 0) return Refuse(400, "the header Host is missing; HTTP/1.1 requires it");
  RequestHeadCheck ok;
  if (!expect.empty()) {
    if (!absl::EqualsIgnoreCase(absl::string_view(expect.data(), expect.size()), "100-continue")) {
      return Refuse(417, "the only expectation served is Expect: 100-continue");
    }
    ok.expect_continue = version == 11;
  }
  if (method == "CONNECT" || target == "*") {
    return Refuse(405, std::string(method.substr(0, 16)) + " is not served; allowed: GET, HEAD, POST");
  }
  ok.target = OriginForm(target);
  if (ok.target.empty()) return Refuse(400, "the request target is neither a path nor an absolute http(s) URL");
  return ok;
}

}  // namespace inferd
