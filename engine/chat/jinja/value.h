// Values of the Jinja subset that chat templates use: undefined, none, bool, int, float, string, list and
// dict (insertion-ordered, shared by reference like Python's, which `namespace()` relies on).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;

  static Value None() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value Bool(bool x) {
    Value v;
    v.kind = Kind::kBool;
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v;
    v.kind = Kind::kInt;
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v;
    v.kind = Kind::kFloat;
    v.f = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v;
    v.kind = Kind::kString;
    v.s = std::move(x);
    return v;
  }
  static Value MakeList(List items = {}) {
    Value v;
    v.kind = Kind::kList;
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value MakeDict(Dict items = {}) {
    Value v;
    v.kind = Kind::kDict;
    v.dict = std::make_shared<Dict>(std::move(items));
    return v;
  }

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(kind == Kind::kBool ? b : i); }

  bool Truthy() const;
  // The dict entry for key, or nullptr.
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value v);
};

const char* KindName(Value::Kind kind);
bool Equal(const Value& a, const Value& b);
// What `{{ v }}` prints: strings as they are, others as Python's str() would.
std::string ToOutput(const Value& v);
// Python repr(): quoted strings, as they appear inside a printed list or dict.
std::string Repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent) with Python's separators; indent < 0 is one line.
absl::StatusOr<std::string> ToJson(const Value& v, int indent);
// JSON text as the value json.loads would give a template (objects keep their keys' order). Text that is not JSON
// is INVALID_ARGUMENT.
absl::StatusOr<Value> FromJson(const std::string& text);

}  // namespace inferd::jinja
