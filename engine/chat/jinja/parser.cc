#include "engine/chat/jinja/parser.h"

#include <cctype>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace inferd::jinja {
namespace {

absl::Status Error(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

// ---- Segments: text between tags, and the tags' inner source ----

struct Segment {
  enum class Kind { kText, kOutput, kBlock } kind;
  std::string text;
  int line;
};

bool IsSpaceNoNewline(char c) {
  return c == ' ' || c == '\t';
}

absl::StatusOr<std::vector<Segment>> Segments(const std::string& src) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, trim_next_newline = false;
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    auto is_tag_start = [&](size_t at) { return src[at] == '{' || src[at] == '%' || src[at] == '#'; };
    while (open != std::string::npos && open + 1 < src.size() && !is_tag_start(open + 1)) {
      open = src.find('{', open + 1);
    }
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    count_lines(pos, open == std::string::npos ? src.size() : open);
    // Whether this text begins a line: at the start of the source, or after a newline a tag consumed.
    bool line_starting = pos == 0;
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
      line_starting = k > 0 && text[k - 1] == '\n';
      text.erase(0, k);
    } else if (trim_next_newline) {
      if (text.rfind("\r\n", 0) == 0)
        text.erase(0, 2), line_starting = true;
      else if (!text.empty() && text[0] == '\n')
        text.erase(0, 1), line_starting = true;
    }
    strip_next = trim_next_newline = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Segment::Kind::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    size_t inner = open + 2;
    const bool strip_before = inner < src.size() && src[inner] == '-';
    const bool keep_before = inner < src.size() && src[inner] == '+';
    if (strip_before || keep_before) ++inner;
    if (strip_before) {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    } else if ((kind == '%' || kind == '#') && !keep_before) {
      // lstrip_blocks: blanks between the start of a line and a block tag go.
      const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if (line_start > 0 || line_starting) {
        size_t k = line_start;
        while (k < text.size() && IsSpaceNoNewline(text[k])) ++k;
        if (k == text.size()) text.erase(line_start);
      }
    }
    if (!text.empty()) out.push_back({Segment::Kind::kText, text, text_line});
    // Find the closing delimiter, skipping string literals inside expressions.
    const char close_char = kind == '{' ? '}' : kind;
    size_t k = inner;
    char quote = 0;
    size_t end = std::string::npos;
    for (; k + 1 < src.size(); ++k) {
      const char c = src[k];
      if (kind != '#' && quote) {
        if (c == '\\')
          ++k;
        else if (c == quote)
          quote = 0;
        continue;
      }
      if (kind != '#' && (c == '\'' || c == '"')) {
        quote = c;
        continue;
      }
      if (c == close_char && src[k + 1] == '}') {
        end = k;
        break;
      }
    }
    if (end == std::string::npos) return Error(line, absl::StrCat("'{", std::string(1, kind), "' is never closed"));
    size_t content_end = end;
    const bool strip_after = content_end > inner && src[content_end - 1] == '-';
    const bool keep_after = content_end > inner && src[content_end - 1] == '+';
    if (strip_after || keep_after) --content_end;
    const std::string content = src.substr(inner, content_end - inner);
    const int tag_line = line;
    count_lines(open, end + 2);
    pos = end + 2;
    strip_next = strip_after;
    trim_next_newline = !strip_after && !keep_after && kind != '{';  // trim_blocks
    if (kind == '#') continue;
    // {% raw %} ... {% endraw %}: the text in between is output as written.
    std::string trimmed = content;
    while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) trimmed.pop_back();
    while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.front()))) trimmed.erase(0, 1);
    if (kind == '%' && trimmed == "raw") {
      const size_t endraw = src.find("endraw", pos);
      const size_t tag_open = endraw == std::string::npos ? endraw : src.rfind("{%", endraw);
      const size_t tag_close = endraw == std::string::npos ? endraw : src.find("%}", endraw);
      if (tag_open == std::string::npos || tag_close == std::string::npos || tag_open < pos) {
        return Error(tag_line, "{% raw %} without {% endraw %}");
      }
      std::string raw = src.substr(pos, tag_open - pos);
      if (tag_open + 2 < src.size() && src[tag_open + 2] == '-') {
        while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.pop_back();
      }
      if (!raw.empty()) out.push_back({Segment::Kind::kText, raw, line});
      count_lines(pos, tag_close + 2);
      strip_next = src[tag_close - 1] == '-';
      trim_next_newline = !strip_next;
      pos = tag_close + 2;
      continue;
    }
    out.push_back({kind == '{' ? Segment::Kind::kOutput : Segment::Kind::kBlock, content, tag_line});
  }
  return out;
}

