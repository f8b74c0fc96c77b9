#include "engine/chat/jinja/value.h"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/json_depth.h"

namespace inferd::jinja {
namespace {

std::string FloatRepr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          *out += absl::StrFormat("\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

absl::Status Json(const Value& v, int indent, int depth, std::string* out) {
  if (depth > 64) return absl::InvalidArgumentError("tojson: value nested too deep");
  const std::string nl = indent < 0 ? "" : "\n" + std::string((depth + 1) * indent, ' ');
  const std::string close = indent < 0 ? "" : "\n" + std::string(depth * indent, ' ');
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      break;
    case Value::Kind::kBool:
      *out += v.b ? "true" : "false";
      break;
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      break;
    case Value::Kind::kFloat: {
      if (!std::isfinite(v.f)) return absl::InvalidArgumentError("tojson: non-finite float");
      *out += FloatRepr(v.f);
      break;
    }
    case Value::Kind::kString:
      JsonString(v.s, out);
      break;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        *out += "[]";
        break;
      }
      *out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        *out += k ? item_sep + nl : nl;
        auto s = Json((*v.list)[k], indent, depth + 1, out);
        if (!s.ok()) return s;
      }
      *out += close + "]";
      break;
    }
    case Value::Kind::kDict: {
      if (v.dict->empty()) {
        *out += "{}";
        break;
      }
      *out += "{";
      for (size_t k = 0; k < v.dict->size(); ++k) {
        *out += k ? item_sep + nl : nl;
        JsonString((*v.dict)[k].first, out);
        *out += ": ";
        auto s = Json((*v.dict)[k].second, indent, depth + 1, out);
        if (!s.ok()) return s;
      }
      *out += close + "}";
      break;
    }
  }
  return absl::OkStatus();
}

std::string PyStringRepr(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += absl::StrFormat("\\x%02x", c);
    else
      out.push_back(static_cast<char>(c));
  }
  out.push_back(q);
  return out;
}

}  // namespace

const char* KindName(Value::Kind k) {
  switch (k) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
  }
  return "?";
}

bool Value::Truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b;
    case Kind::kInt:
      return i != 0;
    case Kind::kFloat:
      return f != 0;
    case Kind::kString:
      return !s.empty();
    case Kind::kList:
      return !list->empty();
    case Kind::kDict:
      return !dict->empty();
  }
  return false;
}

const Value* Value::Find(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::Set(const std::string& key, Value v) {
  for (auto& [k, old] : *dict) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict->emplace_back(key, std::move(v));
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::kFloat || b.kind == Value::Kind::kFloat) return a.as_double() == b.as_double();
    return (a.kind == Value::Kind::kBool ? a.b : a.i) == (b.kind == Value::Kind::kBool ? b.b : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.Find(k);
        if (!o || !Equal(v, *o)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

std::string ToOutput(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return v.s;
    default:
      return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return FloatRepr(v.f);
    case Value::Kind::kString:
      return PyStringRepr(v.s);
    case Value::Kind::kList: {
      std::string s = "[";
      for (size_t k = 0; k < v.list->size(); ++k) s += (k ? ", " : "") + Repr((*v.list)[k]);
      return s + "]";
    }
    case Value::Kind::kDict: {
      std::string s = "{";
      for (size_t k = 0; k < v.dict->size(); ++k) {
        s += (k ? ", " : "") + PyStringRepr((*v.dict)[k].first) + ": " + Repr((*v.dict)[k].second);
      }
      return s + "}";
    }
  }
  return "";
}

absl::StatusOr<std::string> ToJson(const Value& v, int indent) {
  std::string out;
  auto s = Json(v, indent, 0, &out);
  if (!s.ok()) return s;
  return out;
}

namespace {

Value FromParsed(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(FromParsed(e));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [k, e] : j.items()) items.emplace_back(k, FromParsed(e));
      return Value::MakeDict(std::move(items));
    }
    default:
      return Value::None();
  }
}

}  // namespace

absl::StatusOr<Value> FromJson(const std::string& text) {
  if (JsonDepth(text) > kMaxJsonTextDepth) {
    return absl::InvalidArgumentError(absl::StrCat("nested deeper than ", kMaxJsonTextDepth, " levels"));
  }
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not JSON");
  return FromParsed(j);
}

}  // namespace inferd::jinja
