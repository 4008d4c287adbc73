#include "compiler/analyze/cost_report.h"

#include <fmt/format.h>

#include <algorithm>

namespace paraplan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kLetters = "WGOAELCRM";  // one per MemoryPart
constexpr const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f"};

}  // namespace

std::string MemoryJson(const MemoryEstimate& m) {
  std::string out = fmt::format(
      "{{\"valid\":{},\"capacity_bytes\":{},\"peak_bytes\":{},\"peak_stage\":{},"
      "\"microbatches\":{},\"stages\":[",
      m.valid ? "true" : "false", m.capacity, m.peak, m.peak_stage, m.microbatches);
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const StageMemory& s = m.stages[i];
    out += fmt::format("{}{{\"stage\":{},\"total_bytes\":{},\"breakdown\":{{", i ? "," : "",
                       s.stage, s.total);
    for (size_t p = 0; p < kMemoryPartCount; ++p)
      out += fmt::format("{}\"{}\":{}", p ? "," : "", MemoryPartName(static_cast<MemoryPart>(p)),
                         s.bytes[p]);
    out += fmt::format(
        "}},\"host_bytes\":{},\"params\":{},\"layers\":{},\"in_flight\":{},\"embedding\":{},"
        "\"loss\":{}}}",
        s.host_bytes, s.params, s.layers, s.in_flight, s.embedding ? "true" : "false",
        s.loss ? "true" : "false");
  }
  return out + "]}";
}

std::string TimeJson(const TimeEstimate& t) {
  std::string out = fmt::format(
      "{{\"valid\":{},\"step_seconds\":{:.6g},\"tokens_per_s\":{:.6g},\"tokens_per_s_per_gpu\":{:."
      "6g},\"mfu\":{:.6g},"
      "\"model_flops_per_step\":{:.6g},\"flop_convention\":\"model FLOPs without recompute, causal "
      "attention halved\","
      "\"microbatches\":{},\"critical_stage\":{},\"breakdown\":{{\"compute\":{:.6g},"
      "\"communication\":{:.6g},"
      "\"bubble\":{:.6g},\"dp_sync\":{:.6g},\"optimizer\":{:.6g},\"overhead\":{:.6g}}},",
      t.valid ? "true" : "false", t.step_s, t.tokens_per_s, t.tokens_per_s_per_gpu, t.mfu,
      t.model_flops_per_step, t.microbatches, t.critical_stage, t.compute_s, t.comm_s, t.bubble_s,
      t.dp_exposed_s, t.optimizer_s, t.overhead_s);
  // The profile that priced the plan, and how close it came to the published runs it prices
  // (each predicted with its source left out of the fit; bench/calibration).
  out += fmt::format("\"framework\":{{\"stack\":\"{}\",\"generation\":\"{}\",{}}},\"stages\":[",
                     t.framework, t.generation, CheckJsonMembers(t.checked));
  for (size_t i = 0; i < t.stages.size(); ++i) {
    const StageTime& s = t.stages[i];
    out += fmt::format(
        "{}{{\"stage\":{},\"microbatch_seconds\":{:.6g},\"gemm\":{:.6g},\"memory_bound\":{:.6g},"
        "\"recompute\":{:.6g},"
        "\"tp_comm\":{:.6g},\"cp_comm\":{:.6g},\"ep_comm\":{:.6g},\"pp_comm\":{:.6g},\"dp_sync\":{:"
        ".6g},"
        "\"dp_exposed\":{:.6g},\"optimizer\":{:.6g},\"flops_per_microbatch\":{:.6g}}}",
        i ? "," : "", s.stage, s.microbatch_s, s.gemm_s, s.memory_s, s.recompute_s, s.tp_comm_s,
        s.cp_comm_s, s.ep_comm_s, s.pp_comm_s, s.dp_sync_s, s.dp_exposed_s, s.optimizer_s, s.flops);
  }
  return out + "]}";
}

std::string CostText(const MemoryEstimate& m, const TimeEstimate& t) {
  std::string out = "\n" + PrintMemory(m);
  if (m.valid && m.capacity > 0) {
    // Bars: 60 columns = the GPU's memory; one letter per part.
    out += "\nmemory per stage (60 columns = capacity; ";
    for (size_t p = 0; p < kMemoryPartCount; ++p)
      out += fmt::format("{}{}={}", p ? " " : "", kLetters[p],
                         MemoryPartTitle(static_cast<MemoryPart>(p)));
    out += ")\n";
    const double per_col = static_cast<double>(m.capacity) / 60.0;
    for (const StageMemory& s : m.stages) {
      std::string bar;
      double acc = 0;
      size_t drawn = 0;
      for (size_t p = 0; p < kMemoryPartCount; ++p) {
        acc += static_cast<double>(s.bytes[p]);
        const size_t upto = static_cast<size_t>(std::min(acc / per_col + 0.5, 120.0));
        while (drawn < upto) {
          bar += kLetters[p];
          ++drawn;
        }
      }
      if (bar.size() > 60)
        bar.insert(60, "|");
      else
        bar += std::string(60 - bar.size(), '.') + "|";
      out += fmt::format("  stage {:>3} {} {}{}\n", s.stage, bar, FormatGiB(s.total),
                         s.total > m.capacity ? "  OUT OF MEMORY" : "");
    }
  }
  out += "\n" + PrintTime(t);
  return out;
}

std::string MemoryChartSvg(const MemoryEstimate& m) {
  const size_t n = std::max<size_t>(1, m.stages.size());
  const double width = 120 + 40.0 * static_cast<double>(n), height = 360;
  double top_bytes = static_cast<double>(std::max(m.capacity, m.peak));
  if (top_bytes <= 0) top_bytes = 1;
  const double plot = 260, base_y = 300;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"11\">\n<title>memory per pipeline stage</title>\n",
      std::max(width, 420.0), height);
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const StageMemory& s = m.stages[i];
    double y = base_y;
    const double x = 60 + 40.0 * static_cast<double>(i);
    for (size_t p = 0; p < kMemoryPartCount; ++p) {
      const double h = plot * static_cast<double>(s.bytes[p]) / top_bytes;
      if (h <= 0) continue;
      y -= h;
      out += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"30\" height=\"{:.1f}\" fill=\"{}\"><title>stage "
          "{} {}: {}</title></rect>\n",
          x, y, h, kColors[p], s.stage, MemoryPartTitle(static_cast<MemoryPart>(p)),
          FormatGiB(s.bytes[p]));
    }
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{}</text>\n", x + 15,
                       base_y + 14, s.stage);
  }
  const double cap_y = base_y - plot * static_cast<double>(m.capacity) / top_bytes;
  out += fmt::format(
      "<line x1=\"50\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\" "
      "stroke-dasharray=\"4 2\"/>\n"
      "<text x=\"52\" y=\"{:.1f}\">GPU memory {}</text>\n",
      60 + 40.0 * static_cast<double>(n), cap_y, cap_y, cap_y - 4, FormatGiB(m.capacity));
  for (size_t p = 0; p < kMemoryPartCount; ++p) {
    const double y = 330 + 0.0;
    const double x = 10 + 80.0 * static_cast<double>(p % 5);
    const size_t row = p / 5;  // five legend entries per row
    const double yy = y + 14.0 * static_cast<double>(row);
    out += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"9\" height=\"9\" fill=\"{}\"/><text x=\"{:.0f}\" "
        "y=\"{:.0f}\">{}</text>\n",
        x, yy - 8, kColors[p], x + 12, yy, MemoryPartTitle(static_cast<MemoryPart>(p)));
  }
  return out + "</svg>\n";
}

}  // namespace paraplan
