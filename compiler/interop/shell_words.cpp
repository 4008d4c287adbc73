#include "compiler/interop/shell_words.h"

#include <cctype>
#include <optional>
#include <string_view>

namespace paraplan::interop {
namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Blanks and the operators that separate commands: the end of a word.
bool IsBlankOrOperator(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ';' || c == '|' || c == '&';
}

// A word being scanned: its text so far and what was seen of its quoting and assignment.
struct PendingWord {
  uint32_t begin = 0;
  std::string value;       // after quote removal and expansion
  std::string unresolved;  // a variable it uses that the script does not set
  bool list = false;       // it expands a variable holding several words
  bool assignment = false;
  uint32_t value_begin = 0;   // where the assigned value starts (after NAME=)
  bool quoted_value = false;  // the whole value is one quoted string
  uint32_t quote_begin = 0;   // that string, without its quotes
  uint32_t quote_end = 0;

  // Whether a quote at `i` opens the word's value (after NAME= in an assignment).
  bool IsValueStart(uint32_t i) const {
    return (assignment && i == value_begin) || (!assignment && i == begin);
  }
  void MarkQuoted(uint32_t open, uint32_t close) {
    quoted_value = true;
    quote_begin = open + 1;
    quote_end = close;
  }
};

class Scanner {
 public:
  Scanner(std::string_view text, uint32_t buffer, ShellScript& out)
      : text_(text), buffer_(buffer), out_(out) {}

  // Scans [begin, end) into words; `sbatch` marks the words of a directive.
  void Scan(uint32_t begin, uint32_t end, bool sbatch) {
    uint32_t i = begin;
    while (i < end) {
      char c = text_[i];
      if (c == '\\' && i + 1 < end && text_[i + 1] == '\n') {
        i += 2;
        continue;
      }
      if (IsBlankOrOperator(c)) {
        ++i;
        continue;
      }
      if (c == '#') {
        uint32_t eol = LineEnd(i, end);
        std::string_view line = text_.substr(i, eol - i);
        if (!sbatch && line.substr(0, 7) == "#SBATCH") Scan(i + 7, eol, true);
        i = eol;
        continue;
      }
      if (c == '(' || c == ')') {
        Emit({std::string(1, c), {buffer_, i, i + 1}, {}, sbatch, false});
        ++i;
        continue;
      }
      i = Word(i, end, sbatch);
    }
  }

 private:
  uint32_t LineEnd(uint32_t i, uint32_t end) const {
    while (i < end && text_[i] != '\n') ++i;
    return i;
  }

  void Emit(ShellWord w) { out_.words.push_back(std::move(w)); }

  // The first unterminated quote or `${` is the one reported.
  void MarkUnterminated(SourceRange at) {
    if (!out_.unterminated.IsValid()) out_.unterminated = at;
  }

  // Expands `$...` at i (text_[i] == '$') into `w`; returns the index after it.
  uint32_t Expand(uint32_t i, uint32_t end, PendingWord& w) {
    uint32_t j = i + 1;
    if (j < end && text_[j] == '{') return ExpandBraced(i, end, w);
    if (j < end && text_[j] == '(') {
      // $(command) or $((arithmetic)): not evaluated.
      int depth = 0;
      uint32_t k = j;
      for (; k < end; ++k) {
        if (text_[k] == '(') ++depth;
        if (text_[k] == ')' && --depth == 0) break;
      }
      w.unresolved = std::string(text_.substr(i, (k < end ? k + 1 : end) - i));
      return k < end ? k + 1 : end;
    }
    if (j < end && IsNameStart(text_[j])) {
      std::string name;
      while (j < end && IsNameChar(text_[j])) name += text_[j++];
      auto it = out_.variables.find(name);
      if (it == out_.variables.end()) {
        w.unresolved = name;
      } else {
        w.value += it->second;
        if (it->second.find_first_of(" \t\n") != std::string::npos) w.list = true;
      }
      return j;
    }
    if (j < end && (std::isdigit(static_cast<unsigned char>(text_[j])) || text_[j] == '@' ||
                    text_[j] == '*' || text_[j] == '#' || text_[j] == '?')) {
      w.unresolved = std::string(text_.substr(i, 2));
      return j + 1;
    }
    w.value += '$';
    return j;
  }

  // `${NAME}`, `${NAME:-default}`, `${NAME-default}` or `${ARR[@]}` at i; returns the index
  // after its `}`.
  uint32_t ExpandBraced(uint32_t i, uint32_t end, PendingWord& w) {
    const uint32_t open = i + 1;
    uint32_t close = open + 1;
    int depth = 1;
    while (close < end && depth > 0) {
      if (text_[close] == '{') ++depth;
      if (text_[close] == '}') --depth;
      if (depth > 0) ++close;
    }
    if (close >= end) {
      MarkUnterminated({buffer_, i, i + 2});
      return end;
    }
    std::string_view inner = text_.substr(open + 1, close - open - 1);
    std::string name;
    size_t k = 0;
    while (k < inner.size() && IsNameChar(inner[k])) name += inner[k++];
    std::string_view rest = inner.substr(k);
    if (!rest.empty() && rest[0] == '[') {
      // ${ARR[@]}: an array's words were scanned where the array was written.
      w.list = true;
      return close + 1;
    }
    auto it = out_.variables.find(name);
    bool set = it != out_.variables.end();
    if (rest.substr(0, 2) == ":-" || rest.substr(0, 1) == "-") {
      std::string_view def = rest.substr(rest[0] == ':' ? 2 : 1);
      if (set && !(rest[0] == ':' && it->second.empty())) {
        w.value += it->second;
      } else {
        ExpandDefault(def, w);
      }
    } else if (set) {
      w.value += it->second;
    } else {
      w.unresolved = name;
    }
    if (set && it->second.find_first_of(" \t\n") != std::string::npos) w.list = true;
    return close + 1;
  }

