#include "engine/chat/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace inferd::jinja {
namespace {

absl::Status Error(const std::string& what) {
  return absl::InvalidArgumentError(what);
}

bool IsSpace(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto drop = [&](char c) {
    return chars.kind == Value::Kind::kString ? chars.s.find(c) != std::string::npos : IsSpace(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out += s.substr(pos, hit - pos) + to;
  }
  return out + s.substr(pos);
}

absl::StatusOr<std::string> NeedString(const Value& v, const std::string& what) {
  if (v.kind != Value::Kind::kString) return Error(absl::StrCat(what, " needs a string, got ", KindName(v.kind)));
  return v.s;
}

absl::StatusOr<Value> Length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: {
      int64_t n = 0;  // code points, as Python counts
      for (unsigned char c : v.s) n += (c & 0xC0) != 0x80;
      return Value::Int(n);
    }
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(v.list->size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.dict->size()));
    case Value::Kind::kUndefined:
      return Value::Int(0);
    default:
      return Error(absl::StrCat("length of a ", KindName(v.kind)));
  }
}

Value Items(const Value& d) {
  List items;
  for (const auto& [k, v] : *d.dict) items.push_back(Value::MakeList({Value::Str(k), v}));
  return Value::MakeList(std::move(items));
}

}  // namespace

