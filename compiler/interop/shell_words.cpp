#include "compiler/interop/shell_words.h"

#include <cctype>
#include <map>
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
  std::string unresolved;  // a variable it uses that the script does not set, or a form
  std::string why;         // why `unresolved` has no value, when that is not the reason
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
        Emit({std::string(1, c), {buffer_, i, i + 1}, {}, {}, sbatch, false});
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
      if (out_.variables.count(name)) {
        AppendVariable(name, w);
      } else {
        w.unresolved = name;
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

  // `${...}` at i; returns the index after its `}`. Read: `${NAME}`, `${ARR[@]}` and the
  // operators of a default, an assigned default, an alternative and an error, with and without
  // the colon (`${NAME:-word}`, `-`, `:=`, `=`, `:+`, `+`, `:?`, `?`), their word expanded as the
  // shell does (`${A:-${B:-12}}`). Any other form is refused, never read as empty.
  uint32_t ExpandBraced(uint32_t i, uint32_t end, PendingWord& w) {
    const uint32_t close = BraceEnd(i + 2, end);
    if (close >= end) {
      MarkUnterminated({buffer_, i, i + 2});
      return end;
    }
    const uint32_t inner_begin = i + 2;
    const std::string_view inner = text_.substr(inner_begin, close - inner_begin);
    const std::string written(text_.substr(i, close + 1 - i));
    std::string name;
    size_t k = 0;
    while (k < inner.size() && IsNameChar(inner[k])) name += inner[k++];
    const std::string_view rest = inner.substr(k);
    if (name.empty()) {
      // ${@}, ${#} ...: the script's arguments and the shell's state, never set in the script.
      if (inner.size() == 1 && std::string_view("@*#?$!-").find(inner[0]) != std::string_view::npos)
        w.unresolved = written;
      else
        Refuse(written,
               inner.empty()     ? "empty expansion (`${}`)"
               : inner[0] == '#' ? "length (`${#NAME}`)"
               : inner[0] == '!' ? "indirect expansion (`${!NAME}`)"
                                 : "expansion",
               w);
      return close + 1;
    }
    if (!rest.empty() && rest[0] == '[') {
      // ${ARR[@]}: an array's words were scanned where the array was written.
      w.list = true;
      return close + 1;
    }
    const bool colon = rest.size() >= 2 && rest[0] == ':' &&
                       std::string_view("-=+?").find(rest[1]) != std::string_view::npos;
    const char op = rest.empty() ? '\0' : rest[colon ? 1 : 0];
    if (!rest.empty() && std::string_view("-=+?").find(op) == std::string_view::npos) {
      Refuse(written, UnreadForm(rest), w);
      return close + 1;
    }
    const auto it = out_.variables.find(name);
    const bool set = it != out_.variables.end();
    // The colon forms take an empty value as unset.
    const bool present = set && !(colon && it->second.empty());
    const uint32_t word_begin = inner_begin + static_cast<uint32_t>(k) + (colon ? 2 : 1);
    switch (op) {
      case '\0':
        if (set) {
          AppendVariable(name, w);
        } else {
          w.unresolved = name;
        }
        break;
      case '-':
        if (present) {
          AppendVariable(name, w);
        } else {
          AppendWord(ExpandOperand(word_begin, close), w);
        }
        break;
      case '=':
        if (present) {
          AppendVariable(name, w);
        } else {
          PendingWord assigned = ExpandOperand(word_begin, close);
          SetVariable(name, assigned);
          AppendWord(std::move(assigned), w);
        }
        break;
      case '+':
        if (present) AppendWord(ExpandOperand(word_begin, close), w);
        break;
      case '?':
        if (present) {
          AppendVariable(name, w);
        } else {
          // The shell stops there, printing `NAME: message`.
          const std::string message = ExpandOperand(word_begin, close).value;
          w.unresolved = written;
          w.why = "which stops the shell: `" + name + "` is not set in the script (" + name + ": " +
                  (message.empty() ? "parameter null or not set" : message) + ")";
        }
        break;
      default:
        break;
    }
    return close + 1;
  }

  // The `}` that closes the `${` whose inside starts at i (quotes and nested `${...}` skipped);
  // `end` when there is none.
  uint32_t BraceEnd(uint32_t i, uint32_t end) const {
    int depth = 1;
    for (; i < end; ++i) {
      const char c = text_[i];
      if (c == '\\') {
        ++i;
      } else if (c == '\'' || c == '"') {
        uint32_t q = i + 1;
        while (q < end && text_[q] != c) q += c == '"' && text_[q] == '\\' ? 2 : 1;
        if (q >= end) return end;
        i = q;
      } else if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        return i;
      }
    }
    return end;
  }

  // The word of `${NAME:-word}` in [begin, end), expanded as a word of the script is: quotes
  // removed, escapes and `$` expansions read.
  PendingWord ExpandOperand(uint32_t begin, uint32_t end) {
    PendingWord o;
    o.begin = begin;
    uint32_t j = begin;
    while (j < end) {
      const char c = text_[j];
      if (c == '\\' && j + 1 < end) {
        if (text_[j + 1] != '\n') o.value += text_[j + 1];
        j += 2;
      } else if (c == '\'' || c == '"') {
        const std::optional<uint32_t> next =
            c == '\'' ? SingleQuoted(j, end, o) : DoubleQuoted(j, end, o);
        if (!next) break;
        j = *next;
      } else if (c == '$') {
        j = Expand(j, end, o);
      } else {
        o.value += c;
        ++j;
      }
    }
    return o;
  }

  // A variable's value (it is set) into `w`; one holding several words is a list, one assigned
  // from what planc cannot read passes that on.
  void AppendVariable(const std::string& name, PendingWord& w) const {
    const std::string& value = out_.variables.at(name);
    w.value += value;
    if (value.find_first_of(" \t\n") != std::string::npos) w.list = true;
    if (auto unknown = unknown_.find(name); unknown != unknown_.end()) {
      w.unresolved = unknown->second.unresolved;
      w.why = unknown->second.why;
    }
  }

  // An expanded word into `w`, with what it could not read.
  static void AppendWord(PendingWord word, PendingWord& w) {
    w.value += word.value;
    w.list = w.list || word.list;
    if (!word.unresolved.empty()) {
      w.unresolved = std::move(word.unresolved);
      w.why = std::move(word.why);
    }
  }

  // An expansion form planc does not evaluate: the word has no value it can read.
  static void Refuse(const std::string& written, std::string_view form, PendingWord& w) {
    w.unresolved = written;
    w.why = "a " + std::string(form) + " that planc does not evaluate";
  }

  // What `${NAME<rest>}` does, for a form planc does not read.
  static std::string_view UnreadForm(std::string_view rest) {
    switch (rest[0]) {
      case '#':
        return "prefix removal (`#`)";
      case '%':
        return "suffix removal (`%`)";
      case '/':
        return "pattern substitution (`/`)";
      case ':':
        return "substring (`:offset`)";
      case '^':
      case ',':
        return "case conversion (`^`, `,`)";
      case '@':
        return "transformation (`@`)";
      default:
        return "expansion";
    }
  }

  // NAME set to an expanded word: what it could not read stays with the variable.
  void SetVariable(const std::string& name, const PendingWord& value) {
    out_.variables[name] = value.value;
    if (value.unresolved.empty()) {
      unknown_.erase(name);
    } else {
      unknown_[name] = {value.unresolved, value.why};
    }
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
      Emit({std::move(w.value),
            {buffer_, w.begin, i},
            std::move(w.unresolved),
            std::move(w.why),
            sbatch,
            w.list});
    }
    return i;
  }

  // The assignment `NAME=value` ending at `end`: the variable, and the flags its value holds.
  void Assign(const PendingWord& w, uint32_t end, bool sbatch) {
    std::string name = w.value.substr(0, w.value.find('='));
    std::string assigned = w.value.substr(name.size() + 1);
    PendingWord value;
    value.value = assigned;
    value.unresolved = w.unresolved;
    value.why = w.why;
    SetVariable(name, value);
    if (w.quoted_value && w.quote_end == end - 1 &&
        assigned.find_first_of(" \t\n") != std::string::npos) {
      // A list of words in one string: its flags are scanned where they are written.
      Scan(w.quote_begin, w.quote_end, sbatch);
    } else if (!assigned.empty() && assigned[0] == '-' && end > w.value_begin) {
      // OPTS=--use-distributed-optimizer: a flag held in a variable.
      Emit({assigned, {buffer_, w.value_begin, end}, w.unresolved, w.why, sbatch, w.list});
    }
  }

  // A variable assigned from what planc cannot read, and why.
  struct Unknown {
    std::string unresolved;
    std::string why;
  };

  std::string_view text_;
  uint32_t buffer_;
  ShellScript& out_;
  std::map<std::string, Unknown> unknown_;
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
