#include "compiler/interop/shell_words.h"

#include <cctype>
#include <string_view>

namespace paraplan::interop {
namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

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
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ';' || c == '|' || c == '&') {
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

  // Expands `$...` at i (text_[i] == '$'); appends to *value; returns the index after it.
  uint32_t Expand(uint32_t i, uint32_t end, std::string* value, std::string* unresolved,
                  bool* list) {
    uint32_t j = i + 1;
    if (j < end && text_[j] == '{') {
      uint32_t close = j + 1;
      int depth = 1;
      while (close < end && depth > 0) {
        if (text_[close] == '{') ++depth;
        if (text_[close] == '}') --depth;
        if (depth > 0) ++close;
      }
      if (close >= end) {
        if (!out_.unterminated.IsValid()) out_.unterminated = {buffer_, i, i + 2};
        return end;
      }
      std::string_view inner = text_.substr(j + 1, close - j - 1);
      std::string name;
      size_t k = 0;
      while (k < inner.size() && IsNameChar(inner[k])) name += inner[k++];
      std::string_view rest = inner.substr(k);
      if (!rest.empty() && rest[0] == '[') {
        // ${ARR[@]}: an array's words were scanned where the array was written.
        *list = true;
        return close + 1;
      }
      auto it = out_.variables.find(name);
      bool set = it != out_.variables.end();
      if (rest.substr(0, 2) == ":-" || rest.substr(0, 1) == "-") {
        std::string_view def = rest.substr(rest[0] == ':' ? 2 : 1);
        if (set && !(rest[0] == ':' && it->second.empty())) {
          *value += it->second;
        } else {
          // The default may itself expand a variable: ${NODES:-$SLURM_NNODES}.
          std::string d(def);
          if (!d.empty() && d[0] == '$') {
            std::string_view dn = std::string_view(d).substr(1);
            if (!dn.empty() && dn[0] == '{') dn = dn.substr(1, dn.size() >= 2 ? dn.size() - 2 : 0);
            auto dv = out_.variables.find(std::string(dn));
            if (dv != out_.variables.end()) {
              *value += dv->second;
            } else {
              *unresolved = std::string(dn);
            }
          } else {
            if (d.size() >= 2 && (d.front() == '"' || d.front() == '\'') && d.back() == d.front()) {
              d = d.substr(1, d.size() - 2);
            }
            *value += d;
          }
        }
      } else if (set) {
        *value += it->second;
      } else {
        *unresolved = name;
      }
      if (set && it->second.find_first_of(" \t\n") != std::string::npos) *list = true;
      return close + 1;
    }
    if (j < end && text_[j] == '(') {
      // $(command) or $((arithmetic)): not evaluated.
      int depth = 0;
      uint32_t k = j;
      for (; k < end; ++k) {
        if (text_[k] == '(') ++depth;
        if (text_[k] == ')' && --depth == 0) break;
      }
      *unresolved = std::string(text_.substr(i, (k < end ? k + 1 : end) - i));
      return k < end ? k + 1 : end;
    }
    if (j < end && IsNameStart(text_[j])) {
      std::string name;
      while (j < end && IsNameChar(text_[j])) name += text_[j++];
      auto it = out_.variables.find(name);
      if (it == out_.variables.end()) {
        *unresolved = name;
      } else {
        *value += it->second;
        if (it->second.find_first_of(" \t\n") != std::string::npos) *list = true;
      }
      return j;
    }
    if (j < end && (std::isdigit(static_cast<unsigned char>(text_[j])) || text_[j] == '@' ||
                    text_[j] == '*' || text_[j] == '#' || text_[j] == '?')) {
      *unresolved = std::string(text_.substr(i, 2));
      return j + 1;
    }
    *value += '$';
    return j;
  }

  // One word starting at i; returns the index after it.
  uint32_t Word(uint32_t i, uint32_t end, bool sbatch) {
    const uint32_t begin = i;
    std::string value;
    std::string unresolved;
    bool list = false;
    bool assignment = false;
    uint32_t value_begin = 0;   // where the assigned value starts (after NAME=)
    bool quoted_value = false;  // the whole value is one quoted string
    uint32_t quote_begin = 0, quote_end = 0;
    while (i < end) {
      char c = text_[i];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ';' || c == '|' || c == '&' ||
          c == ')' || (c == '(' && !(assignment && i == value_begin))) {
        break;
      }
      if (c == '(') break;  // NAME=( starts an array: the '(' is its own word
      if (c == '=' && !assignment && i > begin) {
        std::string_view name = text_.substr(begin, i - begin);
        bool is_name = IsNameStart(name[0]);
        for (char n : name) is_name = is_name && IsNameChar(n);
        if (is_name && value.size() == name.size()) {
          assignment = true;
          value_begin = i + 1;
          value += c;
          ++i;
          continue;
        }
      }
      if (c == '\\') {
        if (i + 1 < end && text_[i + 1] == '\n') {
          i += 2;
          break;
        }
        if (i + 1 < end) value += text_[i + 1];
        i += 2;
        continue;
      }
      if (c == '\'') {
        uint32_t close = i + 1;
        while (close < end && text_[close] != '\'') ++close;
        if (close >= end) {
          if (!out_.unterminated.IsValid()) out_.unterminated = {buffer_, i, i + 1};
          return end;
        }
        if ((assignment && i == value_begin) || (!assignment && i == begin)) {
          quoted_value = true;
          quote_begin = i + 1;
          quote_end = close;
        }
        value.append(text_.substr(i + 1, close - i - 1));
        i = close + 1;
        continue;
      }
      if (c == '"') {
        uint32_t j = i + 1;
        while (j < end && text_[j] != '"') {
          if (text_[j] == '\\' && j + 1 < end) {
            if (text_[j + 1] != '\n') value += text_[j + 1];
            j += 2;
          } else if (text_[j] == '$') {
            j = Expand(j, end, &value, &unresolved, &list);
          } else {
            value += text_[j++];
          }
        }
        if (j >= end) {
          if (!out_.unterminated.IsValid()) out_.unterminated = {buffer_, i, i + 1};
          return end;
        }
        if ((assignment && i == value_begin) || (!assignment && i == begin)) {
          quoted_value = true;
          quote_begin = i + 1;
          quote_end = j;
        }
        i = j + 1;
        continue;
      }
      if (c == '$') {
        i = Expand(i, end, &value, &unresolved, &list);
        continue;
      }
      value += c;
      ++i;
    }
    if (i == begin) return i + 1;
    if (assignment) {
      std::string name = value.substr(0, value.find('='));
      std::string assigned = value.substr(name.size() + 1);
      out_.variables[name] = assigned;
      if (quoted_value && quote_end == i - 1 &&
          assigned.find_first_of(" \t\n") != std::string::npos) {
        // A list of words in one string: its flags are scanned where they are written.
        Scan(quote_begin, quote_end, sbatch);
      } else if (!assigned.empty() && assigned[0] == '-' && i > value_begin) {
        // OPTS=--use-distributed-optimizer: a flag held in a variable.
        Emit({assigned, {buffer_, value_begin, i}, unresolved, sbatch, list});
      }
      return i;
    }
    // "--fp8-format hybrid" as one array item: a flag and its value in one quoted word.
    if (quoted_value && quote_end == i - 1 && !value.empty() && value[0] == '-' &&
        value.find_first_of(" \t") != std::string::npos) {
      Scan(quote_begin, quote_end, sbatch);
      return i;
    }
    Emit({std::move(value), {buffer_, begin, i}, std::move(unresolved), sbatch, list});
    return i;
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