Value Args::Get(size_t i, const std::string& name, Value fallback) const {
  if (i < positional.size()) return positional[i];
  for (const auto& [k, v] : keyword) {
    if (k == name) return v;
  }
  return fallback;
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args) {
  if (name == "trim") {
    INFERD_ASSIGN_OR_RETURN(std::string s, NeedString(v, "trim"));
    return Value::Str(Strip(s, args.Get(0, "chars"), true, true));
  }
  if (name == "length" || name == "count") return Length(v);
  if (name == "upper" || name == "lower") {
    INFERD_ASSIGN_OR_RETURN(std::string s, NeedString(v, name));
    for (char& c : s)
      c = name == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c));
    return Value::Str(s);
  }
  if (name == "capitalize") {
    INFERD_ASSIGN_OR_RETURN(std::string s, NeedString(v, name));
    for (size_t k = 0; k < s.size(); ++k)
      s[k] = k ? std::tolower(static_cast<unsigned char>(s[k])) : std::toupper(static_cast<unsigned char>(s[k]));
    return Value::Str(s);
  }
  if (name == "default" || name == "d") {
    const bool boolean = args.Get(1, "boolean", Value::Bool(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) return args.Get(0, "default_value", Value::Str(""));
    return v;
  }
  if (name == "tojson") {
    const Value indent = args.Get(0, "indent", Value::None());
    INFERD_ASSIGN_OR_RETURN(std::string s,
                            ToJson(v, indent.kind == Value::Kind::kInt ? static_cast<int>(indent.i) : -1));
    return Value::Str(s);
  }
  if (name == "string") return Value::Str(ToOutput(v));
  if (name == "safe") return v;
  if (name == "int") {
    if (v.kind == Value::Kind::kString) {
      try {
        return Value::Int(std::stoll(v.s));
      } catch (...) {
        return Value::Int(0);
      }
    }
    return Value::Int(v.is_number() ? static_cast<int64_t>(v.as_double()) : 0);
  }
  if (name == "float") return Value::Float(v.is_number() ? v.as_double() : 0.0);
  if (name == "abs") {
    if (v.kind == Value::Kind::kInt) return Value::Int(v.i < 0 ? -v.i : v.i);
    if (v.kind == Value::Kind::kFloat) return Value::Float(v.f < 0 ? -v.f : v.f);
    return Error("abs needs a number");
  }
  if (name == "first" || name == "last") {
    if (v.kind == Value::Kind::kList) {
      if (v.list->empty()) return Value();
      return name == "first" ? v.list->front() : v.list->back();
    }
    if (v.kind == Value::Kind::kString) {
      if (v.s.empty()) return Value();
      return Value::Str(std::string(1, name == "first" ? v.s.front() : v.s.back()));
    }
    return Error(absl::StrCat(name, " of a ", KindName(v.kind)));
  }
  if (name == "join") {
    if (v.kind != Value::Kind::kList) return Error(absl::StrCat("join of a ", KindName(v.kind)));
    const std::string sep = ToOutput(args.Get(0, "d", Value::Str("")));
    std::string out;
    for (size_t k = 0; k < v.list->size(); ++k) out += (k ? sep : "") + ToOutput((*v.list)[k]);
    return Value::Str(out);
  }
  if (name == "replace") {
    INFERD_ASSIGN_OR_RETURN(std::string s, NeedString(v, "replace"));
    return Value::Str(Replace(s, ToOutput(args.Get(0, "old")), ToOutput(args.Get(1, "new"))));
  }
  if (name == "list") {
    if (v.kind == Value::Kind::kList) return Value::MakeList(*v.list);
    if (v.kind == Value::Kind::kDict) {
      List keys;
      for (const auto& [k, x] : *v.dict) keys.push_back(Value::Str(k));
      return Value::MakeList(std::move(keys));
    }
    if (v.kind == Value::Kind::kString) {
      List chars;
      for (size_t k = 0; k < v.s.size();) {
        size_t n = 1;
        while (k + n < v.s.size() && (static_cast<unsigned char>(v.s[k + n]) & 0xC0) == 0x80) ++n;
        chars.push_back(Value::Str(v.s.substr(k, n)));
        k += n;
      }
      return Value::MakeList(std::move(chars));
    }
    return Error(absl::StrCat("list of a ", KindName(v.kind)));
  }
  if (name == "items") {
    if (v.kind != Value::Kind::kDict) return Error("items needs a dict");
    return Items(v);
  }
  if (name == "reverse") {
    if (v.kind == Value::Kind::kList) {
      List r(v.list->rbegin(), v.list->rend());
      return Value::MakeList(std::move(r));
    }
    INFERD_ASSIGN_OR_RETURN(std::string s, NeedString(v, "reverse"));
    return Value::Str(std::string(s.rbegin(), s.rend()));
  }
  if (name == "selectattr" || name == "rejectattr") {
    if (v.kind != Value::Kind::kList) return Error(absl::StrCat(name, " needs a list"));
    const std::string attr = ToOutput(args.Get(0, "attr"));
    const std::string test = args.positional.size() > 1 ? ToOutput(args.positional[1]) : "";
    Args test_args;
    for (size_t k = 2; k < args.positional.size(); ++k) test_args.positional.push_back(args.positional[k]);
    List out;
    for (const Value& item : *v.list) {
      const Value* a = item.Find(attr);
      const Value x = a ? *a : Value();
      bool ok = x.Truthy();
      if (!test.empty()) {
        INFERD_ASSIGN_OR_RETURN(ok, ApplyTest(test, x, test_args));
      }
      if (ok == (name == "selectattr")) out.push_back(item);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "map") {
    if (v.kind != Value::Kind::kList) return Error("map needs a list");
    const Value attr = args.Get(99, "attribute");
    List out;
    for (const Value& item : *v.list) {
      if (attr.kind == Value::Kind::kString) {
        const Value* a = item.Find(attr.s);
        out.push_back(a ? *a : Value());
      } else {
        INFERD_ASSIGN_OR_RETURN(Value m, ApplyFilter(ToOutput(args.Get(0, "filter")), item, Args{}));
        out.push_back(m);
      }
    }
    return Value::MakeList(std::move(out));
  }
  return Error(absl::StrCat("filter '", name, "' is not supported"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Args& args) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == K::kNone;
  if (name == "string") return v.kind == K::kString;
  if (name == "number") return v.kind == K::kInt || v.kind == K::kFloat;
  if (name == "integer") return v.kind == K::kInt;
  if (name == "float") return v.kind == K::kFloat;
  if (name == "boolean") return v.kind == K::kBool;
  if (name == "true") return v.kind == K::kBool && v.b;
  if (name == "false") return v.kind == K::kBool && !v.b;
  if (name == "mapping") return v.kind == K::kDict;
  if (name == "sequence") return v.kind == K::kList || v.kind == K::kString;
  if (name == "iterable") return v.kind == K::kList || v.kind == K::kString || v.kind == K::kDict;
  if (name == "callable") return false;
  if (name == "odd" || name == "even") {
    if (v.kind != K::kInt) return Error(absl::StrCat("test '", name, "' needs an integer"));
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "equalto" || name == "eq" || name == "sameas" || name == "==") return Equal(v, args.Get(0, "other"));
  if (name == "ne" || name == "!=") return !Equal(v, args.Get(0, "other"));
  if (name == "in") {
    const Value c = args.Get(0, "seq");
    if (c.kind == K::kList)
      return std::any_of(c.list->begin(), c.list->end(), [&](const Value& x) { return Equal(x, v); });
    if (c.kind == K::kString && v.kind == K::kString) return c.s.find(v.s) != std::string::npos;
    if (c.kind == K::kDict && v.kind == K::kString) return c.Find(v.s) != nullptr;
    return false;
  }
  return Error(absl::StrCat("test '", name, "' is not supported"));
}

absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, const Args& args) {
  if (obj.kind == Value::Kind::kString) {
    const std::string& s = obj.s;
    if (name == "strip") return Value::Str(Strip(s, args.Get(0, "chars"), true, true));
    if (name == "lstrip") return Value::Str(Strip(s, args.Get(0, "chars"), true, false));
    if (name == "rstrip") return Value::Str(Strip(s, args.Get(0, "chars"), false, true));
    if (name == "upper" || name == "lower" || name == "capitalize") return ApplyFilter(name, obj, Args{});
    if (name == "title") {
      std::string out = s;
      bool start = true;
      for (char& c : out) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c));
        c = alpha ? (start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)))
                  : c;
        start = !alpha;
      }
      return Value::Str(out);
    }
    if (name == "startswith" || name == "endswith") {
      INFERD_ASSIGN_OR_RETURN(std::string x, NeedString(args.Get(0, "prefix"), name));
      const bool hit = name == "startswith" ? s.rfind(x, 0) == 0
                                            : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      return Value::Bool(hit);
    }
    if (name == "replace") {
      INFERD_ASSIGN_OR_RETURN(std::string a, NeedString(args.Get(0, "old"), name));
      INFERD_ASSIGN_OR_RETURN(std::string b, NeedString(args.Get(1, "new"), name));
      return Value::Str(Replace(s, a, b));
    }
    if (name == "split") {
      const Value sep = args.Get(0, "sep", Value::None());
      List parts;
      if (sep.kind == Value::Kind::kString && !sep.s.empty()) {
        size_t pos = 0;
        for (size_t hit; (hit = s.find(sep.s, pos)) != std::string::npos; pos = hit + sep.s.size()) {
          parts.push_back(Value::Str(s.substr(pos, hit - pos)));
        }
        parts.push_back(Value::Str(s.substr(pos)));
      } else {
        size_t k = 0;
        while (k < s.size()) {
          while (k < s.size() && IsSpace(s[k])) ++k;
          size_t e = k;
          while (e < s.size() && !IsSpace(s[e])) ++e;
          if (e > k) parts.push_back(Value::Str(s.substr(k, e - k)));
          k = e;
        }
      }
      return Value::MakeList(std::move(parts));
    }
  }
  if (obj.kind == Value::Kind::kDict) {
    if (name == "items") return Items(obj);
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [k, v] : *obj.dict) out.push_back(name == "keys" ? Value::Str(k) : v);
      return Value::MakeList(std::move(out));
    }
    if (name == "get") {
      const Value* v = obj.Find(ToOutput(args.Get(0, "key")));
      return v ? *v : args.Get(1, "default", Value::None());
    }
  }
  return Error(absl::StrCat("method '", name, "' of a ", KindName(obj.kind), " is not supported"));
}

