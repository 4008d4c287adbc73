// planc compile FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR] -o PROGRAM [--trace OUT.json]
//                    [--diagnostics=text|short|json|sarif] [--microbatch-group G]
//
// Loads and checks the plan (as planc check), lowers it to the program of every rank, verifies
// the whole world, and writes the program (FlatBuffers, runtime/format/program.fbs) atomically
// (output_file.h: a temporary file, then rename; never over the plan itself). --trace writes a
// Chrome/Perfetto timeline of one simulated step with durations from the time model. A one-line
// summary goes to stderr. Exit status: 0 written, 1 the plan has errors, 2 bad usage, 70 internal
// error (including a program that fails verification, P0804).
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#if defined(__GLIBC__)  // defined by the C library's headers above
#include <malloc.h>
#endif

#include "compiler/analyze/checks.h"
#include "compiler/analyze/time.h"
#include "compiler/diagnostics/render.h"
#include "compiler/driver/commands.h"
#include "compiler/driver/frontend.h"
#include "compiler/driver/output_file.h"
#include "compiler/lower/lower.h"
#include "compiler/lower/trace.h"
#include "runtime/verify/verify.h"

namespace paraplan {
namespace {

constexpr const char* kCompileUsage =
    "usage: planc compile FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR] -o PROGRAM [--trace "
    "OUT.json]\n"
    "                     [--diagnostics=text|short|json|sarif] [--microbatch-group G]\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "planc compile: %s\n%s", error.c_str(), kCompileUsage);
  return kExitUsage;
}

lower::TraceDurations DurationsFrom(const lower::Program& program, const TimeEstimate& t) {
  lower::TraceDurations d;
  int32_t vpp = std::max(1, program.parallel.vpp);
  double transfer = 0;
  for (const lower::Role& role : program.roles) {
    StageTime st;
    for (const StageTime& s : t.stages)
      if (s.stage == role.pipeline_rank) st = s;
    double fwd = st.forward_s > 0 ? st.forward_s : 1e-3;
    double total = st.microbatch_s > 0 ? st.microbatch_s - st.pp_comm_s : 3e-3;
    d.forward_s.push_back(fwd / vpp);
    d.backward_s.push_back(std::max(total - fwd, fwd) / vpp);
    d.reduce_grads_s.push_back(st.dp_exposed_s);
    d.optimizer_s.push_back(st.optimizer_s > 0 ? st.optimizer_s : t.optimizer_s);
    transfer = std::max(transfer, st.pp_comm_s / (2.0 * vpp));
    // Expert parallelism: the stage's all-to-all time per microbatch over its Ep group calls.
    int64_t calls = 0;
    for (const lower::Chunk& c : role.chunks)
      for (int32_t b : {c.forward, c.backward})
        for (const lower::Op& op : role.bodies[b].ops)
          calls += op.comm == prog::CommKind::Ep ? 1 : 0;
    d.ep_all_to_all_s.push_back(calls > 0 ? st.ep_comm_s / static_cast<double>(calls) : 0.0);
  }
  d.transfer_s = transfer > 0 ? transfer : 1e-5;
  d.step_overhead_s = t.overhead_s;
  return d;
}

// What the command line asks of planc compile.
struct CompileArgs {
  FrontendOptions opts;
  std::string output, trace;
  DiagFormat format = DiagFormat::kText;
  lower::LowerOptions lower_options;
};

// Reads the command line into *out. Returns the exit status when the command is done already
// (help, or bad usage), nullopt to go on.
std::optional<int> ReadCompileArgs(const std::vector<std::string>& args, CompileArgs* out) {
  for (const std::string& a : args)
    if (a == "-h" || a == "--help") {
      std::fputs(kCompileUsage, stdout);
      return kExitOk;
    }
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(args, &out->opts, &rest, &error)) return Usage(error);
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    auto value = [&](std::string_view name, std::string* dest) {
      if (a == name) {
        if (i + 1 >= rest.size()) return false;
        *dest = rest[++i];
        return true;
      }
      if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
        *dest = a.substr(name.size() + 1);
        return true;
      }
      return false;
    };
    std::string v;
    if (value("-o", &out->output) || value("--output", &out->output)) continue;
    if (value("--trace", &out->trace)) continue;
    if (value("--diagnostics", &v)) {
      auto f = ParseDiagFormat(v);
      if (!f) return Usage("--diagnostics takes text, short, json or sarif, got '" + v + "'");
      out->format = *f;
      continue;
    }
    if (value("--microbatch-group", &v)) {
      int group = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), group);
      if (ec != std::errc() || end != v.data() + v.size() || group < 1) {
        return Usage("--microbatch-group takes a positive integer, got '" + v + "'");
      }
      out->lower_options.microbatch_group = group;
      continue;
    }
    return Usage("unknown option '" + a + "' (or an option without its value)");
  }
  if (out->output.empty()) return Usage("-o PROGRAM is required");
  if (out->output == "-") {
    return Usage("-o takes a file: a program is binary FlatBuffers, not for standard output");
  }
  std::error_code ec;
  if (!out->trace.empty() && (out->trace == out->output || SameFile(out->trace, out->output)) &&
      (!std::filesystem::exists(out->output, ec) ||
       std::filesystem::is_regular_file(out->output, ec))) {
    return Usage("--trace and -o name the same file '" + out->output + "'");
  }
  return std::nullopt;
}

