// planc explain --format=json. Written by hand into one string: the group lists of a 16,384-rank
// world are ~260,000 integers, and this keeps the whole process well under a second.
#include <fmt/format.h>

#include <charconv>
#include <iterator>

#include "compiler/driver/explain.h"
#include "runtime/json/json.h"

namespace paraplan {
namespace {

using json::AppendString;

void AppendInt(std::string& out, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

void AppendList(std::string& out, std::span<const int64_t> values) {
  out += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    AppendInt(out, values[i]);
  }
  out += ']';
}

const char* Bool(bool b) { return b ? "true" : "false"; }

void AppendChunk(std::string& out, const PipelineChunk& c) {
  fmt::format_to(
      std::back_inserter(out),
      "{{\"chunk\":{},\"virtual_stage\":{},\"first_layer\":{},\"end_layer\":{},\"num_layers\":{},"
      "\"embedding\":{},\"loss\":{},\"cost_flops_per_token\":{}}}",
      c.chunk, c.virtual_stage, c.first_layer, c.end_layer, c.layer_count(), Bool(c.embedding),
      Bool(c.loss), c.cost);
}

void AppendStage(std::string& out, const PipelineStage& s) {
  fmt::format_to(std::back_inserter(out),
                 "{{\"pp_rank\":{},\"num_layers\":{},\"embedding\":{},\"loss\":{},\"chunks\":[",
                 s.pp_rank, s.layer_count(), Bool(s.embedding), Bool(s.loss));
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    if (i) out += ',';
    AppendChunk(out, s.chunks[i]);
  }
  out += "]}";
}

void AppendRank(std::string& out, const ExplainInput& in, int64_t rank) {
  const Layout& layout = in.layout;
  RankCoordinates c = layout.Coordinates(rank);
  fmt::format_to(std::back_inserter(out),
                 "{{\"rank\":{},\"node\":{},\"local\":{},\"coordinates\":{{\"tp\":{},\"cp\":{},"
                 "\"dp\":{},\"pp\":{},"
                 "\"etp\":{},\"ep\":{},\"edp\":{}}},\"groups\":{{",
                 rank, c.node, c.local, c.tp, c.cp, c.dp, c.pp, c.etp, c.ep, c.edp);
  bool first = true;
  for (GroupKind kind : AllGroupKinds()) {
    auto g = layout.GroupOf(kind, rank);
    if (g.empty()) continue;
    if (!first) out += ',';
    first = false;
    AppendString(out, GroupKindName(kind));
    out += ':';
    AppendList(out, g);
  }
  out += "},\"stage\":";
  AppendStage(out, in.partition.stages[static_cast<size_t>(c.pp)]);
  out += '}';
}

}  // namespace

std::string ExplainJson(const ExplainInput& in, std::optional<int64_t> rank) {
  const Plan& plan = in.plan;
  const Layout& layout = in.layout;
  const MeshSizes& s = layout.sizes();
  std::string out;
  out.reserve(static_cast<size_t>(layout.world_size()) * kGroupKindCount * 7 + 4096);
  out += "{\n";
  fmt::format_to(std::back_inserter(out), "\"version\":{},\n\"plan\":", kExplainJsonVersion);
  AppendString(out, plan.name);
  out += ",\n\"model\":";
  AppendString(out, plan.model.name);
  fmt::format_to(std::back_inserter(out),
                 ",\n\"world_size\":{},\n\"nodes\":{},\n\"gpus_per_node\":{},\n\"order\":",
                 layout.world_size(), plan.cluster.nodes, s.gpus_per_node);
  AppendString(out, s.order);
  fmt::format_to(std::back_inserter(out),
                 ",\n\"parallel\":{{\"tp\":{},\"pp\":{},\"vpp\":{},\"cp\":{},\"ep\":{},\"etp\":{},"
                 "\"dp\":{},\"edp\":{},"
                 "\"sp\":{},\"tp_comm_overlap\":{}}},\n",
                 s.tp, s.pp, plan.parallel.vpp, s.cp, s.ep, s.etp, s.dp, layout.edp(),
                 Bool(plan.parallel.sp && s.tp > 1),
                 Bool(plan.parallel.tp_comm_overlap && s.tp > 1));
  out += "\"groups\":{\n";
  bool first = true;
  for (GroupKind kind : AllGroupKinds()) {
    const GroupList& list = layout.Groups(kind);
    if (!first) out += ",\n";
    first = false;
    AppendString(out, GroupKindName(kind));
    out += ":[";
    for (int64_t g = 0; g < list.group_count(); ++g) {
      if (g) out += ',';
      AppendList(out, list.Group(g));
    }
    out += ']';
  }
  out += "\n},\n\"topology\":{";
  first = true;
  for (GroupKind kind : AllGroupKinds()) {
    const GroupPlacement& p = in.topology.Of(kind);
    if (!first) out += ',';
    first = false;
    AppendString(out, GroupKindName(kind));
    fmt::format_to(std::back_inserter(out),
                   ":{{\"groups\":{},\"size\":{},\"crossing_groups\":{},\"max_nodes\":{}}}",
                   p.group_count, p.group_size, p.crossing_groups, p.max_nodes);
  }
  const Partition& part = in.partition;
  out += "},\n\"partition\":{\"method\":";
  AppendString(out, ToString(part.method));
  fmt::format_to(std::back_inserter(out),
                 ",\"layers\":{},\"block_costs_flops_per_token\":{{\"embedding\":{},\"layers\":",
                 part.layers, part.costs.embedding);
  AppendList(out, part.costs.layers);
  fmt::format_to(std::back_inserter(out), ",\"head\":{}}}}},\n\"stages\":[", part.costs.head);
  for (size_t i = 0; i < part.stages.size(); ++i) {
    out += i ? ",\n" : "\n";
    AppendStage(out, part.stages[i]);
  }
  out += "\n]";
  for (const auto& [key, value] : in.json_sections) {
    out += ",\n";
    AppendString(out, key);
    out += ':';
    out += value;
  }
  if (rank) {
    out += ",\n\"rank\":";
    AppendRank(out, in, *rank);
  }
  out += "\n}\n";
  return out;
}

}  // namespace paraplan
