#include "common/pattern.h"

#include <algorithm>
#include <bitset>
#include <cctype>
#include <functional>

namespace ckpt {

// A node of the parsed pattern. Alternatives hold sequences of nodes.
struct Pattern::Node {
  enum class Kind { kSet, kGroup, kRepeat, kBol, kEol, kWordBoundary, kNotWordBoundary };
  Kind kind = Kind::kSet;
  std::bitset<256> set;                           // kSet: the bytes it matches
  std::vector<std::vector<const Node*>> alts;     // kGroup: alternatives
  int capture = -1;                               // kGroup: group index, -1 if not capturing
  const Node* child = nullptr;                    // kRepeat
  size_t min = 0, max = 0;                        // kRepeat; max == kInfinite: unbounded
  bool greedy = true;                             // kRepeat
  std::vector<std::unique_ptr<Node>> owned;       // the root owns every node
};

namespace {

using Node = Pattern::Node;
constexpr size_t kInfinite = static_cast<size_t>(-1);
constexpr size_t kMaxRepeat = 1000;
constexpr size_t kStepBudget = 1u << 22;

bool IsWord(unsigned char c) {  // ASCII, whatever the C locale says
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::bitset<256> ClassOf(char e) {
  std::bitset<256> s;
  for (int c = 0; c < 256; ++c) {
    const bool in = (e == 'd' || e == 'D') ? (c >= '0' && c <= '9')
                    : (e == 'w' || e == 'W') ? IsWord(static_cast<unsigned char>(c))
                                             : (c == ' ' || (c >= '\t' && c <= '\r'));
    s[c] = in;
  }
  if (e == 'D' || e == 'W' || e == 'S') s.flip();
  return s;
}

class Parser {
 public:
  Parser(const std::string& text, Node* root) : t_(text), root_(root) {}

  Status Parse() {
    root_->kind = Node::Kind::kGroup;
    root_->capture = 0;
    CKPT_RETURN_IF_ERROR(Alternatives(&root_->alts));
    if (i_ != t_.size()) return Error("unmatched ')'");
    return Status::Ok();
  }
  size_t groups() const { return groups_; }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("pattern /" + t_ + "/ at offset " + std::to_string(i_) + ": " + what);
  }
  Node* New() {
    root_->owned.push_back(std::make_unique<Node>());
    return root_->owned.back().get();
  }
  bool More() const { return i_ < t_.size(); }

  Status Alternatives(std::vector<std::vector<const Node*>>* alts) {
    alts->emplace_back();
    while (More() && t_[i_] != ')') {
      if (t_[i_] == '|') {
        ++i_;
        alts->emplace_back();
        continue;
      }
      CKPT_RETURN_IF_ERROR(Term(&alts->back()));
    }
    return Status::Ok();
  }

  // An atom and its quantifier, appended to `seq`.
  Status Term(std::vector<const Node*>* seq) {
    Node* atom = New();
    const char c = t_[i_++];
    switch (c) {
      case '^': atom->kind = Node::Kind::kBol; break;
      case '$': atom->kind = Node::Kind::kEol; break;
      case '.':
        atom->set.set();
        atom->set['\n'] = false;
        atom->set['\r'] = false;
        break;
      case '[': CKPT_RETURN_IF_ERROR(Class(&atom->set)); break;
      case '(': {
        atom->kind = Node::Kind::kGroup;
        if (t_.compare(i_, 2, "?:") == 0) {
          i_ += 2;
        } else if (More() && t_[i_] == '?') {
          return Error("lookarounds and other (? groups are not supported");
        } else {
          atom->capture = static_cast<int>(++groups_);
        }
        CKPT_RETURN_IF_ERROR(Alternatives(&atom->alts));
        if (!More() || t_[i_] != ')') return Error("missing ')'");
        ++i_;
        break;
      }
      case ')': return Error("unmatched ')'");
      case '*': case '+': case '?':
        return Error(std::string("nothing to repeat before '") + c + "'");
      case '{':
        return Error(Quantifier(nullptr) ? "nothing to repeat before '{'"
                                         : "'{' must start a quantifier {n}, {n,} or {n,m} (write \\{ for a brace)");
      case '}': case ']':
        atom->set[static_cast<unsigned char>(c)] = true;
        break;
      case '\\': {
        if (!More()) return Error("trailing '\\'");
        const char e = t_[i_++];
        if (e == 'b' || e == 'B') {
          atom->kind = e == 'b' ? Node::Kind::kWordBoundary : Node::Kind::kNotWordBoundary;
        } else {
          CKPT_RETURN_IF_ERROR(Escape(e, &atom->set));
        }
        break;
      }
      default: atom->set[static_cast<unsigned char>(c)] = true;
    }
    const Node* term = atom;
    size_t min = 0, max = 0;
    if (Quantifier(&min, &max)) {
      if (atom->kind == Node::Kind::kBol || atom->kind == Node::Kind::kEol ||
          atom->kind == Node::Kind::kWordBoundary || atom->kind == Node::Kind::kNotWordBoundary)
        return Error("an anchor cannot be repeated");
      if (min > max) return Error("{n,m} with n > m");
      if (min > kMaxRepeat || (max != kInfinite && max > kMaxRepeat)) return Error("repeat count over 1000");
      Node* rep = New();
      rep->kind = Node::Kind::kRepeat;
      rep->child = atom;
      rep->min = min;
      rep->max = max;
      if (More() && t_[i_] == '?') {
        rep->greedy = false;
        ++i_;
      }
      term = rep;
      if (More() && (t_[i_] == '*' || t_[i_] == '+' || t_[i_] == '?')) return Error("nothing to repeat");
    }
    seq->push_back(term);
    return Status::Ok();
  }

  // Parses a quantifier at i_ if there is one (with `min` null: only looks).
  bool Quantifier(size_t* min, size_t* max = nullptr) {
    if (!More()) return false;
    const char c = min ? t_[i_] : t_[i_ - 1];
    const size_t at = min ? i_ : i_ - 1;
    if (c == '*' || c == '+' || c == '?') {
      if (min) {
        *min = c == '+' ? 1 : 0;
        *max = c == '?' ? 1 : kInfinite;
        ++i_;
      }
      return true;
    }
    if (c != '{') return false;
    size_t j = at + 1, lo = 0, hi = 0, digits = 0;
    while (j < t_.size() && std::isdigit(static_cast<unsigned char>(t_[j])) && digits < 6) lo = lo * 10 + (t_[j++] - '0'), ++digits;
    if (digits == 0) return false;
    hi = lo;
    if (j < t_.size() && t_[j] == ',') {
      ++j;
      size_t d2 = 0;
      hi = 0;
      while (j < t_.size() && std::isdigit(static_cast<unsigned char>(t_[j])) && d2 < 6) hi = hi * 10 + (t_[j++] - '0'), ++d2;
      if (d2 == 0) hi = kInfinite;
    }
    if (j >= t_.size() || t_[j] != '}') return false;
    if (min) {
      *min = lo;
      *max = hi;
      i_ = j + 1;
    }
    return true;
  }

  Status Escape(char e, std::bitset<256>* set) {
    if (e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 's' || e == 'S') {
      *set |= ClassOf(e);
    } else if (e == 't') {
      set->set('\t');
    } else if (e == 'n') {
      set->set('\n');
    } else if (e == 'r') {
      set->set('\r');
    } else if (std::isalnum(static_cast<unsigned char>(e))) {
      return Error(std::string("unsupported escape '\\") + e + "'");
    } else {
      set->set(static_cast<unsigned char>(e));
    }
    return Status::Ok();
  }

  Status Class(std::bitset<256>* set) {
    bool negate = false;
    if (More() && t_[i_] == '^') {
      negate = true;
      ++i_;
    }
    while (More() && t_[i_] != ']') {  // ECMAScript: [] matches nothing, [^] anything
      int lo;
      if (t_[i_] == '\\') {
        if (++i_ >= t_.size()) return Error("trailing '\\' in a class");
        const char e = t_[i_++];
        if (std::string_view("dDwWsS").find(e) != std::string_view::npos) {
          *set |= ClassOf(e);
          continue;
        }
        std::bitset<256> one;
        CKPT_RETURN_IF_ERROR(Escape(e, &one));
        lo = static_cast<int>(one._Find_first());
      } else {
        lo = static_cast<unsigned char>(t_[i_++]);
      }
      int hi = lo;
      if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
        ++i_;
        if (t_[i_] == '\\') {
          if (++i_ >= t_.size()) return Error("trailing '\\' in a class");
          std::bitset<256> one;
          CKPT_RETURN_IF_ERROR(Escape(t_[i_++], &one));
          if (one.count() != 1) return Error("a class escape cannot end a range");
          hi = static_cast<int>(one._Find_first());
        } else {
          hi = static_cast<unsigned char>(t_[i_++]);
        }
        if (hi < lo) return Error("range out of order in a class");
      }
      for (int c = lo; c <= hi; ++c) set->set(c);
    }
    if (!More()) return Error("missing ']'");
    ++i_;
    if (negate) set->flip();
    return Status::Ok();
  }

