#include "engine/chat/jinja/render.h"

#include <cmath>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja/builtins.h"
#include "engine/status_macros.h"

namespace inferd::jinja {
namespace {

constexpr size_t kMaxOutputBytes = 16u << 20;
constexpr int64_t kMaxLoopIterations = 1 << 20;

absl::Status Error(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

// Adds the line to errors raised by builtins.
absl::Status AtLine(int line, const absl::Status& s) {
  if (s.ok() || absl::StrContains(s.message(), "chat template line")) return s;
  return Error(line, std::string(s.message()));
}

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const Dict& globals) { scopes_.emplace_back(globals.begin(), globals.end()); }

  absl::Status Exec(const Body& body, Flow* flow) {
    for (const auto& st : body) {
      INFERD_RETURN_IF_ERROR(ExecOne(*st, flow));
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }
  std::string& out() { return out_; }

 private:
  absl::Status ExecOne(const Stmt& st, Flow* flow) {
    switch (st.kind) {
      case Stmt::Kind::kText:
        Emit(st.text);
        break;
      case Stmt::Kind::kOutput: {
        INFERD_ASSIGN_OR_RETURN(Value v, Eval(*st.expr));
        Emit(ToOutput(v));
        break;
      }
      case Stmt::Kind::kIf: {
        for (size_t k = 0; k < st.bodies.size(); ++k) {
          bool take = k >= st.conditions.size();
          if (!take) {
            INFERD_ASSIGN_OR_RETURN(Value c, Eval(*st.conditions[k]));
            take = c.Truthy();
          }
          if (take) return Exec(st.bodies[k], flow);
        }
        break;
      }
      case Stmt::Kind::kFor:
        return ExecFor(st);
      case Stmt::Kind::kSet: {
        INFERD_ASSIGN_OR_RETURN(Value v, Eval(*st.expr));
        if (st.targets.size() == 1) {
          scopes_.back()[st.targets[0]] = std::move(v);
        } else {
          Value* ns = Lookup(st.targets[0]);
          if (!ns || ns->kind != Value::Kind::kDict) {
            return Error(st.line, absl::StrCat("cannot set '", st.targets[1], "' on '", st.targets[0],
                                               "', which is not a namespace"));
          }
          ns->Set(st.targets[1], std::move(v));
        }
        break;
      }
      case Stmt::Kind::kBreak:
        *flow = Flow::kBreak;
        break;
      case Stmt::Kind::kContinue:
        *flow = Flow::kContinue;
        break;
      case Stmt::Kind::kBlock:
        return Exec(st.bodies[0], flow);
    }
    if (out_.size() > kMaxOutputBytes) return Error(st.line, "the rendered prompt exceeds 16 MiB");
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Stmt& st) {
    INFERD_ASSIGN_OR_RETURN(Value seq, Eval(*st.expr));
    List items;
    if (seq.kind == Value::Kind::kList) {
      items = *seq.list;
    } else if (seq.kind == Value::Kind::kDict) {
      for (const auto& [k, v] : *seq.dict) items.push_back(Value::Str(k));
    } else if (seq.kind == Value::Kind::kString) {
      for (unsigned char c : seq.s) items.push_back(Value::Str(std::string(1, static_cast<char>(c))));
    } else if (!seq.is_undefined() && seq.kind != Value::Kind::kNone) {
      return Error(st.line, absl::StrCat("cannot loop over a ", KindName(seq.kind)));
    }
    scopes_.emplace_back();
    auto bind = [&](const Value& item) -> absl::Status {
      if (st.targets.size() == 1) {
        scopes_.back()[st.targets[0]] = item;
        return absl::OkStatus();
      }
      if (item.kind != Value::Kind::kList || item.list->size() != st.targets.size()) {
        return Error(st.line,
                     absl::StrCat("cannot unpack a ", KindName(item.kind), " into ", st.targets.size(), " names"));
      }
      for (size_t k = 0; k < st.targets.size(); ++k) scopes_.back()[st.targets[k]] = (*item.list)[k];
      return absl::OkStatus();
    };
    if (!st.conditions.empty()) {  // `for x in xs if cond`: the loop sees only the items that pass
      List kept;
      for (const Value& item : items) {
        INFERD_RETURN_IF_ERROR(bind(item));
        INFERD_ASSIGN_OR_RETURN(Value keep, Eval(*st.conditions[0]));
        if (keep.Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (static_cast<int64_t>(items.size()) > kMaxLoopIterations) return Error(st.line, "loop is too long");
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      INFERD_RETURN_IF_ERROR(bind(items[k]));
      scopes_.back()["loop"] = Value::MakeDict({
          {"index0", Value::Int(k)},
          {"index", Value::Int(k + 1)},
          {"revindex0", Value::Int(n - k - 1)},
          {"revindex", Value::Int(n - k)},
          {"first", Value::Bool(k == 0)},
          {"last", Value::Bool(k == n - 1)},
          {"length", Value::Int(n)},
          {"previtem", k > 0 ? items[k - 1] : Value()},
          {"nextitem", k + 1 < n ? items[k + 1] : Value()},
      });
      Flow flow = Flow::kNormal;
      INFERD_RETURN_IF_ERROR(Exec(st.bodies[0], &flow));
      if (flow == Flow::kBreak) break;
    }
    scopes_.pop_back();
    if (n == 0 && st.bodies.size() > 1) {
      Flow flow = Flow::kNormal;
      return Exec(st.bodies[1], &flow);
    }
    return absl::OkStatus();
  }

  void Emit(const std::string& s) { out_ += s; }

  Value* Lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  absl::StatusOr<Args> EvalArgs(const Expr& e, size_t first) {
    Args a;
    for (size_t k = first; k < e.args.size(); ++k) {
      INFERD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k]));
      a.positional.push_back(std::move(v));
    }
    for (size_t k = 0; k < e.kwargs.size(); ++k) {
      INFERD_ASSIGN_OR_RETURN(Value v, Eval(*e.kwargs[k]));
      a.keyword.emplace_back(e.keys[k], std::move(v));
    }
    return a;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    if (++depth_ > 256) return Error(e.line, "expression nested too deep");
    auto v = EvalInner(e);
    --depth_;
    if (!v.ok()) return AtLine(e.line, v.status());
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kLiteral:
        return e.value;
      case K::kName: {
        const Value* v = Lookup(e.name);
        return v ? *v : Value();
      }
      case K::kList: {
        List items;
        for (const auto& a : e.args) {
          INFERD_ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return Value::MakeList(std::move(items));
      }
      case K::kDict: {
        Dict d;
        for (size_t k = 0; k < e.args.size(); ++k) {
          INFERD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k]));
          d.emplace_back(e.keys[k], std::move(v));
        }
        return Value::MakeDict(std::move(d));
      }
      case K::kAttr: {
        INFERD_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        const Value* v = obj.Find(e.name);
        return v ? *v : Value();
      }
      case K::kIndex: {
        INFERD_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        INFERD_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return Index(obj, key);
      }
      case K::kSlice:
        return Slice(e);
      case K::kCall:
        return Call(e);
      case K::kFilter: {
        INFERD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        INFERD_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 1));
        return ApplyFilter(e.name, v, a);
      }
      case K::kTest: {
        INFERD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        INFERD_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 1));
        INFERD_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, v, a));
        return Value::Bool(r != e.negate);
      }
      case K::kUnary: {
        INFERD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.kind == Value::Kind::kInt) return Value::Int(e.name == "-" ? -v.i : v.i);
        if (v.kind == Value::Kind::kFloat) return Value::Float(e.name == "-" ? -v.f : v.f);
        return Error(e.line, absl::StrCat("unary ", e.name, " of a ", KindName(v.kind)));
      }
      case K::kBinary:
        return Binary(e);
      case K::kTernary: {
        INFERD_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (e.args.size() > 2) return Eval(*e.args[2]);
        return Value();
      }
    }
    return Error(e.line, "bad expression");
  }

  absl::StatusOr<Value> Index(const Value& obj, const Value& key) {
    if (obj.kind == Value::Kind::kDict) {
      const Value* v = obj.Find(key.kind == Value::Kind::kString ? key.s : ToOutput(key));
      return v ? *v : Value();
    }
    if ((obj.kind == Value::Kind::kList || obj.kind == Value::Kind::kString) && key.kind == Value::Kind::kInt) {
      const int64_t n =
          obj.kind == Value::Kind::kList ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(obj.s.size());
      int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value();
      return obj.kind == Value::Kind::kList ? (*obj.list)[k] : Value::Str(obj.s.substr(k, 1));
    }
    if (obj.is_undefined()) return Value();
    return absl::InvalidArgumentError(
        absl::StrCat("cannot index a ", KindName(obj.kind), " with a ", KindName(key.kind)));
  }

  absl::StatusOr<Value> Slice(const Expr& e) {
    INFERD_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    Value b[3];
    for (int k = 0; k < 3; ++k) {
      INFERD_ASSIGN_OR_RETURN(b[k], Eval(*e.args[k + 1]));
      if (!b[k].is_undefined() && b[k].kind != Value::Kind::kNone && b[k].kind != Value::Kind::kInt) {
        return Error(e.line, "slice bounds must be integers");
      }
    }
    const bool is_list = obj.kind == Value::Kind::kList;
    if (!is_list && obj.kind != Value::Kind::kString)
      return Error(e.line, absl::StrCat("cannot slice a ", KindName(obj.kind)));
    const int64_t n = is_list ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(obj.s.size());
    const int64_t step = b[2].kind == Value::Kind::kInt ? b[2].i : 1;
    if (step == 0) return Error(e.line, "slice step cannot be zero");
    auto bound = [&](const Value& v, int64_t fallback) {
      if (v.kind != Value::Kind::kInt) return fallback;
      int64_t x = v.i < 0 ? v.i + n : v.i;
      return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = bound(b[0], step > 0 ? 0 : n - 1), stop = bound(b[1], step > 0 ? n : -1);
    List items;
    std::string s;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (is_list)
        items.push_back((*obj.list)[k]);
      else
        s.push_back(obj.s[k]);
    }
    return is_list ? Value::MakeList(std::move(items)) : Value::Str(std::move(s));
  }

  absl::StatusOr<Value> Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    INFERD_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 1));
    if (callee.kind == Expr::Kind::kAttr) {
      INFERD_ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
      return CallMethod(obj, callee.name, a);
    }
    if (callee.kind == Expr::Kind::kName && IsGlobalFunction(callee.name) && !Lookup(callee.name)) {
      return CallGlobal(callee.name, a);
    }
    return Error(e.line,
                 "only methods and the functions range, namespace, dict, strftime_now and raise_exception "
                 "can be called");
  }

  absl::StatusOr<Value> Binary(const Expr& e) {
    const std::string& op = e.name;
    INFERD_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
    if (op == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.args[1]);
    INFERD_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
    using K = Value::Kind;
    if (op == "==") return Value::Bool(Equal(a, b));
    if (op == "!=") return Value::Bool(!Equal(a, b));
    if (op == "in" || op == "notin") {
      Args args;
      args.positional.push_back(b);
      INFERD_ASSIGN_OR_RETURN(bool r, ApplyTest("in", a, args));
      return Value::Bool(r == (op == "in"));
    }
    if (op == "~") return Value::Str(ToOutput(a) + ToOutput(b));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp;
      if (a.is_number() && b.is_number()) {
        cmp = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
      } else if (a.kind == K::kString && b.kind == K::kString) {
        cmp = a.s.compare(b.s);
      } else {
        return Error(e.line, absl::StrCat("cannot compare a ", KindName(a.kind), " with a ", KindName(b.kind)));
      }
      return Value::Bool(op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0);
    }
    if (op == "+" && a.kind == K::kString && b.kind == K::kString) return Value::Str(a.s + b.s);
    if (op == "+" && a.kind == K::kList && b.kind == K::kList) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::MakeList(std::move(items));
    }
    if (op == "*" && a.kind == K::kString && b.kind == K::kInt) {
      std::string s;
      for (int64_t k = 0; k < b.i && s.size() < kMaxOutputBytes; ++k) s += a.s;
      return Value::Str(s);
    }
    if (!a.is_number() || !b.is_number()) {
      return Error(e.line, absl::StrCat("unsupported operand types for ", op, ": ", KindName(a.kind), " and ",
                                        KindName(b.kind)));
    }
    const bool ints = a.kind != K::kFloat && b.kind != K::kFloat;
    const int64_t x = a.kind == K::kBool ? a.b : a.i, y = b.kind == K::kBool ? b.b : b.i;
    const double fx = a.as_double(), fy = b.as_double();
    if (op == "+") return ints ? Value::Int(x + y) : Value::Float(fx + fy);
    if (op == "-") return ints ? Value::Int(x - y) : Value::Float(fx - fy);
    if (op == "*") return ints ? Value::Int(x * y) : Value::Float(fx * fy);
    if (op == "**")
      return ints && y >= 0 ? Value::Int(static_cast<int64_t>(std::pow(fx, fy))) : Value::Float(std::pow(fx, fy));
    if (fy == 0) return Error(e.line, "division by zero");
    if (op == "/") return Value::Float(fx / fy);
    if (op == "//") {
      if (ints) return Value::Int(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
      return Value::Float(std::floor(fx / fy));
    }
    if (op == "%") {
      if (ints) {
        int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value::Int(r);
      }
      double r = std::fmod(fx, fy);
      if (r != 0 && ((r < 0) != (fy < 0))) r += fy;
      return Value::Float(r);
    }
    return Error(e.line, absl::StrCat("unknown operator ", op));
  }

  std::vector<std::map<std::string, Value>> scopes_;
  std::string out_;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Render(const Body& body, const Dict& globals) {
  Renderer r(globals);
  Flow flow = Flow::kNormal;
  INFERD_RETURN_IF_ERROR(r.Exec(body, &flow));
  return std::move(r.out());
}

}  // namespace inferd::jinja