  // The default of `${NAME:-default}`: a word, or itself a variable (${NODES:-$SLURM_NNODES}).
  void ExpandDefault(std::string_view def, PendingWord& w) const {
    std::string d(def);
    if (!d.empty() && d[0] == '$') {
      std::string_view dn = std::string_view(d).substr(1);
      if (!dn.empty() && dn[0] == '{') dn = dn.substr(1, dn.size() >= 2 ? dn.size() - 2 : 0);
      auto dv = out_.variables.find(std::string(dn));
      if (dv != out_.variables.end()) {
        w.value += dv->second;
      } else {
        w.unresolved = std::string(dn);
      }
      return;
    }
    if (d.size() >= 2 && (d.front() == '"' || d.front() == '\'') && d.back() == d.front()) {
      d = d.substr(1, d.size() - 2);
    }
    w.value += d;
  }

  // Whether the `=` at i ends the NAME of an assignment `NAME=value`.
  bool EndsAssignedName(const PendingWord& w, uint32_t i) const {
    if (w.assignment || i <= w.begin) return false;
    std::string_view name = text_.substr(w.begin, i - w.begin);
    bool is_name = IsNameStart(name[0]);
    for (char n : name) is_name = is_name && IsNameChar(n);
    return is_name && w.value.size() == name.size();
  }

  // A '...' string at i; returns the index after it, nullopt when it is never closed.
  std::optional<uint32_t> SingleQuoted(uint32_t i, uint32_t end, PendingWord& w) {
    uint32_t close = i + 1;
    while (close < end && text_[close] != '\'') ++close;
    if (close >= end) {
      MarkUnterminated({buffer_, i, i + 1});
      return std::nullopt;
    }
    if (w.IsValueStart(i)) w.MarkQuoted(i, close);
    w.value.append(text_.substr(i + 1, close - i - 1));
    return close + 1;
  }

  // A "..." string at i, with its escapes and expansions; returns the index after it, nullopt
  // when it is never closed.
  std::optional<uint32_t> DoubleQuoted(uint32_t i, uint32_t end, PendingWord& w) {
    uint32_t j = i + 1;
    while (j < end && text_[j] != '"') {
      if (text_[j] == '\\' && j + 1 < end) {
        if (text_[j + 1] != '\n') w.value += text_[j + 1];
        j += 2;
      } else if (text_[j] == '$') {
        j = Expand(j, end, w);
      } else {
        w.value += text_[j++];
      }
    }
    if (j >= end) {
      MarkUnterminated({buffer_, i, i + 1});
      return std::nullopt;
    }
    if (w.IsValueStart(i)) w.MarkQuoted(i, j);
    return j + 1;
  }

  // One word starting at i; returns the index after it.
  uint32_t Word(uint32_t i, uint32_t end, bool sbatch) {
    PendingWord w;
    w.begin = i;
    while (i < end) {
      char c = text_[i];
      // NAME=( starts an array: the '(' is its own word.
      if (IsBlankOrOperator(c) || c == '(' || c == ')') break;
      if (c == '=' && EndsAssignedName(w, i)) {
        w.assignment = true;
        w.value_begin = i + 1;
        w.value += c;
        ++i;
        continue;
      }
      if (c == '\\') {
        if (i + 1 < end && text_[i + 1] == '\n') {
          i += 2;
          break;
        }
        if (i + 1 < end) w.value += text_[i + 1];
        i += 2;
        continue;
      }
      if (c == '\'' || c == '"') {
        std::optional<uint32_t> next =
            c == '\'' ? SingleQuoted(i, end, w) : DoubleQuoted(i, end, w);
        if (!next) return end;
        i = *next;
        continue;
      }
      if (c == '$') {
        i = Expand(i, end, w);
        continue;
      }
      w.value += c;
      ++i;
    }
    if (i == w.begin) return i + 1;
    if (w.assignment) {
      Assign(w, i, sbatch);
    } else if (w.quoted_value && w.quote_end == i - 1 && !w.value.empty() && w.value[0] == '-' &&
               w.value.find_first_of(" \t") != std::string::npos) {
      // "--fp8-format hybrid" as one array item: a flag and its value in one quoted word.
      Scan(w.quote_begin, w.quote_end, sbatch);
    } else {
      Emit({std::move(w.value), {buffer_, w.begin, i}, std::move(w.unresolved), sbatch, w.list});
    }
    return i;
  }

  // The assignment `NAME=value` ending at `end`: the variable, and the flags its value holds.
  void Assign(const PendingWord& w, uint32_t end, bool sbatch) {
    std::string name = w.value.substr(0, w.value.find('='));
    std::string assigned = w.value.substr(name.size() + 1);
    out_.variables[name] = assigned;
    if (w.quoted_value && w.quote_end == end - 1 &&
        assigned.find_first_of(" \t\n") != std::string::npos) {
      // A list of words in one string: its flags are scanned where they are written.
      Scan(w.quote_begin, w.quote_end, sbatch);
    } else if (!assigned.empty() && assigned[0] == '-' && end > w.value_begin) {
      // OPTS=--use-distributed-optimizer: a flag held in a variable.
      Emit({assigned, {buffer_, w.value_begin, end}, w.unresolved, sbatch, w.list});
    }
  }

  std::string_view text_;
  uint32_t buffer_;
  ShellScript& out_;
};

}  // namespace

ShellScript ScanShellScript(const SourceManager& sm, uint32_t buffer) {
  ShellScript script;
  std::string_view text = sm.Text(buffer);
  Scanner scanner(text, buffer, script);
  scanner.Scan(0, static_cast<uint32_t>(text.size()), false);
  return script;
}

}  // namespace paraplan::interop