  const std::string& t_;
  Node* root_;
  size_t i_ = 0;
  size_t groups_ = 0;
};

// Backtracking matcher: each Match* call tries its node at `pos` and, for each way it can
// match, calls the continuation with the position after it.
class Matcher {
 public:
  using Cont = std::function<bool(size_t)>;
  Matcher(std::string_view s, size_t groups) : s_(s), caps_(groups + 1, {kNone, kNone}) {}

  bool MatchAt(const Node* root, size_t start) {
    return MatchNode(root, start, [](size_t) { return true; });
  }
  std::vector<std::string> Groups() const {
    std::vector<std::string> out;
    for (const auto& [b, e] : caps_) out.push_back(b == kNone || e == kNone ? "" : std::string(s_.substr(b, e - b)));
    return out;
  }
  bool out_of_steps() const { return steps_ > kStepBudget; }
  void Reset() { std::fill(caps_.begin(), caps_.end(), std::pair<size_t, size_t>{kNone, kNone}); }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  bool MatchSeq(const std::vector<const Node*>& seq, size_t i, size_t pos, const Cont& k) {
    if (i == seq.size()) return k(pos);
    return MatchNode(seq[i], pos, [&](size_t p) { return MatchSeq(seq, i + 1, p, k); });
  }

  bool MatchNode(const Node* n, size_t pos, const Cont& k) {
    if (++steps_ > kStepBudget) return false;
    switch (n->kind) {
      case Node::Kind::kSet:
        return pos < s_.size() && n->set[static_cast<unsigned char>(s_[pos])] && k(pos + 1);
      case Node::Kind::kBol: return pos == 0 && k(pos);
      case Node::Kind::kEol: return pos == s_.size() && k(pos);
      case Node::Kind::kWordBoundary:
      case Node::Kind::kNotWordBoundary: {
        const bool before = pos > 0 && IsWord(static_cast<unsigned char>(s_[pos - 1]));
        const bool after = pos < s_.size() && IsWord(static_cast<unsigned char>(s_[pos]));
        return ((before != after) == (n->kind == Node::Kind::kWordBoundary)) && k(pos);
      }
      case Node::Kind::kGroup: {
        for (const auto& alt : n->alts) {
          if (n->capture < 0) {
            if (MatchSeq(alt, 0, pos, k)) return true;
            continue;
          }
          const auto saved = caps_[n->capture];
          const bool ok = MatchSeq(alt, 0, pos, [&](size_t end) {
            const auto inner = caps_[n->capture];
            caps_[n->capture] = {pos, end};
            if (k(end)) return true;
            caps_[n->capture] = inner;
            return false;
          });
          if (ok) return true;
          caps_[n->capture] = saved;
        }
        return false;
      }
      case Node::Kind::kRepeat: return Repeat(n, 0, pos, k);
    }
    return false;
  }

