// Megatron-Core's pipeline layout: parsing (string and list forms), the checks Megatron-Core
// makes (one embedding first, one loss last, decoder layers before MTP modules, the layer and
// MTP counts, the stage count a multiple of pp) plus what a plan can place, and the text written
// back on export.
#include "compiler/interop/pipeline_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

namespace paraplan::interop {
namespace {

constexpr std::string_view kSymbols = "ELtm|";

LayoutProblem Problem(std::string message, std::string note, std::string help = {}) {
  return {std::move(message), std::move(note), std::move(help)};
}

ParsedLayout Refuse(LayoutProblem p) { return {{}, std::move(p)}; }

const char* const kGrammarNote =
    "a layout names layers `E` (embedding), `t` (transformer layer), `m` (MTP module) and `L` "
    "(loss), ends a virtual stage with `|`, repeats with `X*N` or `(...)*N` and ignores commas";

// Expands repetitions into one symbol per layer (and `|` per stage end), refusing anything
// outside the grammar and anything longer than kMaxLayoutSymbols.
class Expander {
 public:
  explicit Expander(std::string_view text) : text_(text) {}

  std::optional<LayoutProblem> Run(std::string& out) {
    while (pos_ < text_.size()) {
      if (auto p = Item(out)) return p;
    }
    return std::nullopt;
  }

 private:
  // One symbol or one group, with its repeat count.
  std::optional<LayoutProblem> Item(std::string& out) {
    const size_t at = pos_;
    const char c = text_[pos_];
    if (c == ',') {  // for reading only, between items
      ++pos_;
      return std::nullopt;
    }
    if (c == '(') {
      const size_t close = text_.find(')', pos_ + 1);
      if (close == std::string_view::npos) {
        return Problem(fmt::format("the `(` at character {} is never closed", base_ + at + 1),
                       kGrammarNote, "close the group and give its count: `(tt|)*4`");
      }
      const std::string_view body = text_.substr(pos_ + 1, close - pos_ - 1);
      if (body.find('(') != std::string_view::npos) {
        return Problem(fmt::format("the group at character {} holds another group", base_ + at + 1),
                       "Megatron-Core does not nest repetitions",
                       "write the inner group out, or repeat a flat group: `(tt|)*4`");
      }
      if (body.empty()) {
        return Problem(fmt::format("the group at character {} is empty", base_ + at + 1),
                       kGrammarNote);
      }
      pos_ = close + 1;
      if (pos_ >= text_.size() || text_[pos_] != '*') {
        return Problem(fmt::format("the group `({})` has no repeat count", body),
                       "Megatron-Core expands only `(...)*N`; a bare parenthesis is no layer",
                       fmt::format("give the count, `({})*2`, or remove the parentheses", body));
      }
      std::string unit;
      Expander inner(body);
      inner.base_ = base_ + at + 1;
      if (auto p = inner.Run(unit)) return p;
      return Repeat(unit, out);
    }
    if (c == ')') {
      return Problem(fmt::format("the `)` at character {} closes no group", base_ + at + 1),
                     kGrammarNote);
    }
    if (c == '*') {
      return Problem(fmt::format("the `*` at character {} repeats nothing", base_ + at + 1),
                     "a count follows one symbol or one group, once: `t*3`, `(tt|)*4`");
    }
    if (kSymbols.find(c) == std::string_view::npos) {
      const std::string shown = std::isprint(static_cast<unsigned char>(c))
                                    ? fmt::format("`{}`", c)
                                    : fmt::format("byte 0x{:02x}", static_cast<unsigned char>(c));
      return Problem(fmt::format("{} at character {} is no layer symbol", shown, base_ + at + 1),
                     kGrammarNote,
                     "write the stages with E, t, m, L and |, for example `Et|(tt|)*30mL`");
    }
    ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '*') return Repeat(std::string(1, c), out);
    return Append(std::string_view(&c, 1), 1, out);
  }

