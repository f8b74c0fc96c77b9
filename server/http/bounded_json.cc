#include "server/http/bounded_json.h"

#include "absl/strings/str_cat.h"

namespace inferd {
namespace {

using json = nlohmann::json;

// The counting pass: a SAX handler that builds nothing and stops the parser at the first limit passed.
class ShapeCheck {
 public:
  explicit ShapeCheck(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(json::number_integer_t) { return Value(); }
  bool number_unsigned(json::number_unsigned_t) { return Value(); }
  bool number_float(json::number_float_t, const std::string&) { return Value(); }
  bool string(std::string&) { return Value(); }
  bool binary(json::binary_t&) { return Value(); }
  bool start_object(size_t) { return Open(); }
  bool end_object() { return Close(); }
  bool start_array(size_t) { return Open(); }
  bool end_array() { return Close(); }
  bool key(std::string&) {
    if (++keys_ <= limits_.max_keys) return true;
    failure_ = absl::StrCat("more than ", limits_.max_keys, " object members");
    return false;
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception&) {
    failure_ = absl::StrCat("not valid JSON (at byte ", position > 0 ? position - 1 : 0, ")");
    return false;
  }

  const std::string& failure() const { return failure_; }

 private:
  bool Value() {
    if (++values_ <= limits_.max_values) return true;
    failure_ = absl::StrCat("more than ", limits_.max_values, " values");
    return false;
  }
  bool Open() {
    if (++depth_ > limits_.max_depth) {
      failure_ = absl::StrCat("nested deeper than ", limits_.max_depth, " levels");
      return false;
    }
    return Value();
  }
  bool Close() {
    --depth_;
    return true;
  }

  const JsonLimits& limits_;
  int depth_ = 0;
  int64_t values_ = 0;
  int64_t keys_ = 0;
  std::string failure_;
};

void PreviewInto(const json& v, size_t budget, int depth, std::string* out, bool* cut) {
  if (out->size() >= budget) {
    *cut = true;
    return;
  }
  const auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  switch (v.type()) {
    case json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      const size_t room = budget - out->size();
      if (s.size() > room) *cut = true;
      *out += dump(json(s.substr(0, room)));
      return;
    }
    case json::value_t::array:
    case json::value_t::object: {
      const bool object = v.is_object();
      if (depth >= 8) {
        *out += object ? "{...}" : "[...]";
        return;
      }
      *out += object ? '{' : '[';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (out->size() >= budget) {
          *cut = true;
          return;
        }
        if (!first) *out += ',';
        first = false;
        if (object) *out += dump(json(it.key().substr(0, budget))) + ':';
        PreviewInto(*it, budget, depth + 1, out, cut);
      }
      *out += object ? '}' : ']';
      return;
    }
    default:
      *out += dump(v);
  }
}

}  // namespace

absl::StatusOr<json> ParseBoundedJson(std::string_view text, const std::string& what, const JsonLimits& limits) {
  if (text.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds a NUL byte; allowed: one JSON value"));
  }
  ShapeCheck check(limits);
  if (!json::sax_parse(text, &check, json::input_format_t::json, /*strict=*/true)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", check.failure(),
                                                   "; allowed: one JSON value, nested at most ", limits.max_depth,
                                                   " levels, at most ", limits.max_values, " values"));
  }
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  return parsed;
}

std::string Preview(const json& value, size_t max_chars) {
  std::string out;
  bool cut = false;
  PreviewInto(value, max_chars, 0, &out, &cut);
  if (cut || out.size() > max_chars) {
    out.resize(std::min(out.size(), max_chars > 3 ? max_chars - 3 : 0));
    out += "...";
  }
  return out;
}

std::string Preview(std::string_view text, size_t max_chars) {
  return Preview(json(std::string(text.substr(0, max_chars + 1))), max_chars);
}

}  // namespace inferd
