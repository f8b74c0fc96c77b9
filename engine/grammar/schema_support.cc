#include "engine/grammar/schema_support.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

using Json = nlohmann::json;

constexpr const char* kNotEnforced[] = {
    "not", "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas"};
// Keywords whose value is one schema, a map of named schemas, or a list of schemas.
constexpr const char* kOneSchema[] = {"items",         "additionalProperties", "additionalItems",
                                      "propertyNames", "unevaluatedItems",     "unevaluatedProperties"};
constexpr const char* kNamedSchemas[] = {"properties", "patternProperties", "$defs", "definitions"};
constexpr const char* kSchemaLists[] = {"anyOf", "oneOf", "allOf", "prefixItems", "items"};

std::string Escape(const std::string& name) {  // a JSON pointer's reference token
  std::string out;
  for (char ch : name) out += ch == '~' ? "~0" : ch == '/' ? "~1" : std::string(1, ch);
  return out;
}

// The first keyword of `s` (at `at`) or below it that the grammar cannot enforce, as "keyword at pointer".
std::optional<std::string> FirstUnenforced(const Json& s, const std::string& at) {
  if (!s.is_object()) return std::nullopt;  // true, false: nothing to enforce
  for (const char* k : kNotEnforced) {
    if (s.contains(k)) return absl::StrCat(k, " at ", at.empty() ? "/" : at);
  }
  if (s.contains("uniqueItems") && s["uniqueItems"] == true)
    return absl::StrCat("uniqueItems at ", at.empty() ? "/" : at);
  if (s.contains("multipleOf")) {
    const bool integer = s.contains("type") && s["type"] == "integer" && s["multipleOf"].is_number_integer();
    if (!integer) return absl::StrCat("multipleOf on a number at ", at.empty() ? "/" : at);
  }
  if ((s.contains("pattern") || s.contains("format")) && (s.contains("minLength") || s.contains("maxLength"))) {
    return absl::StrCat("minLength/maxLength beside a ", s.contains("pattern") ? "pattern" : "format", " at ",
                        at.empty() ? "/" : at, " (put the length in the pattern)");
  }
  for (const char* k : kOneSchema) {
    if (s.contains(k) && s[k].is_object()) {
      if (auto found = FirstUnenforced(s[k], at + "/" + k)) return found;
    }
  }
  for (const char* k : kNamedSchemas) {
    if (!s.contains(k) || !s[k].is_object()) continue;
    for (const auto& [name, sub] : s[k].items()) {
      if (auto found = FirstUnenforced(sub, at + "/" + k + "/" + Escape(name))) return found;
    }
  }
  for (const char* k : kSchemaLists) {
    if (!s.contains(k) || !s[k].is_array()) continue;
    for (size_t i = 0; i < s[k].size(); ++i) {
      if (auto found = FirstUnenforced(s[k][i], absl::StrCat(at, "/", k, "/", i))) return found;
    }
  }
  return std::nullopt;
}

}  // namespace

absl::Status CheckEnforceable(std::string_view schema_text, std::string_view field) {
  const Json schema = Json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::OkStatus();  // the compiler says what is wrong with it
  const std::optional<std::string> found = FirstUnenforced(schema, "");
  if (!found) return absl::OkStatus();
  std::string where = *found;
  if (where.size() > 120) where = where.substr(0, 117) + "...";
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(field), ": ", where,
      " cannot be enforced while generating (the answer could break it); allowed: JSON Schema without not, "
      "if/then/else, contains, dependentRequired, dependentSchemas, uniqueItems: true, multipleOf on numbers, or "
      "minLength/maxLength beside a pattern or format"));
}

}  // namespace inferd