  // `*N` after a unit: appends the unit N times.
  std::optional<LayoutProblem> Repeat(const std::string& unit, std::string& out) {
    const size_t star = pos_;
    ++pos_;
    int64_t count = 0;
    size_t digits = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      count = count * 10 + (text_[pos_] - '0');
      ++digits;
      ++pos_;
      if (count > kMaxLayoutSymbols) {
        return Problem(fmt::format("the repeat count at character {} is more than {}",
                                   base_ + star + 1, kMaxLayoutSymbols),
                       "no model has that many layers or stages; the count is refused before "
                       "the layout is expanded");
      }
    }
    if (digits == 0) {
      return Problem(fmt::format("the `*` at character {} has no count", base_ + star + 1),
                     "a repeat count is a whole number: `t*3`, `(tt|)*4`");
    }
    if (pos_ < text_.size() && text_[pos_] == '*') {
      return Problem(
          fmt::format("a second `*` follows the count at character {}", base_ + star + 1),
          "a unit is repeated once; Megatron-Core would repeat only the last symbol",
          "multiply the counts: `t*6` for `t*2*3`");
    }
    return Append(unit, count, out);
  }

  static std::optional<LayoutProblem> Append(std::string_view unit, int64_t count,
                                             std::string& out) {
    const int64_t size = static_cast<int64_t>(unit.size());
    const int64_t room = kMaxLayoutSymbols - static_cast<int64_t>(out.size());
    if (size > 0 && count > room / size) {
      return Problem(
          fmt::format("the layout names more than {} layers and stage ends", kMaxLayoutSymbols),
          "no model has that many layers or stages; the layout is refused before it "
          "is expanded");
    }
    for (int64_t i = 0; i < count; ++i) out.append(unit);
    return std::nullopt;
  }

  std::string_view text_;
  size_t pos_ = 0;
  size_t base_ = 0;  // where text_ starts in the whole layout (for the character numbers)
};

// The stages of an expanded layout, with Megatron-Core's ordering checks and what a plan can
// place.
ParsedLayout StagesOf(const std::vector<std::vector<char>>& layers) {
  ParsedLayout out;
  const int64_t n = static_cast<int64_t>(layers.size());
  int64_t embeddings = 0, losses = 0, mtp_stage = -1;
  bool seen_mtp = false;
  for (int64_t s = 0; s < n; ++s) {
    const std::vector<char>& stage = layers[static_cast<size_t>(s)];
    LayoutStage st;
    for (size_t i = 0; i < stage.size(); ++i) {
      switch (stage[i]) {
        case 'E':
          ++embeddings;
          if (s != 0 || i != 0) {
            return Refuse(Problem(
                fmt::format("the embedding `E` is in virtual stage {}, not first in stage 0", s),
                "Megatron-Core's first layer must be the embedding, and a plan places it on "
                "virtual stage 0 (pipeline rank 0, chunk 0)",
                "begin the layout with `E`"));
          }
          st.embedding = true;
          break;
        case 'L':
          ++losses;
          if (s != n - 1 || i + 1 != stage.size()) {
            return Refuse(Problem(
                fmt::format("the loss `L` is in virtual stage {}, not last in stage {}", s, n - 1),
                "Megatron-Core's last layer must be the loss, and a plan places it on the last "
                "virtual stage (pipeline rank pp-1, chunk vpp-1)",
                "end the layout with `L`"));
          }
          st.loss = true;
          break;
        case 't':
          if (seen_mtp) {
            return Refuse(Problem(
                fmt::format("a transformer layer `t` follows an MTP module `m` (virtual stage {})",
                            s),
                "Megatron-Core places every decoder layer before the MTP modules",
                "move the `m` after the last `t`"));
          }
          ++st.decoder;
          break;
        case 'm':
          seen_mtp = true;
          if (mtp_stage >= 0 && mtp_stage != s) {
            return Refuse(
                Problem(fmt::format("the MTP modules are split over virtual stages {} and {}",
                                    mtp_stage, s),
                        "Megatron-Core keeps all MTP modules in one virtual stage",
                        "put every `m` in the last stage, before `L`"));
          }
          mtp_stage = s;
          ++st.mtp;
          break;
        default:
          break;
      }
    }
    out.stages.push_back(st);
  }
  if (embeddings == 0) {
    return Refuse(Problem("the layout has no embedding `E`",
                          "Megatron-Core's first layer must be the embedding",
                          "begin the layout with `E`"));
  }
  if (losses == 0) {
    return Refuse(Problem("the layout has no loss `L`",
                          "Megatron-Core's last layer must be the loss",
                          "end the layout with `L`"));
  }
  if (mtp_stage >= 0 && mtp_stage != n - 1) {
    return Refuse(Problem(
        fmt::format("the MTP modules are in virtual stage {}, the loss in stage {}", mtp_stage,
                    n - 1),
        "a plan counts the MTP modules (model.mtp_layers) with the output layer and the loss on "
        "the last virtual stage; a stage of their own (Megatron-Core's standalone MTP) has no "
        "plan field",
        "put them in the loss's stage: `...|mL`"));
  }
  return out;
}

}  // namespace