  bool Repeat(const Node* n, size_t count, size_t pos, const Cont& k) {
    if (count >= n->min && !n->greedy && k(pos)) return true;
    if (count < n->max &&
        MatchNode(n->child, pos, [&](size_t p) { return (p != pos || count < n->min) && Repeat(n, count + 1, p, k); }))
      return true;
    return count >= n->min && n->greedy && k(pos);
  }

  std::string_view s_;
  std::vector<std::pair<size_t, size_t>> caps_;
  size_t steps_ = 0;
};

}  // namespace

Result<Pattern> Pattern::Compile(const std::string& text) {
  auto root = std::make_shared<Node>();
  Parser parser(text, root.get());
  CKPT_RETURN_IF_ERROR(parser.Parse());
  Pattern p;
  p.text_ = text;
  p.groups_ = parser.groups();
  p.root_ = std::move(root);
  return p;
}

Result<std::vector<std::string>> Pattern::Search(std::string_view subject) const {
  if (subject.size() > kMaxSubject)
    return InvalidArgument("pattern /" + text_ + "/: a name of " + std::to_string(subject.size()) +
                           " bytes is longer than the " + std::to_string(kMaxSubject) + " that patterns are matched against");
  Matcher m(subject, groups_);
  for (size_t start = 0; start <= subject.size(); ++start) {
    m.Reset();
    if (m.MatchAt(root_.get(), start)) return m.Groups();
    if (m.out_of_steps())
      return InvalidArgument("pattern /" + text_ + "/ needs too many backtracking steps on '" + std::string(subject) +
                             "': simplify it (nested quantifiers such as (a*)* backtrack exponentially)");
  }
  return std::vector<std::string>{};
}

std::string Pattern::Expand(const std::string& format, const std::vector<std::string>& groups) {
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '$' || i + 1 == format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char c = format[i + 1];
    if (c == '$') {
      out.push_back('$');
      ++i;
    } else if (c == '&') {
      if (!groups.empty()) out += groups[0];
      ++i;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t n = c - '0', used = 1;
      if (i + 2 < format.size() && std::isdigit(static_cast<unsigned char>(format[i + 2])) &&
          n * 10 + (format[i + 2] - '0') < groups.size()) {
        n = n * 10 + (format[i + 2] - '0');
        used = 2;
      }
      if (n < groups.size()) out += groups[n];
      i += used;
    } else {
      out.push_back('$');
    }
  }
  return out;
}

}  // namespace ckpt
