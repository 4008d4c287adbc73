#include "compiler/diagnostics/render.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "compiler/diagnostics/render_internal.h"

namespace paraplan {
using namespace render_internal;
namespace {

// Length in bytes of the UTF-8 sequence starting at text[i]; 0 when it is not a valid one.
size_t Utf8Length(std::string_view text, size_t i) {
  auto c = static_cast<unsigned char>(text[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  }
  if (n == 2 && c < 0xC2) return 0;  // overlong
  return n;
}

// A source line as it is drawn: tabs expanded, control bytes and broken UTF-8 replaced, and
// for every byte of the original line the display column (0-based) it starts at.
struct DisplayLine {
  std::string text;
  std::vector<uint32_t> column_of_byte;  // size = bytes + 1; last entry = display width
};

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr uint32_t kTabWidth = 4;

DisplayLine MakeDisplayLine(std::string_view line) {
  DisplayLine d;
  d.column_of_byte.resize(line.size() + 1);
  uint32_t col = 0;
  size_t i = 0;
  while (i < line.size()) {
    auto c = static_cast<unsigned char>(line[i]);
    size_t n = 1;
    if (c == '\t') {
      d.column_of_byte[i] = col;
      d.text.append(kTabWidth, ' ');
      col += kTabWidth;
    } else if (c < 0x20 || c == 0x7F) {
      d.column_of_byte[i] = col;
      d.text += kReplacement;
      col += 1;
    } else if ((n = Utf8Length(line, i)) == 0) {
      n = 1;
      d.column_of_byte[i] = col;
      d.text += kReplacement;
      col += 1;
    } else {
      for (size_t k = 0; k < n; ++k) d.column_of_byte[i + k] = col;
      d.text.append(line.substr(i, n));
      col += 1;
    }
    i += n;
  }
  d.column_of_byte[line.size()] = col;
  return d;
}

// Messages are drawn on one terminal line each; keep them printable.
std::string Printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += '\n';
      ++i;
      continue;
    }
    if (c == '\t') {
      out += ' ';
      ++i;
      continue;
    }
    size_t n = (c < 0x20 || c == 0x7F) ? 0 : Utf8Length(s, i);
    if (n == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string OneLine(std::string_view s) {
  std::string out = Printable(s);
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

std::string LocationText(const SourceManager& sm, const SafeRange& r) {
  LineColumn lc = sm.Position(r.buffer, r.begin);
  return OneLine(sm.Name(r.buffer)) + ":" + std::to_string(lc.line) + ":" +
         std::to_string(lc.column);
}

// --- Text form ------------------------------------------------------------------------------

struct Glyphs {
  std::string_view top, bar, gap, vbar;
};
constexpr Glyphs kUnicode{"┌─", "│", "·", "│"};
constexpr Glyphs kAscii{"-->", "|", ":", "|"};

struct Style {
  bool on = false;
  std::string Wrap(std::string_view code, std::string_view s) const {
    if (!on || s.empty()) return std::string(s);
    return "\x1b[" + std::string(code) + "m" + std::string(s) + "\x1b[0m";
  }
};

std::string_view LevelColor(DiagLevel level) {
  switch (level) {
    case DiagLevel::kError:
      return "1;31";
    case DiagLevel::kWarning:
      return "1;33";
    case DiagLevel::kNote:
      return "1;36";
  }
  return "1";
}

// One underlined range on one line, in display columns.
struct Annotation {
  uint32_t start = 0;
  uint32_t end = 0;  // exclusive, > start
  bool primary = false;
  std::string label;
};

struct LineAnnotations {
  uint32_t line = 0;
  std::vector<Annotation> annotations;
};

struct Section {
  uint32_t buffer = 0;
  SafeRange anchor;  // for the header location
  std::map<uint32_t, std::vector<Annotation>> lines;
};

void AddToSection(const SourceManager& sm, Section& section, const SafeRange& r, bool primary,
                  const std::string& label) {
  LineColumn lc = sm.Position(r.buffer, r.begin);
  LineColumn end_lc = sm.Position(r.buffer, r.end);
  std::string_view line = sm.Line(r.buffer, lc.line);
  DisplayLine d = MakeDisplayLine(line);
  uint32_t start_byte = std::min<uint32_t>(lc.column - 1, line.size());
  uint32_t end_byte = end_lc.line == lc.line ? std::min<uint32_t>(end_lc.column - 1, line.size())
                                             : static_cast<uint32_t>(line.size());
  Annotation a;
  a.start = d.column_of_byte[start_byte];
  a.end = std::max(d.column_of_byte[std::max(end_byte, start_byte)], a.start + 1);
  a.primary = primary;
  a.label = OneLine(label);
  section.lines[lc.line].push_back(std::move(a));
}

std::string Spaces(size_t n) { return std::string(n, ' '); }

void RenderLineAnnotations(std::string& out, const std::string& gutter_blank,
                           std::vector<Annotation> anns, const Glyphs& g, const Style& st) {
  std::stable_sort(anns.begin(), anns.end(),
                   [](const Annotation& a, const Annotation& b) { return a.start < b.start; });
  uint32_t width = 0;
  for (const Annotation& a : anns) width = std::max(width, a.end);
  // Row of markers; the primary wins where ranges overlap.
  std::string marks(width, ' ');
  std::vector<bool> is_primary(width, false);
  for (const Annotation& a : anns) {
    for (uint32_t c = a.start; c < a.end; ++c) {
      if (is_primary[c]) continue;
      marks[c] = a.primary ? '^' : '-';
      is_primary[c] = a.primary;
    }
  }
  std::string row = gutter_blank + std::string(g.bar) + " ";
  if (st.on) {
    // Colour runs of equal markers.
    size_t i = 0;
    while (i < marks.size()) {
      size_t j = i;
      while (j < marks.size() && marks[j] == marks[i]) ++j;
      std::string run = marks.substr(i, j - i);
      row += marks[i] == '^' ? st.Wrap("1;31", run) : marks[i] == '-' ? st.Wrap("1;34", run) : run;
      i = j;
    }
  } else {
    row += marks;
  }
  const Annotation& last = anns.back();
  if (!last.label.empty()) {
    row += " " + st.Wrap(last.primary ? "1;31" : "1;34", last.label);
  }
  while (!row.empty() && row.back() == ' ') row.pop_back();
  out += row + "\n";
  // The other labels hang below on connectors, rightmost first.
  std::vector<const Annotation*> pending;
  for (size_t i = 0; i + 1 < anns.size(); ++i) {
    if (!anns[i].label.empty()) pending.push_back(&anns[i]);
  }
  if (pending.empty()) return;
  auto connectors = [&](size_t count) {
    std::string r = gutter_blank + std::string(g.bar) + " ";
    uint32_t col = 0;
    for (size_t k = 0; k < count; ++k) {
      const Annotation* p = pending[k];
      if (p->start < col) continue;
      r += Spaces(p->start - col);
      r += st.Wrap(p->primary ? "1;31" : "1;34", g.vbar);
      col = p->start + 1;
    }
    return r;
  };
  out += connectors(pending.size()) + "\n";
  for (size_t k = pending.size(); k-- > 0;) {
    const Annotation* p = pending[k];
    std::string r = connectors(k);
    uint32_t col = 0;
    for (size_t q = 0; q < k; ++q) {
      if (pending[q]->start >= col) col = pending[q]->start + 1;
    }
    if (p->start >= col) {
      r += Spaces(p->start - col);
    } else {
      r += " ";
    }
    r += st.Wrap(p->primary ? "1;31" : "1;34", p->label);
    out += r + "\n";
  }
}

size_t DisplayWidth(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Appends `= head: body`, the body's own lines kept, long lines wrapped at spaces so that no
// line passes kWrapColumn where it can be helped; continuation lines align after "head: ".
constexpr size_t kWrapColumn = 100;

void AppendIndented(std::string& out, const std::string& prefix, std::string_view head,
                    std::string_view body, const Style& st) {
  std::string text = Printable(body);
  std::string lead = prefix + "= " + st.Wrap("1", head) + ": ";
  size_t indent = prefix.size() + 2 + head.size() + 2;
  size_t room = kWrapColumn > indent + 20 ? kWrapColumn - indent : 20;
  size_t pos = 0;
  bool first = true;
  auto emit = [&](std::string_view part) {
    out += first ? lead : Spaces(indent);
    out += part;
    out += "\n";
    first = false;
  };
  while (true) {
    size_t nl = text.find('\n', pos);
    std::string_view line =
        std::string_view(text).substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    while (DisplayWidth(line) > room) {
      // The last space that keeps the piece within `room` columns; else the first space.
      size_t cut = std::string_view::npos;
      size_t width = 0;
      for (size_t i = 0; i < line.size(); ++i) {
        if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80) ++width;
        if (width > room + 1) break;
        if (line[i] == ' ') cut = i;
      }
      if (cut == std::string_view::npos || cut == 0) cut = line.find(' ');
      if (cut == std::string_view::npos) break;
      emit(line.substr(0, cut));
      line.remove_prefix(cut + 1);
    }
    emit(line);
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
}

}  // namespace

std::optional<DiagFormat> ParseDiagFormat(std::string_view name) {
  if (name == "text") return DiagFormat::kText;
  if (name == "short") return DiagFormat::kShort;
  if (name == "json") return DiagFormat::kJson;
  if (name == "sarif") return DiagFormat::kSarif;
  return std::nullopt;
}

std::string SummaryLine(int errors, int warnings, bool color) {
  Style st{color};
  auto plural = [](int n, std::string_view word) {
    return std::to_string(n) + " " + std::string(word) + (n == 1 ? "" : "s");
  };
  if (errors > 0) {
    std::string s =
        st.Wrap("1;31", "error") + st.Wrap("1", ": aborting due to " + plural(errors, "error"));
    if (warnings > 0) s += st.Wrap("1", "; " + plural(warnings, "warning") + " emitted");
    return s;
  }
  if (warnings > 0) {
    return st.Wrap("1;33", "warning") +
           st.Wrap("1", ": " + plural(warnings, "warning") + " emitted");
  }
  return {};
}

std::string RenderDiagnosticText(const Diagnostic& d, const SourceManager& sm,
                                 const RenderOptions& options) {
  const Glyphs& g = options.ascii ? kAscii : kUnicode;
  Style st{options.color};
  const DiagKindInfo& info = SafeInfo(d.kind);
  std::string out;
  std::string head = std::string(LevelName(d.level)) + "[" + std::string(info.code) + "]";
  std::string message = OneLine(d.message);
  out += st.Wrap(LevelColor(d.level), head) + st.Wrap("1", ": " + message) + "\n";

  // Sections: the primary's buffer first, then other buffers in order of appearance.
  std::vector<Section> sections;
  auto section_for = [&](const SafeRange& r) -> Section& {
    for (Section& s : sections) {
      if (s.buffer == r.buffer) return s;
    }
    sections.push_back(Section{r.buffer, r, {}});
    return sections.back();
  };
  SafeRange primary = Repair(sm, d.primary);
  if (primary.valid) AddToSection(sm, section_for(primary), primary, true, d.primary_label);
  for (const DiagLabel& l : d.labels) {
    SafeRange r = Repair(sm, l.range);
    if (r.valid) AddToSection(sm, section_for(r), r, false, l.message);
  }
  uint32_t max_line = 1;
  for (const Section& s : sections) {
    if (!s.lines.empty()) max_line = std::max(max_line, s.lines.rbegin()->first + 1);
  }
  size_t gutter = std::to_string(max_line).size();
  std::string blank = Spaces(gutter + 1);
  std::string bar = st.Wrap("1;34", g.bar);

  for (size_t si = 0; si < sections.size(); ++si) {
    Section& s = sections[si];
    out += blank + st.Wrap("1;34", g.top) + " " + LocationText(sm, s.anchor) + "\n";
    out += blank + bar + "\n";
    uint32_t previous = 0;
    for (auto& [line, anns] : s.lines) {
      if (previous != 0 && line > previous + 1) {
        if (line == previous + 2) {
          std::string number = std::to_string(previous + 1);
          std::string text = MakeDisplayLine(sm.Line(s.buffer, previous + 1)).text;
          out +=
              st.Wrap("1;34", Spaces(gutter - number.size()) + number + " " + std::string(g.bar));
          out += text.empty() ? "\n" : " " + text + "\n";
        } else {
          out += blank + st.Wrap("1;34", g.gap) + "\n";
        }
      }
      std::string number = std::to_string(line);
      std::string text = MakeDisplayLine(sm.Line(s.buffer, line)).text;
      out += st.Wrap("1;34", Spaces(gutter - number.size()) + number + " " + std::string(g.bar));
      out += text.empty() ? "\n" : " " + text + "\n";
      RenderLineAnnotations(out, blank, anns, g, st);
      previous = line;
    }
    if (si + 1 < sections.size()) out += blank + bar + "\n";
  }
  bool has_tail = !d.values.empty() || !d.notes.empty() || !d.helps.empty();
  if (!sections.empty() && has_tail) out += blank + bar + "\n";
  if (!d.values.empty()) {
    std::string joined;
    for (size_t i = 0; i < d.values.size(); ++i) {
      const auto& [expr, value] = d.values[i];
      if (i > 0) joined += "\n";
      joined += OneLine(expr);
      if (!value.empty()) joined += " = " + OneLine(value);
    }
    AppendIndented(out, blank, d.values.size() == 1 ? "value" : "values", joined, st);
  }
  for (const std::string& n : d.notes) AppendIndented(out, blank, "note", n, st);
  for (const std::string& h : d.helps) AppendIndented(out, blank, "help", h, st);
  return out;
}

namespace render_internal {

std::string RenderText(const std::vector<Diagnostic>& diags, const SourceManager& sm,
                       const RenderOptions& options) {
  std::string out;
  int errors = 0, warnings = 0;
  for (const Diagnostic& d : diags) {
    out += RenderDiagnosticText(d, sm, options);
    out += "\n";
    errors += d.level == DiagLevel::kError;
    warnings += d.level == DiagLevel::kWarning;
  }
  if (options.summary) {
    std::string summary = SummaryLine(errors, warnings, options.color);
    if (!summary.empty()) out += summary + "\n";
  }
  return out;
}

std::string RenderShort(const std::vector<Diagnostic>& diags, const SourceManager& sm,
                        const RenderOptions& options) {
  Style st{options.color};
  std::string out;
  for (const Diagnostic& d : diags) {
    SafeRange primary = Repair(sm, d.primary);
    std::string where = primary.valid ? LocationText(sm, primary) + ": " : std::string();
    const DiagKindInfo& info = SafeInfo(d.kind);
    out += where +
           st.Wrap(LevelColor(d.level),
                   std::string(LevelName(d.level)) + "[" + std::string(info.code) + "]") +
           ": " + OneLine(d.message) + "\n";
    if (!d.primary_label.empty()) out += where + "note: " + OneLine(d.primary_label) + "\n";
    for (const DiagLabel& l : d.labels) {
      if (l.message.empty()) continue;
      SafeRange r = Repair(sm, l.range);
      std::string lw = r.valid ? LocationText(sm, r) + ": " : where;
      out += lw + "note: " + OneLine(l.message) + "\n";
    }
    for (const auto& [expr, value] : d.values) {
      out +=
          where + "note: " + OneLine(expr) + (value.empty() ? "" : " = " + OneLine(value)) + "\n";
    }
    for (const std::string& n : d.notes) out += where + "note: " + OneLine(n) + "\n";
    for (const std::string& h : d.helps) out += where + "help: " + OneLine(h) + "\n";
  }
  return out;
}

// A kind outside the registry (only from corrupted data) renders as the first kind rather
// than reading out of bounds.
const DiagKindInfo& SafeInfo(DiagKind kind) {
  return GetDiagKindInfo(
      static_cast<size_t>(kind) < static_cast<size_t>(DiagKind::kCount) ? kind : DiagKind{});
}

// --- Locations, repaired (shared with render_json.cpp)
// --------------------------------------------------------------------

SafeRange Repair(const SourceManager& sm, SourceRange r) {
  SafeRange s;
  if (r.buffer == 0 || r.buffer > sm.BufferCount()) return s;
  uint32_t size = static_cast<uint32_t>(std::min<size_t>(sm.Text(r.buffer).size(), UINT32_MAX));
  s.valid = true;
  s.buffer = r.buffer;
  s.begin = std::min(r.begin, size);
  s.end = std::min(std::max(r.end, s.begin), size);
  return s;
}

}  // namespace render_internal
}  // namespace paraplan