ParsedLayout ParseLayoutString(std::string_view text) {
  if (text.find_first_not_of(',') == std::string_view::npos) {
    return Refuse(Problem("the layout is empty", kGrammarNote, "for example `Et|(tt|)*30mL`"));
  }
  std::string expanded;
  if (auto p = Expander(text).Run(expanded)) return Refuse(std::move(*p));
  std::vector<std::vector<char>> stages(1);
  for (char c : expanded) {
    if (c == '|')
      stages.emplace_back();
    else
      stages.back().push_back(c);
  }
  return StagesOf(stages);
}

ParsedLayout ParseLayoutLists(std::span<const std::vector<std::string>> stages) {
  if (stages.empty()) {
    return Refuse(
        Problem("the layout is an empty list", "a layout lists the layers of each virtual stage"));
  }
  std::vector<std::vector<char>> layers;
  int64_t total = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    layers.emplace_back();
    for (const std::string& item : stages[s]) {
      std::string name;
      for (char c : item) {
        if (!std::isspace(static_cast<unsigned char>(c)))
          name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
      char symbol = 0;
      if (name == "embedding") symbol = 'E';
      if (name == "decoder") symbol = 't';
      if (name == "mtp") symbol = 'm';
      if (name == "loss") symbol = 'L';
      if (name == "encoder") {
        return Refuse(Problem(fmt::format("virtual stage {} names an encoder layer", s),
                              "Megatron-Core does not take encoder layers in a pipeline layout"));
      }
      if (symbol == 0) {
        return Refuse(Problem(
            fmt::format("`{}` in virtual stage {} is no layer type", item, s),
            "the layer types are embedding, decoder, mtp and loss",
            "for example `[[embedding, decoder], [decoder, decoder], [decoder, mtp, loss]]`"));
      }
      if (++total > kMaxLayoutSymbols) {
        return Refuse(
            Problem(fmt::format("the layout names more than {} layers", kMaxLayoutSymbols),
                    "no model has that many layers"));
      }
      layers.back().push_back(symbol);
    }
  }
  return StagesOf(layers);
}