// The exit status when lowering made no program: 70 when the lowered program failed its
// verification (P0804) or nothing says why, 1 for errors in the plan.
int NoProgramStatus(const DiagnosticSink& sink) {
  if (!sink.has_errors()) {
    std::fprintf(stderr, "planc compile: internal error: no program and no diagnostic says why\n");
    return kExitInternal;
  }
  for (const Diagnostic& d : sink.diagnostics())
    if (d.kind == DiagKind::kLowerVerify) return kExitInternal;
  return kExitInputError;
}

// The Chrome/Perfetto timeline of one simulated step, and the time model's step.
struct StepTrace {
  lower::TraceResult result;
  double model_step_s = 0;
};

StepTrace TraceStep(const Plan& plan, const lower::Program& program) {
  TimeEstimate t = EstimateTime(plan);
  return {lower::ChromeTrace(program, DurationsFrom(program, t)), t.step_s};
}

// Writes the timeline; false (with the error on stderr) when the file cannot be written.
bool WriteTrace(const StepTrace& st, const std::string& trace) {
  const lower::TraceResult& tr = st.result;
  std::string error;
  if (!WriteOutputFile(trace, tr.json, &error)) {
    std::fprintf(stderr, "planc compile: %s\n", error.c_str());
    return false;
  }
  std::fprintf(stderr,
               "planc compile: wrote trace %s: simulated step %.3f s (time model: %.3f s)\n",
               trace.c_str(), tr.step_s, st.model_step_s);
  return true;
}

}  // namespace

int RunCompile(const std::vector<std::string>& args) {
  CompileArgs cmd;
  if (std::optional<int> status = ReadCompileArgs(args, &cmd)) return *status;
  auto t0 = std::chrono::steady_clock::now();
  SourceManager sm;
  DiagnosticSink sink;
  std::optional<Plan> plan = LoadPlan(cmd.opts, sm, sink);
  for (const std::string& out : {cmd.output, cmd.trace}) {
    if (std::string input = out.empty() ? "" : SourceFileAt(sm, out); !input.empty()) {
      return Usage("'" + out + "' is the source file '" + input +
                   "'; writing there would destroy it");
    }
  }
  if (plan) RunAnalysisChecks(*plan, sink);
  std::optional<lower::Program> program;
  // Without a timeline to draw, the schedules are held compact (the timeline reads ops).
  cmd.lower_options.compact_schedule = cmd.trace.empty();
  if (plan && !sink.has_errors()) program = lower::LowerPlan(*plan, cmd.lower_options, sink);
#if defined(__GLIBC__)
  // The whole-world verifier's state is freed by now, but glibc keeps freed heap pages: handed
  // back, they make room for the file's builder instead of adding to it.
  malloc_trim(0);
#endif
  RenderOptions render;
  std::string rendered = RenderDiagnostics(sink.diagnostics(), sm, cmd.format, render);
  bool machine = cmd.format == DiagFormat::kJson || cmd.format == DiagFormat::kSarif;
  std::fwrite(rendered.data(), 1, rendered.size(), machine ? stdout : stderr);
  if (!program) return NoProgramStatus(sink);
  // The timeline reads the schedules, which encoding releases: it is made first.
  std::optional<StepTrace> step_trace;
  if (!cmd.trace.empty()) step_trace = TraceStep(*plan, *program);
  const flatbuffers::DetachedBuffer bytes = prog::mem::EncodeProgramReleasingOps(*program);
  std::string error;
  if (!WriteOutputFile(cmd.output,
                       std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                       &error)) {
    std::fprintf(stderr, "planc compile: %s\n", error.c_str());
    return kExitInputError;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t peak = 0, f32 = 0;
  for (const lower::Role& r : program->roles) {
    peak = std::max(peak, r.peak_bytes);
    f32 = std::max(f32, r.fp32_arena_bytes);
  }
  // planrun's backends allocate the f32 placement (every element in f32).
  const double gib = 1024.0 * 1024 * 1024;
  std::fprintf(stderr,
               "planc compile: wrote %s: %d ranks, %zu roles, %zu communicators, %zu bytes; "
               "largest arena %.2f GiB (%.2f GiB in f32, as planrun's backends hold it); verified "
               "in %.2f s total\n",
               cmd.output.c_str(), program->world_size, program->roles.size(),
               program->communicators.size(), bytes.size(), static_cast<double>(peak) / gib,
               static_cast<double>(f32) / gib, seconds);
  if (step_trace && !WriteTrace(*step_trace, cmd.trace)) return kExitInputError;
  return kExitOk;
}

}  // namespace paraplan
