// planc explain --svg: the cluster as a picture. Nodes are boxes, GPUs inside them are cells
// coloured by pipeline stage and labelled with their rank; TP groups are outlined in solid
// black, EP groups (when ep > 1) in dashed purple; a legend gives each stage's layers. Cell
// size shrinks with the world so that 8 to 512 GPUs stay legible; beyond kSvgMaxGpus only the
// first nodes are drawn.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "compiler/analyze/format_util.h"
#include "compiler/driver/explain.h"

namespace paraplan {
namespace {

constexpr std::array<std::string_view, 20> kStageColors = {
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
    "#ff9da7", "#9c755f", "#bab0ac", "#a0cbe8", "#ffbe7d", "#8cd17d", "#ff9d9a",
    "#86bcb6", "#f1ce63", "#d4a6c8", "#fabfd2", "#d7b5a6", "#79706e"};

std::string StageColor(int64_t stage, int64_t stages) {
  if (stages <= static_cast<int64_t>(kStageColors.size()))
    return std::string(kStageColors[static_cast<size_t>(stage)]);
  // Many stages: walk the hue circle.
  return fmt::format("hsl({:.0f},62%,{}%)",
                     360.0 * static_cast<double>(stage) / static_cast<double>(stages),
                     stage % 2 ? 62 : 50);
}

// Dark text on light fills, white on dark ones.
bool IsLight(std::string_view color) {
  if (color.size() != 7 || color[0] != '#') return false;
  auto hex = [&](size_t i) { return std::stoi(std::string(color.substr(i, 2)), nullptr, 16); };
  double l = 0.299 * hex(1) + 0.587 * hex(3) + 0.114 * hex(5);
  return l > 150;
}

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct Geometry {
  int64_t gpn = 8;
  int64_t per_row = 8;  // GPU cells per row inside a node
  int64_t rows = 1;     // GPU rows inside a node
  double cell = 36;     // cell size
  double gap = 4;       // between cells
  double pad = 10;      // node padding
  double label = 16;    // node label height
  double node_w = 0, node_h = 0;
  int64_t cols = 4;  // nodes per row
  double node_gap = 14;
  double left = 20, top = 0;

  std::vector<int32_t> slot;  // slot[node]: its place in the picture, -1 when not drawn

  double CellX(int64_t node, int64_t local) const {
    int64_t k = slot[static_cast<size_t>(node)];
    return left + static_cast<double>(k % cols) * (node_w + node_gap) + pad +
           static_cast<double>(local % per_row) * (cell + gap);
  }
  double CellY(int64_t node, int64_t local) const {
    int64_t k = slot[static_cast<size_t>(node)];
    const int64_t node_row = k / cols, cell_row = local / per_row;
    return top + static_cast<double>(node_row) * (node_h + node_gap) + pad + label +
           static_cast<double>(cell_row) * (cell + gap);
  }
  bool Drawn(int64_t rank) const { return slot[static_cast<size_t>(rank / gpn)] >= 0; }
};

// Outlines the members of one group: a rectangle per run of neighbouring cells in one row.
void Outline(std::string& out, const Geometry& g, std::span<const int64_t> members, double inset_x,
             double inset_y, std::string_view style) {
  size_t i = 0;
  while (i < members.size()) {
    if (!g.Drawn(members[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    auto node = [&](size_t k) { return members[k] / g.gpn; };
    auto local = [&](size_t k) { return members[k] % g.gpn; };
    while (j + 1 < members.size() && node(j + 1) == node(i) && local(j + 1) == local(j) + 1 &&
           local(j + 1) / g.per_row == local(i) / g.per_row) {
      ++j;
    }
    double x = g.CellX(node(i), local(i)) - inset_x;
    double y = g.CellY(node(i), local(i)) - inset_y;
    double w = static_cast<double>(j - i + 1) * (g.cell + g.gap) - g.gap + 2 * inset_x;
    double h = g.cell + 2 * inset_y;
    fmt::format_to(
        std::back_inserter(out),
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" rx=\"{:.1f}\" {}/>\n",
        x, y, w, h, std::max(2.0, g.cell / 6), style);
    i = j + 1;
  }
}

// Big worlds: the first nodes of every pipeline stage, up to kSvgMaxGpus GPUs in all.
std::vector<int64_t> ShownNodes(const Layout& layout, const Partition& part) {
  const MeshSizes& s = layout.sizes();
  const int64_t world = layout.world_size();
  const int64_t nodes = layout.nodes();
  std::vector<int64_t> shown;
  if (world <= kSvgMaxGpus) {
    for (int64_t n = 0; n < nodes; ++n) shown.push_back(n);
    return shown;
  }
  const int64_t budget = std::max<int64_t>(1, kSvgMaxGpus / s.gpus_per_node);
  const int64_t per_stage = std::max<int64_t>(1, budget / part.pp);
  std::vector<int64_t> taken(static_cast<size_t>(part.pp), 0);
  std::vector<bool> pick(static_cast<size_t>(nodes), false);
  for (int64_t r = 0; r < world; ++r) {
    int64_t p = layout.dense_mesh().Coordinate(r, "pp"), n = r / s.gpus_per_node;
    if (pick[static_cast<size_t>(n)]) continue;
    if (taken[static_cast<size_t>(p)] < per_stage) {
      pick[static_cast<size_t>(n)] = true;
      ++taken[static_cast<size_t>(p)];
    }
  }
  for (int64_t n = 0; n < nodes; ++n) {
    if (pick[static_cast<size_t>(n)]) shown.push_back(n);
  }
  return shown;
}

// Cell size, spacing and node columns for the shown nodes; g.top is left for the legend to set.
Geometry NodeGeometry(const MeshSizes& s, int64_t nodes, const std::vector<int64_t>& shown) {
  const int64_t drawn_nodes = static_cast<int64_t>(shown.size());
  Geometry g;
  g.gpn = s.gpus_per_node;
  g.slot.assign(static_cast<size_t>(nodes), -1);
  for (size_t k = 0; k < shown.size(); ++k)
    g.slot[static_cast<size_t>(shown[k])] = static_cast<int32_t>(k);
  const int64_t drawn = drawn_nodes * s.gpus_per_node;
  g.per_row = std::min<int64_t>(g.gpn, 8);
  g.rows = (g.gpn + g.per_row - 1) / g.per_row;
  g.cell = drawn <= 64 ? 40 : drawn <= 256 ? 30 : drawn <= 512 ? 22 : 14;
  g.gap = g.cell >= 30 ? 8 : 4;
  g.pad = g.cell >= 30 ? 12 : 8;
  g.label = (g.cell >= 22 ? 18 : 14) + (s.ep > 1 ? 6 : 0);  // room above the EP outlines
  g.node_w = 2 * g.pad + static_cast<double>(g.per_row) * (g.cell + g.gap) - g.gap;
  g.node_h = 2 * g.pad + g.label + static_cast<double>(g.rows) * (g.cell + g.gap) - g.gap;
  // About 1,400 px wide at most, never more node columns than nodes, and a picture about
  // two and a half times as wide as high.
  const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(1400 / (g.node_w + g.node_gap)));
  const int64_t balanced = static_cast<int64_t>(
      std::ceil(std::sqrt(static_cast<double>(drawn_nodes) * 2.5 * g.node_h / g.node_w)));
  g.cols = std::clamp<int64_t>(std::min(fit, balanced), 1, drawn_nodes);
  return g;
}

constexpr double kHeaderHeight = 58;  // title and mesh line above the legend
constexpr double kLegendRow = 22;

// Everything the drawing needs to know before the first element is written.
struct Picture {
  std::vector<int64_t> shown;  // the nodes drawn, ascending
  Geometry g;
  double width = 0, height = 0;
  int64_t legend_cols = 1;   // legend entries per line
  int64_t legend_items = 0;  // one per stage, then the TP outline, then the EP one when ep > 1
  bool partial = false;      // some nodes are left out
};

Picture LayOutPicture(const ExplainInput& in) {
  const MeshSizes& s = in.layout.sizes();
  const int64_t nodes = in.layout.nodes();
  Picture pic;
  pic.shown = ShownNodes(in.layout, in.partition);
  const int64_t drawn_nodes = static_cast<int64_t>(pic.shown.size());
  pic.partial = drawn_nodes < nodes;
  pic.g = NodeGeometry(s, nodes, pic.shown);
  Geometry& g = pic.g;
  pic.width = std::max(
      g.left * 2 + static_cast<double>(g.cols) * (g.node_w + g.node_gap) - g.node_gap, 760.0);

  // Legend: one entry per stage (a swatch and its layers), then the outline styles.
  pic.legend_cols = std::max<int64_t>(1, static_cast<int64_t>((pic.width - 40) / 250));
  pic.legend_items = in.partition.pp + 1 + (s.ep > 1 ? 1 : 0);
  const int64_t legend_rows = (pic.legend_items + pic.legend_cols - 1) / pic.legend_cols;
  g.top = kHeaderHeight + static_cast<double>(legend_rows) * kLegendRow + 18;
  const int64_t node_rows = (drawn_nodes + g.cols - 1) / g.cols;
  pic.height = g.top + static_cast<double>(node_rows) * (g.node_h + g.node_gap) + 10;
  if (pic.partial) pic.height += 24;
  return pic;
}

// The <svg> element, the background, the title and the mesh line.
void WriteHeader(std::string& out, const ExplainInput& in, const Picture& pic) {
  const Layout& layout = in.layout;
  const MeshSizes& s = layout.sizes();
  fmt::format_to(std::back_inserter(out),
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                 "viewBox=\"0 0 {:.0f} "
                 "{:.0f}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
                 pic.width, pic.height, pic.width, pic.height);
  fmt::format_to(std::back_inserter(out),
                 "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  fmt::format_to(std::back_inserter(out),
                 "<text x=\"20\" y=\"26\" font-size=\"18\" font-weight=\"bold\" fill=\"#222\">{}: "
                 "{} GPUs on {} "
                 "node{}</text>\n",
                 Escape(in.plan.name.empty() ? "plan" : in.plan.name),
                 GroupDigits(layout.world_size()), GroupDigits(layout.nodes()),
                 layout.nodes() == 1 ? "" : "s");
  fmt::format_to(std::back_inserter(out),
                 "<text x=\"20\" y=\"47\" font-size=\"13\" fill=\"#444\" xml:space=\"preserve\">tp "
                 "{} · cp {} · dp {} · pp {}{} · ep {} · etp "
                 "{} · edp {}  |  order {}  |  {} layers{}</text>\n",
                 s.tp, s.cp, s.dp, s.pp,
                 in.plan.parallel.vpp > 1 ? fmt::format(" (vpp {})", in.plan.parallel.vpp) : "",
                 s.ep, s.etp, layout.edp(), Escape(s.order), in.partition.layers,
                 in.plan.model.name.empty() ? "" : " of " + Escape(in.plan.model.name));
}

// A stage's legend entry: its swatch, its layers ("0-3, 16-19") and what else it holds.
void WriteStageLegendEntry(std::string& out, const PipelineStage& st, int64_t stage, int64_t stages,
                           double x, double y) {
  std::string layers;
  for (const PipelineChunk& c : st.chunks) {
    if (!layers.empty()) layers += ", ";
    layers += c.layer_count() == 0   ? "-"
              : c.layer_count() == 1 ? std::to_string(c.first_layer)
                                     : fmt::format("{}-{}", c.first_layer, c.end_layer - 1);
  }
  std::string extra = st.embedding && st.loss ? " + emb, loss"
                      : st.embedding          ? " + embedding"
                      : st.loss               ? " + loss"
                                              : "";
  fmt::format_to(
      std::back_inserter(out),
      "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"16\" height=\"16\" rx=\"3\" fill=\"{}\"/>"
      "<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12.5\" fill=\"#222\">stage {}: layers "
      "{}{}</text>\n",
      x, y, StageColor(stage, stages), x + 22, y + 12.5, stage, layers, extra);
}

// One entry per stage, then the TP outline and, when ep > 1, the EP outline.
void WriteLegend(std::string& out, const ExplainInput& in, const Picture& pic) {
  const Partition& part = in.partition;
  const MeshSizes& s = in.layout.sizes();
  for (int64_t i = 0; i < pic.legend_items; ++i) {
    double x = 20 + static_cast<double>(i % pic.legend_cols) * 250;
    const int64_t legend_line = i / pic.legend_cols;
    double y = kHeaderHeight + static_cast<double>(legend_line) * kLegendRow;
    if (i < part.pp) {
      WriteStageLegendEntry(out, part.stages[static_cast<size_t>(i)], i, part.pp, x, y);
    } else if (i == part.pp) {
      fmt::format_to(std::back_inserter(out),
                     "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"28\" height=\"16\" rx=\"3\" "
                     "fill=\"none\" stroke=\"#111\" "
                     "stroke-width=\"2\"/><text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12.5\" "
                     "fill=\"#222\">TP group ({} "
                     "GPUs)</text>\n",
                     x, y, x + 34, y + 12.5, s.tp);
    } else {
      fmt::format_to(std::back_inserter(out),
                     "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"28\" height=\"16\" rx=\"3\" "
                     "fill=\"none\" stroke=\"#7b2d8e\" "
                     "stroke-width=\"2\" stroke-dasharray=\"5 3\"/><text x=\"{:.0f}\" y=\"{:.0f}\" "
                     "font-size=\"12.5\" "
                     "fill=\"#222\">EP group ({} GPUs)</text>\n",
                     x, y, x + 34, y + 12.5, s.ep);
    }
  }
}

// A labelled box per shown node.
void WriteNodeBoxes(std::string& out, const Picture& pic) {
  const Geometry& g = pic.g;
  const int64_t drawn_nodes = static_cast<int64_t>(pic.shown.size());
  for (int64_t k = 0; k < drawn_nodes; ++k) {
    const int64_t n = pic.shown[static_cast<size_t>(k)];
    double x = g.left + static_cast<double>(k % g.cols) * (g.node_w + g.node_gap);
    const int64_t node_row = k / g.cols;
    double y = g.top + static_cast<double>(node_row) * (g.node_h + g.node_gap);
    fmt::format_to(std::back_inserter(out),
                   "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" rx=\"8\" "
                   "fill=\"#f4f5f7\" "
                   "stroke=\"#8a8f98\" stroke-width=\"1.2\"/>\n<text x=\"{:.1f}\" y=\"{:.1f}\" "
                   "font-size=\"{:.0f}\" "
                   "fill=\"#555\">node {}</text>\n",
                   x, y, g.node_w, g.node_h, x + g.pad, y + g.pad + (g.cell >= 22 ? 12.0 : 9.0),
                   g.cell >= 22 ? 12.0 : 10.0, n);
  }
}

// A cell per GPU of the shown nodes, coloured by stage, with its coordinates as a tooltip and
// its rank written inside when the cell is big enough.
void WriteGpuCells(std::string& out, const ExplainInput& in, const Picture& pic) {
  const Layout& layout = in.layout;
  const MeshSizes& s = layout.sizes();
  const int64_t world = layout.world_size();
  const Geometry& g = pic.g;
  const double font = g.cell >= 40 ? 13 : g.cell >= 30 ? 11 : g.cell >= 22 ? 9 : 0;
  for (int64_t n : pic.shown) {
    for (int64_t r = n * s.gpus_per_node; r < std::min(world, (n + 1) * s.gpus_per_node); ++r) {
      RankCoordinates c = layout.Coordinates(r);
      std::string color = StageColor(c.pp, in.partition.pp);
      double x = g.CellX(c.node, c.local), y = g.CellY(c.node, c.local);
      fmt::format_to(std::back_inserter(out),
                     "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" rx=\"3\" "
                     "fill=\"{}\"><title>rank "
                     "{}: tp {} cp {} dp {} pp {} ep {}</title></rect>\n",
                     x, y, g.cell, g.cell, color, r, c.tp, c.cp, c.dp, c.pp, c.ep);
      if (font > 0) {
        fmt::format_to(std::back_inserter(out),
                       "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{:.0f}\" "
                       "text-anchor=\"middle\" fill=\"{}\">{}</text>\n",
                       x + g.cell / 2, y + g.cell / 2 + font * 0.36, font,
                       IsLight(color) ? "#222" : "#fff", r);
      }
    }
  }
}

// Group outlines: EP outside (dashed), TP inside (solid).
void WriteGroupOutlines(std::string& out, const Layout& layout, const Geometry& g) {
  const MeshSizes& s = layout.sizes();
  // EP outlines sit outside the TP ones: a little wider than the cells, clearly taller.
  const double ep_inset_x = g.gap / 2 - 1, ep_inset_y = g.pad / 2;
  if (s.ep > 1) {
    const GroupList& ep = layout.Groups(GroupKind::kEp);
    for (int64_t k = 0; k < ep.group_count(); ++k) {
      Outline(out, g, ep.Group(k), ep_inset_x, ep_inset_y,
              "fill=\"none\" stroke=\"#7b2d8e\" stroke-width=\"2\" stroke-dasharray=\"5 3\"");
    }
  }
  if (s.tp > 1) {
    const GroupList& tp = layout.Groups(GroupKind::kTp);
    for (int64_t k = 0; k < tp.group_count(); ++k) {
      Outline(
          out, g, tp.Group(k), std::max(1.0, g.gap * 0.25), std::max(1.0, g.gap * 0.25),
          fmt::format("fill=\"none\" stroke=\"#111\" stroke-width=\"{}\"", g.cell >= 22 ? 2 : 1.2));
    }
  }
}

}  // namespace

std::string ExplainSvg(const ExplainInput& in) {
  const Picture pic = LayOutPicture(in);
  const int64_t drawn_nodes = static_cast<int64_t>(pic.shown.size());
  std::string out;
  out.reserve(static_cast<size_t>(drawn_nodes * in.layout.sizes().gpus_per_node) * 400 + 4096);
  WriteHeader(out, in, pic);
  WriteLegend(out, in, pic);
  WriteNodeBoxes(out, pic);
  WriteGpuCells(out, in, pic);
  WriteGroupOutlines(out, in.layout, pic.g);
  if (pic.partial) {
    fmt::format_to(std::back_inserter(out),
                   "<text x=\"20\" y=\"{:.0f}\" font-size=\"13\" fill=\"#444\">showing {} of {} "
                   "nodes: the first "
                   "nodes of every pipeline stage (planc explain --rank R shows any rank)</text>\n",
                   pic.height - 14, GroupDigits(drawn_nodes), GroupDigits(in.layout.nodes()));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace paraplan