LayoutSplit SplitFromLayout(std::span<const LayoutStage> stages, const LayoutShape& shape) {
  LayoutSplit out;
  const int64_t n = static_cast<int64_t>(stages.size());
  const int64_t pp = std::max<int64_t>(1, shape.pp);
  if (n % pp != 0) {
    out.problem =
        Problem(fmt::format("the layout has {} virtual stages, not a multiple of pp = {}", n, pp),
                "each pipeline rank runs vpp = stages / pp chunks",
                fmt::format("give {} or {} stages (vpp {} or {})", n / pp * pp, (n / pp + 1) * pp,
                            n / pp, n / pp + 1));
    return out;
  }
  out.vpp = n / pp;
  if (shape.vpp && *shape.vpp != out.vpp) {
    out.problem =
        Problem(fmt::format("the layout has {} virtual stages, but pp · vpp = {} · {} = {}", n, pp,
                            *shape.vpp, pp * *shape.vpp),
                "Megatron-Core derives vpp from the layout (stages / pp) and refuses another",
                fmt::format("remove the virtual pipeline size, or set it to {}", out.vpp));
    return out;
  }
  int64_t decoder = 0, mtp = 0;
  for (const LayoutStage& s : stages) {
    decoder += s.decoder;
    mtp += s.mtp;
    out.stage_layers.push_back(s.decoder);
  }
  if (shape.layers && decoder != *shape.layers) {
    out.problem = Problem(
        fmt::format("the layout has {} transformer layers, but the model has {}", decoder,
                    *shape.layers),
        "Megatron-Core: the number of decoder layers must match num_layers",
        fmt::format("add or remove {} `t`",
                    decoder < *shape.layers ? *shape.layers - decoder : decoder - *shape.layers));
    out.stage_layers.clear();
    return out;
  }
  if (mtp != shape.mtp_layers) {
    out.problem = Problem(
        fmt::format("the layout has {} MTP modules `m`, but the model has {}", mtp,
                    shape.mtp_layers),
        "Megatron-Core: the MTP layers in the layout must match mtp_num_layers",
        shape.mtp_layers > 0
            ? fmt::format(
                  "end the layout with `{}L`",
                  std::string(static_cast<size_t>(std::min<int64_t>(shape.mtp_layers, 16)), 'm'))
            : "remove the `m`, or state the MTP modules (mtp_num_layers)");
    out.stage_layers.clear();
    return out;
  }
  return out;
}

bool ApplyLayout(const ParsedLayout& layout, std::string_view key, SourceRange range,
                 const std::string& source, LayoutVpp vpp_rule, PlanDraft& draft,
                 DiagnosticSink& sink) {
  auto integer = [&](FieldId field) -> std::optional<int64_t> {
    const DraftSetting* s = draft.Find(field);
    return s ? ParseInteger(s->value) : std::nullopt;
  };
  std::optional<LayoutProblem> problem = layout.problem;
  LayoutSplit split;
  if (!problem) {
    LayoutShape shape;
    shape.pp = integer(fields::kParallelPp).value_or(1);
    if (vpp_rule == LayoutVpp::kMustMatch) shape.vpp = integer(fields::kParallelVpp);
    shape.layers = integer(fields::kModelLayers);
    shape.mtp_layers = integer(fields::kModelMtpLayers).value_or(0);
    split = SplitFromLayout(layout.stages, shape);
    problem = split.problem;
  }
  if (problem) {
    Diag d(DiagKind::kConfigBadValue, fmt::format("`{}`: {}", key, problem->message));
    d.At(range);
    if (!problem->note.empty()) d.Note(problem->note);
    if (!problem->help.empty()) d.Help(problem->help);
    sink.Report(std::move(d));
    return false;
  }
  draft.Set(fields::kPipelineStageLayers, LayerListText(split.stage_layers), range, source);
  const std::optional<int64_t> stated = integer(fields::kParallelVpp);
  if ((split.vpp > 1 || stated) && stated != split.vpp) {
    draft.Set(fields::kParallelVpp, std::to_string(split.vpp), range, source);
  }
  return true;
}

std::string LayoutText(std::span<const int64_t> stage_layers, int64_t mtp_layers) {
  const size_t n = stage_layers.size();
  auto layers = [](int64_t count, char symbol) {
    if (count <= 0) return std::string();
    if (count <= 3) return std::string(static_cast<size_t>(count), symbol);
    return fmt::format("{}*{}", symbol, count);
  };
  auto stage = [&](size_t s) {
    std::string t = s == 0 ? "E" : "";
    t += layers(stage_layers[s], 't');
    if (s + 1 == n) t += layers(mtp_layers, 'm') + "L";
    return t;
  };
  std::string out;
  for (size_t s = 0; s < n;) {
    size_t run = 1;
    if (s > 0 && s + 1 < n) {
      while (s + run + 1 < n && stage_layers[s + run] == stage_layers[s]) ++run;
    }
    if (run > 1) {
      out += fmt::format("({}|)*{}", stage(s), run);
    } else {
      out += stage(s);
      if (s + 1 < n) out += "|";
    }
    s += run;
  }
  return out;
}

std::string LayerListText(std::span<const int64_t> counts) {
  return fmt::format("[{}]", fmt::join(counts, ", "));
}

}  // namespace paraplan::interop
