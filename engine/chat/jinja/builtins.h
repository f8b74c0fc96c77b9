// The filters, tests, methods and global functions of the Jinja subset.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/jinja/value.h"

namespace inferd::jinja {

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Positional argument i, else the keyword `name`, else `fallback`.
  Value Get(size_t i, const std::string& name, Value fallback = Value()) const;
};

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Args& args);
// `obj.name(args)` for the string, dict and list methods templates use.
absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, const Args& args);
// Global functions: range, namespace, dict, strftime_now, raise_exception.
absl::StatusOr<Value> CallGlobal(const std::string& name, const Args& args);
bool IsGlobalFunction(const std::string& name);

}  // namespace inferd::jinja