// ---- Expression tokens ----

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
  Value value;
};

absl::StatusOr<std::vector<Token>> Lex(const std::string& s, int line) {
  std::vector<Token> out;
  size_t k = 0;
  while (k < s.size()) {
    const char c = s[k];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++k;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out.push_back({Token::Kind::kName, s.substr(k, e - k), {}});
      k = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      bool is_float = false;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        is_float = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      std::string num;
      for (size_t q = k; q < e; ++q) {
        if (s[q] != '_') num.push_back(s[q]);
      }
      Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, num, {}};
      try {
        t.value = is_float ? Value::Float(std::stod(num)) : Value::Int(std::stoll(num));
      } catch (...) {
        return Error(line, absl::StrCat("number '", num, "' is out of range"));
      }
      out.push_back(std::move(t));
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t e = k + 1;
      for (; e < s.size() && s[e] != c; ++e) {
        if (s[e] != '\\' || e + 1 >= s.size()) {
          v.push_back(s[e]);
          continue;
        }
        const char x = s[++e];
        switch (x) {
          case 'n':
            v.push_back('\n');
            break;
          case 't':
            v.push_back('\t');
            break;
          case 'r':
            v.push_back('\r');
            break;
          case '\\':
            v.push_back('\\');
            break;
          case '\'':
            v.push_back('\'');
            break;
          case '"':
            v.push_back('"');
            break;
          case '\n':
            break;
          default:
            v.push_back('\\');
            v.push_back(x);
        }
      }
      if (e >= s.size()) return Error(line, "unterminated string literal");
      out.push_back({Token::Kind::kString, "", Value::Str(std::move(v))});
      k = e + 1;
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".",
                                   ",",  ":",  "|",  "+",  "-",  "*",  "/", "%", "~", "<", ">", "="};
      bool found = false;
      for (const char* op : kOps) {
        if (s.compare(k, std::strlen(op), op) == 0) {
          out.push_back({Token::Kind::kOp, op, {}});
          k += std::strlen(op);
          found = true;
          break;
        }
      }
      if (!found) return Error(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::Kind::kEnd, "", {}});
  return out;
}

