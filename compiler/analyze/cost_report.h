// The memory and time sections of `planc explain`: JSON members (DESIGN.md's contract:
// "memory" per pipeline stage with total and breakdown in bytes; "time" with step seconds,
// tokens/s and MFU, each with its breakdown) and text, including a per-stage memory breakdown
// chart (one bar per stage, one letter per part) in text and SVG.
// Made from EstimateMemory / EstimateTime; read by cmd_explain.cpp.
#ifndef PARAPLAN_COMPILER_ANALYZE_COST_REPORT_H_
#define PARAPLAN_COMPILER_ANALYZE_COST_REPORT_H_

#include <string>

#include "compiler/analyze/memory.h"
#include "compiler/analyze/time.h"

namespace paraplan {

// {"capacity_bytes":..,"peak_bytes":..,"peak_stage":..,"stages":[{"stage":0,"total_bytes":..,
//  "breakdown":{"weights":..,...},"host_bytes":..,"layers":..,"in_flight":..}]}
std::string MemoryJson(const MemoryEstimate& memory);
// {"step_seconds":..,"tokens_per_s":..,"tokens_per_s_per_gpu":..,"mfu":..,"flop_convention":..,
//  "breakdown":{"compute":..,"communication":..,"bubble":..,"dp_sync":..,"optimizer":..,"overhead":..},
//  "stages":[{"stage":0,"microbatch_seconds":..,...}]}
std::string TimeJson(const TimeEstimate& time);
// The memory table, the bar chart and the time summary.
std::string CostText(const MemoryEstimate& memory, const TimeEstimate& time);
// A standalone SVG of the per-stage memory breakdown (stacked bars, capacity line, legend).
std::string MemoryChartSvg(const MemoryEstimate& memory);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_REPORT_H_
