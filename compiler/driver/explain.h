// `planc explain`: what every rank holds and does, from the analysis of a checked plan.
//
// The report is a pure function of (plan, layout, topology, partition): text for people
// (world, mesh axes, group kinds summarised with their node placement, per-stage layers, a
// per-rank role table that compresses big worlds), one rank in detail (--rank), JSON for tools
// (DESIGN.md's contract: version, world_size, parallel, groups with complete rank lists in
// Megatron's order, stages with chunks; the cost model adds memory and time), and an SVG
// picture of the cluster. Made by cmd_explain.cpp; tests call the functions directly.
#ifndef PARAPLAN_COMPILER_DRIVER_EXPLAIN_H_
#define PARAPLAN_COMPILER_DRIVER_EXPLAIN_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compiler/analyze/layout.h"
#include "compiler/analyze/partition.h"
#include "compiler/analyze/topology.h"
#include "compiler/plan/plan.h"

namespace paraplan {

inline constexpr int kExplainJsonVersion = 1;

struct ExplainInput {
  const Plan& plan;
  const Layout& layout;
  const Topology& topology;
  const Partition& partition;
  // Sections other analyses add (the cost model's "memory" and "time"): JSON members as
  // (key, complete JSON value) written after "stages", and text appended to the report.
  std::vector<std::pair<std::string, std::string>> json_sections = {};
  std::string text_sections = {};
};

// The whole report. Worlds up to kExplainRankRows ranks list every rank in the role table;
// bigger ones list one row per distinct role (pipeline stage) with its ranks compressed.
inline constexpr int64_t kExplainRankRows = 64;
std::string ExplainText(const ExplainInput& in);

// One rank: coordinates, node, every group it belongs to, its chunks and layers. `rank` must
// be in [0, world_size).
std::string ExplainRankText(const ExplainInput& in, int64_t rank);

// The JSON document (one line per top-level field, groups one line per kind). With `rank`,
// a "rank" object describes that rank as ExplainRankText does.
std::string ExplainJson(const ExplainInput& in, std::optional<int64_t> rank);

// The cluster as an SVG document: nodes as boxes, GPUs coloured by pipeline stage, TP (and EP,
// when it differs) groups outlined, a legend. Worlds over kSvgMaxGpus draw the first nodes
// and say how many are left out.
inline constexpr int64_t kSvgMaxGpus = 1024;
std::string ExplainSvg(const ExplainInput& in);

// Ascending rank lists as short text: "0-7, 16-23, 32" ; more than `max_runs` runs end with
// "… (N runs)".
std::string RankSetText(std::span<const int64_t> ranks, size_t max_runs = 6);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DRIVER_EXPLAIN_H_