// ---- Expressions: Jinja's precedence, lowest first ----

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  absl::StatusOr<std::unique_ptr<Expr>> Parse() { return Ternary(); }
  bool AtEnd() const { return t_[p_].kind == Token::Kind::kEnd; }
  bool PeekName(const char* n) const { return t_[p_].kind == Token::Kind::kName && t_[p_].text == n; }
  bool PeekOp(const char* o) const { return t_[p_].kind == Token::Kind::kOp && t_[p_].text == o; }
  bool AcceptName(const char* n) { return PeekName(n) ? (++p_, true) : false; }
  bool AcceptOp(const char* o) { return PeekOp(o) ? (++p_, true) : false; }
  absl::Status ExpectOp(const char* o) {
    if (AcceptOp(o)) return absl::OkStatus();
    return Error(line_, absl::StrCat("expected '", o, "' but found '", Describe(), "'"));
  }
  absl::StatusOr<std::string> Name() {
    if (t_[p_].kind != Token::Kind::kName)
      return Error(line_, absl::StrCat("expected a name, found '", Describe(), "'"));
    return t_[p_++].text;
  }
  std::string Describe() const {
    const Token& t = t_[p_];
    if (t.kind == Token::Kind::kEnd) return "end of tag";
    if (t.kind == Token::Kind::kString) return Repr(t.value);
    return t.text;
  }
  absl::Status ExpectEnd() {
    if (AtEnd()) return absl::OkStatus();
    return Error(line_, absl::StrCat("unexpected '", Describe(), "'"));
  }
  // Without the ternary, for `for x in y if cond` where `if` filters.
  absl::StatusOr<std::unique_ptr<Expr>> OrExpr() { return Or(); }

 private:
  std::unique_ptr<Expr> Node(Expr::Kind k, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->name = std::move(name);
    e->line = line_;
    return e;
  }
  std::unique_ptr<Expr> Binary(std::string op, std::unique_ptr<Expr> a, std::unique_ptr<Expr> b) {
    auto e = Node(Expr::Kind::kBinary, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  absl::StatusOr<std::unique_ptr<Expr>> Ternary() {
    INFERD_ASSIGN_OR_RETURN(auto value, Or());
    if (!AcceptName("if")) return value;
    INFERD_ASSIGN_OR_RETURN(auto cond, Or());
    auto e = Node(Expr::Kind::kTernary);
    e->args.push_back(std::move(value));
    e->args.push_back(std::move(cond));
    if (AcceptName("else")) {
      INFERD_ASSIGN_OR_RETURN(auto other, Ternary());
      e->args.push_back(std::move(other));
    }
    return e;
  }
  using Level = absl::StatusOr<std::unique_ptr<Expr>> (ExprParser::*)();
  // A left-associative level: `next (op next)*` for the operators (or keywords) in ops.
  absl::StatusOr<std::unique_ptr<Expr>> LeftAssoc(std::initializer_list<const char*> ops, Level next) {
    INFERD_ASSIGN_OR_RETURN(auto a, (this->*next)());
    while (true) {
      const char* op = nullptr;
      for (const char* o : ops) {
        if (PeekOp(o) || PeekName(o)) op = o;
      }
      if (!op) return a;
      ++p_;
      INFERD_ASSIGN_OR_RETURN(auto b, (this->*next)());
      a = Binary(op, std::move(a), std::move(b));
    }
  }
  absl::StatusOr<std::unique_ptr<Expr>> Or() { return LeftAssoc({"or"}, &ExprParser::And); }
  absl::StatusOr<std::unique_ptr<Expr>> And() { return LeftAssoc({"and"}, &ExprParser::Not); }
  absl::StatusOr<std::unique_ptr<Expr>> Not() {
    if (AcceptName("not")) {
      INFERD_ASSIGN_OR_RETURN(auto a, Not());
      auto e = Node(Expr::Kind::kUnary, "not");
      e->args.push_back(std::move(a));
      return e;
    }
    return Compare();
  }
  absl::StatusOr<std::unique_ptr<Expr>> Compare() {
    INFERD_ASSIGN_OR_RETURN(auto a, Add());
    while (true) {
      std::string op;
      for (const char* o : {"==", "!=", "<=", ">=", "<", ">"}) {
        if (AcceptOp(o)) {
          op = o;
          break;
        }
      }
      if (op.empty() && AcceptName("in")) op = "in";
      if (op.empty() && PeekName("not") && t_[p_ + 1].kind == Token::Kind::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "notin";
      }
      if (op.empty()) return a;
      INFERD_ASSIGN_OR_RETURN(auto b, Add());
      a = Binary(op, std::move(a), std::move(b));
    }
  }
  absl::StatusOr<std::unique_ptr<Expr>> Add() { return LeftAssoc({"+", "-"}, &ExprParser::Concat); }
  absl::StatusOr<std::unique_ptr<Expr>> Concat() { return LeftAssoc({"~"}, &ExprParser::Mul); }
  absl::StatusOr<std::unique_ptr<Expr>> Mul() { return LeftAssoc({"*", "/", "//", "%"}, &ExprParser::Pow); }
  absl::StatusOr<std::unique_ptr<Expr>> Pow() { return LeftAssoc({"**"}, &ExprParser::Unary); }
  absl::StatusOr<std::unique_ptr<Expr>> Unary() {
    if (PeekOp("-") || PeekOp("+")) {
      const std::string op = t_[p_++].text;
      INFERD_ASSIGN_OR_RETURN(auto a, Unary());
      auto e = Node(Expr::Kind::kUnary, op);
      e->args.push_back(std::move(a));
      return e;
    }
    INFERD_ASSIGN_OR_RETURN(auto a, Primary());
    return Postfix(std::move(a));
  }

  absl::Status Arguments(Expr* e) {  // after '(' ; fills args (after any already there) and kwargs
    while (!AcceptOp(")")) {
      if (t_[p_].kind == Token::Kind::kName && t_[p_ + 1].kind == Token::Kind::kOp && t_[p_ + 1].text == "=") {
        e->keys.push_back(t_[p_].text);
        p_ += 2;
        INFERD_ASSIGN_OR_RETURN(auto v, Ternary());
        e->kwargs.push_back(std::move(v));
      } else {
        INFERD_ASSIGN_OR_RETURN(auto v, Ternary());
        e->args.push_back(std::move(v));
      }
      if (!AcceptOp(",")) {
        INFERD_RETURN_IF_ERROR(ExpectOp(")"));
        break;
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Expr>> Postfix(std::unique_ptr<Expr> a) {
    while (true) {
      if (AcceptOp(".")) {
        INFERD_ASSIGN_OR_RETURN(std::string n, Name());
        auto e = Node(Expr::Kind::kAttr, n);
        e->args.push_back(std::move(a));
        a = std::move(e);
      } else if (AcceptOp("[")) {
        std::unique_ptr<Expr> bounds[3];
        bool slice = false;
        for (int part = 0; part < 3; ++part) {
          if (!PeekOp(":") && !PeekOp("]")) {
            INFERD_ASSIGN_OR_RETURN(bounds[part], Ternary());
          }
          if (part < 2 && AcceptOp(":")) {
            slice = true;
            continue;
          }
          break;
        }
        INFERD_RETURN_IF_ERROR(ExpectOp("]"));
        auto e = Node(slice ? Expr::Kind::kSlice : Expr::Kind::kIndex);
        e->args.push_back(std::move(a));
        if (!slice && !bounds[0]) return Error(line_, "empty subscript []");
        for (int part = 0; part < (slice ? 3 : 1); ++part) {
          e->args.push_back(bounds[part] ? std::move(bounds[part]) : Node(Expr::Kind::kLiteral));
        }
        a = std::move(e);
      } else if (AcceptOp("(")) {
        auto e = Node(Expr::Kind::kCall);
        e->args.push_back(std::move(a));
        INFERD_RETURN_IF_ERROR(Arguments(e.get()));
        a = std::move(e);
      } else if (AcceptOp("|")) {
        INFERD_ASSIGN_OR_RETURN(std::string n, Name());
        auto e = Node(Expr::Kind::kFilter, n);
        e->args.push_back(std::move(a));
        if (AcceptOp("(")) INFERD_RETURN_IF_ERROR(Arguments(e.get()));
        a = std::move(e);
      } else if (AcceptName("is")) {
        auto e = Node(Expr::Kind::kTest);
        e->negate = AcceptName("not");
        INFERD_ASSIGN_OR_RETURN(e->name, Name());
        e->args.push_back(std::move(a));
        if (AcceptOp("(")) {
          INFERD_RETURN_IF_ERROR(Arguments(e.get()));
        } else if (t_[p_].kind == Token::Kind::kString || t_[p_].kind == Token::Kind::kInt ||
                   t_[p_].kind == Token::Kind::kFloat || PeekName("none") || PeekName("true") || PeekName("false")) {
          INFERD_ASSIGN_OR_RETURN(auto arg, Primary());  // `x is sameas none`, `x is eq 3`
          e->args.push_back(std::move(arg));
        }
        a = std::move(e);
      } else {
        return a;
      }
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> Primary() {
    const Token& t = t_[p_];
    if (t.kind == Token::Kind::kString) {
      // Adjacent string literals concatenate, as in Python.
      std::string s;
      while (t_[p_].kind == Token::Kind::kString) s += t_[p_++].value.s;
      auto e = Node(Expr::Kind::kLiteral);
      e->value = Value::Str(std::move(s));
      return e;
    }
    if (t.kind == Token::Kind::kInt || t.kind == Token::Kind::kFloat) {
      auto e = Node(Expr::Kind::kLiteral);
      e->value = t_[p_++].value;
      return e;
    }
    if (t.kind == Token::Kind::kName) {
      const std::string n = t_[p_++].text;
      auto e = Node(Expr::Kind::kLiteral);
      if (n == "true" || n == "True")
        e->value = Value::Bool(true);
      else if (n == "false" || n == "False")
        e->value = Value::Bool(false);
      else if (n == "none" || n == "None")
        e->value = Value::None();
      else
        e = Node(Expr::Kind::kName, n);
      return e;
    }
    if (AcceptOp("(")) {
      INFERD_ASSIGN_OR_RETURN(auto first, Ternary());
      if (AcceptOp(")")) return first;
      auto e = Node(Expr::Kind::kList);  // a tuple; behaves as a list here
      e->args.push_back(std::move(first));
      while (AcceptOp(",")) {
        if (PeekOp(")")) break;
        INFERD_ASSIGN_OR_RETURN(auto v, Ternary());
        e->args.push_back(std::move(v));
      }
      INFERD_RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (AcceptOp("[")) {
      auto e = Node(Expr::Kind::kList);
      while (!AcceptOp("]")) {
        INFERD_ASSIGN_OR_RETURN(auto v, Ternary());
        e->args.push_back(std::move(v));
        if (!AcceptOp(",")) {
          INFERD_RETURN_IF_ERROR(ExpectOp("]"));
          break;
        }
      }
      return e;
    }
    if (AcceptOp("{")) {
      auto e = Node(Expr::Kind::kDict);
      while (!AcceptOp("}")) {
        if (t_[p_].kind != Token::Kind::kString) return Error(line_, "dict keys must be string literals");
        e->keys.push_back(t_[p_++].value.s);
        INFERD_RETURN_IF_ERROR(ExpectOp(":"));
        INFERD_ASSIGN_OR_RETURN(auto v, Ternary());
        e->args.push_back(std::move(v));
        if (!AcceptOp(",")) {
          INFERD_RETURN_IF_ERROR(ExpectOp("}"));
          break;
        }
      }
      return e;
    }
    return Error(line_, absl::StrCat("unexpected '", Describe(), "'"));
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
};

// ---- Statements ----

class StmtParser {
 public:
  explicit StmtParser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  // Parses a body up to one of `ends`, which must come (else `unclosed` is the error), and consumes that tag.
  absl::StatusOr<Body> ParseClosed(const std::vector<std::string>& ends, const char* unclosed, int line,
                                   std::string* found_end) {
    INFERD_ASSIGN_OR_RETURN(Body body, ParseBody(ends, found_end));
    if (found_end->empty()) return Error(line, unclosed);
    ++i_;
    return body;
  }

  // Parses until a block tag whose first word is one of `ends` (left unconsumed) or the end.
  absl::StatusOr<Body> ParseBody(const std::vector<std::string>& ends, std::string* found_end) {
    Body body;
    while (i_ < segs_.size()) {
      const Segment& s = segs_[i_];
      if (s.kind == Segment::Kind::kText) {
        auto st = std::make_unique<Stmt>();
        st->kind = Stmt::Kind::kText;
        st->text = s.text;
        st->line = s.line;
        body.push_back(std::move(st));
        ++i_;
        continue;
      }
      INFERD_ASSIGN_OR_RETURN(auto tokens, Lex(s.text, s.line));
      if (s.kind == Segment::Kind::kOutput) {
        ExprParser p(std::move(tokens), s.line);
        INFERD_ASSIGN_OR_RETURN(auto e, p.Parse());
        INFERD_RETURN_IF_ERROR(p.ExpectEnd());
        auto st = std::make_unique<Stmt>();
        st->kind = Stmt::Kind::kOutput;
        st->expr = std::move(e);
        st->line = s.line;
        body.push_back(std::move(st));
        ++i_;
        continue;
      }
      if (tokens[0].kind != Token::Kind::kName) return Error(s.line, "a block tag must start with a keyword");
      const std::string word = tokens[0].text;
      for (const std::string& e : ends) {
        if (word == e) {
          *found_end = word;
          return body;
        }
      }
      ++i_;
      ExprParser p(std::vector<Token>(tokens.begin() + 1, tokens.end()), s.line);
      auto st = std::make_unique<Stmt>();
      st->line = s.line;
      if (word == "if") {
        st->kind = Stmt::Kind::kIf;
        INFERD_ASSIGN_OR_RETURN(auto cond, p.Parse());
        INFERD_RETURN_IF_ERROR(p.ExpectEnd());
        st->conditions.push_back(std::move(cond));
        const char* unclosed = "{% if %} without {% endif %}";
        while (true) {
          std::string end;
          INFERD_ASSIGN_OR_RETURN(auto b, ParseClosed({"elif", "else", "endif"}, unclosed, s.line, &end));
          st->bodies.push_back(std::move(b));
          if (end == "endif") break;
          if (end == "else") {
            INFERD_ASSIGN_OR_RETURN(auto eb, ParseClosed({"endif"}, unclosed, s.line, &end));
            st->bodies.push_back(std::move(eb));
            break;
          }
          const Segment& elif = segs_[i_ - 1];
          INFERD_ASSIGN_OR_RETURN(auto tk, Lex(elif.text, elif.line));
          ExprParser ep(std::vector<Token>(tk.begin() + 1, tk.end()), elif.line);
          INFERD_ASSIGN_OR_RETURN(auto c, ep.Parse());
          INFERD_RETURN_IF_ERROR(ep.ExpectEnd());
          st->conditions.push_back(std::move(c));
        }
      } else if (word == "for") {
        st->kind = Stmt::Kind::kFor;
        do {
          INFERD_ASSIGN_OR_RETURN(std::string n, p.Name());
          st->targets.push_back(n);
        } while (p.AcceptOp(","));
        if (!p.AcceptName("in")) return Error(s.line, "expected 'in' in {% for %}");
        INFERD_ASSIGN_OR_RETURN(st->expr, p.OrExpr());
        if (p.AcceptName("if")) {
          INFERD_ASSIGN_OR_RETURN(auto f, p.OrExpr());
          st->conditions.push_back(std::move(f));
        }
        if (p.AcceptName("recursive")) return Error(s.line, "recursive loops are not supported");
        INFERD_RETURN_IF_ERROR(p.ExpectEnd());
        const char* unclosed = "{% for %} without {% endfor %}";
        std::string end;
        INFERD_ASSIGN_OR_RETURN(auto b, ParseClosed({"else", "endfor"}, unclosed, s.line, &end));
        st->bodies.push_back(std::move(b));
        if (end == "else") {
          INFERD_ASSIGN_OR_RETURN(auto eb, ParseClosed({"endfor"}, unclosed, s.line, &end));
          st->bodies.push_back(std::move(eb));
        }
      } else if (word == "set") {
        st->kind = Stmt::Kind::kSet;
        INFERD_ASSIGN_OR_RETURN(std::string n, p.Name());
        st->targets.push_back(n);
        if (p.AcceptOp(".")) {
          INFERD_ASSIGN_OR_RETURN(std::string attr, p.Name());
          st->targets.push_back(attr);
        }
        if (!p.AcceptOp("=")) return Error(s.line, "{% set %} blocks are not supported; use {% set name = value %}");
        INFERD_ASSIGN_OR_RETURN(st->expr, p.Parse());
        INFERD_RETURN_IF_ERROR(p.ExpectEnd());
      } else if (word == "break" || word == "continue") {
        st->kind = word == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
        INFERD_RETURN_IF_ERROR(p.ExpectEnd());
      } else if (word == "generation") {  // Hugging Face's marker of assistant text; renders its body
        st->kind = Stmt::Kind::kBlock;
        std::string end;
        INFERD_ASSIGN_OR_RETURN(
            auto b, ParseClosed({"endgeneration"}, "{% generation %} without {% endgeneration %}", s.line, &end));
        st->bodies.push_back(std::move(b));
      } else {
        return Error(s.line, absl::StrCat("'{% ", word, " %}' is not supported or is misplaced"));
      }
      body.push_back(std::move(st));
    }
    return body;
  }

 private:
  std::vector<Segment> segs_;
  size_t i_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(const std::string& source) {
  INFERD_ASSIGN_OR_RETURN(auto segs, Segments(source));
  StmtParser p(std::move(segs));
  std::string end;
  INFERD_ASSIGN_OR_RETURN(Body body, p.ParseBody({"endif", "endfor", "elif", "else", "endgeneration"}, &end));
  if (!end.empty()) return Error(0, absl::StrCat("'{% ", end, " %}' without its opening tag"));
  return body;
}

}  // namespace inferd::jinja