bool IsGlobalFunction(const std::string& name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "strftime_now" ||
         name == "raise_exception";
}

absl::StatusOr<Value> CallGlobal(const std::string& name, const Args& args) {
  if (name == "raise_exception") {
    return Error(absl::StrCat("the chat template refused the messages: ", ToOutput(args.Get(0, "message"))));
  }
  if (name == "namespace" || name == "dict") {
    Dict d;
    for (const auto& [k, v] : args.keyword) d.emplace_back(k, v);
    return Value::MakeDict(std::move(d));
  }
  if (name == "range") {
    for (const Value& a : args.positional) {
      if (a.kind != Value::Kind::kInt) return Error("range needs integers");
    }
    int64_t start = 0, stop = 0, step = 1;
    if (args.positional.size() == 1) stop = args.positional[0].i;
    if (args.positional.size() >= 2) start = args.positional[0].i, stop = args.positional[1].i;
    if (args.positional.size() == 3) step = args.positional[2].i;
    if (args.positional.empty() || args.positional.size() > 3 || step == 0)
      return Error("range(stop) or range(start, stop[, step])");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (out.size() >= 1000000) return Error("range is too long");
      out.push_back(Value::Int(k));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "strftime_now") {
    INFERD_ASSIGN_OR_RETURN(std::string fmt, NeedString(args.Get(0, "format"), name));
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return Value::Str(std::string(buf, n));
  }
  return Error(absl::StrCat("function '", name, "' is not supported"));
}

}  // namespace inferd::jinja
