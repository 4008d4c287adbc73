// planc dump PROGRAM [--rank R] [--format=text|json]
//
// Reads a program file (the FlatBuffers verifier plus structural checks, then the whole-world
// verification), and prints it. Text: the program summary, or with --rank one rank's schedule,
// buffers and bodies. JSON (DESIGN.md): {"version", "plan", "world_size", ..., "ranks": [{"rank",
// "role", "coords", "schedule": [{"op", "microbatch", "chunk", "peer", ...}]}]}; peers are global
// ranks. Exit status: 0 ok, 1 the file is unreadable or invalid, 2 bad usage.
#include <llvm/Support/JSON.h>
#include <llvm/Support/raw_ostream.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "compiler/driver/commands.h"
#include "compiler/lower/print.h"
#include "compiler/lower/program.h"
#include "runtime/format/ops.h"
#include "runtime/format/read_program.h"
#include "runtime/verify/verify.h"

namespace paraplan {
namespace {

constexpr const char* kDumpUsage = "usage: planc dump PROGRAM [--rank R] [--format=text|json]\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "planc dump: %s\n%s", error.c_str(), kDumpUsage);
  return kExitUsage;
}

// The schedule op's attributes under the names of DESIGN.md's dump contract (peers as global
// ranks, the group only when the op belongs to one).
template <typename A>
void WriteTransfer(llvm::json::OStream& j, const lower::Program& p, int32_t r,
                   const lower::Op& op) {
  const A a = prog::DecodeAttrs<A>(op);
  j.attribute("microbatch", a.microbatch);
  j.attribute("chunk", a.chunk);
  j.attribute("slot", a.slot);
  j.attribute("peer", p.MemberOf(r, lower::CommKind::Pp, a.peer));
  if (a.group != 0) j.attribute("group", a.group);
}

template <typename A>
void WriteCompute(llvm::json::OStream& j, const lower::Op& op) {
  const A a = prog::DecodeAttrs<A>(op);
  j.attribute("microbatch", a.microbatch);
  j.attribute("chunk", a.chunk);
  j.attribute("slot", a.slot);
}

void WriteScheduleAttrs(llvm::json::OStream& j, const lower::Program& p, int32_t r,
                        const lower::Op& op) {
  namespace attrs = prog::attrs;
  switch (op.kind) {
    case lower::OpKind::Forward:
      return WriteCompute<attrs::Forward>(j, op);
    case lower::OpKind::Backward:
      return WriteCompute<attrs::Backward>(j, op);
    case lower::OpKind::SendActivation:
      return WriteTransfer<attrs::SendActivation>(j, p, r, op);
    case lower::OpKind::RecvActivation:
      return WriteTransfer<attrs::RecvActivation>(j, p, r, op);
    case lower::OpKind::SendGrad:
      return WriteTransfer<attrs::SendGrad>(j, p, r, op);
    case lower::OpKind::RecvGrad:
      return WriteTransfer<attrs::RecvGrad>(j, p, r, op);
    case lower::OpKind::GatherParams:
      return j.attribute("chunk", prog::DecodeAttrs<attrs::GatherParams>(op).chunk);
    case lower::OpKind::ReleaseParams:
      return j.attribute("chunk", prog::DecodeAttrs<attrs::ReleaseParams>(op).chunk);
    default:
      return;
  }
}

void WriteRank(llvm::json::OStream& j, const lower::Program& p, int32_t r) {
  const lower::Rank& rank = p.ranks[r];
  const lower::Role& role = p.roles[rank.role];
  j.object([&] {
    j.attribute("rank", r);
    j.attribute("role", role.name);
    j.attributeObject("coords", [&] {
      j.attribute("tp", rank.coords.tp);
      j.attribute("cp", rank.coords.cp);
      j.attribute("ep", rank.coords.ep);
      j.attribute("dp", rank.coords.dp);
      j.attribute("pp", rank.coords.pp);
    });
    j.attributeArray("schedule", [&] {
      for (const lower::Op& op : prog::mem::ScheduleOps(role)) {
        j.object([&] {
          j.attribute("op", std::string(lower::OpName(op.kind)));
          WriteScheduleAttrs(j, p, r, op);
        });
      }
    });
  });
}

// What the command line asks of planc dump.
struct DumpArgs {
  std::string file, format = "text";
  int64_t rank = -1;  // -1: every rank
};

// --rank R or --rank=R.
std::optional<int> ReadRank(const std::vector<std::string>& args, size_t& i, int64_t* rank) {
  const std::string& a = args[i];
  std::string v;
  if (a == "--rank") {
    if (i + 1 >= args.size()) return Usage("--rank needs a value");
    v = args[++i];
  } else {
    v = a.substr(7);
  }
  try {
    size_t used = 0;
    *rank = std::stoll(v, &used);
    if (used != v.size() || *rank < 0) throw 0;
  } catch (...) {
    return Usage("--rank takes a rank number >= 0, got '" + v + "'");
  }
  return std::nullopt;
}

// --format text|json or --format=text|json.
std::optional<int> ReadFormat(const std::vector<std::string>& args, size_t& i,
                              std::string* format) {
  const std::string& a = args[i];
  if (a == "--format") {
    if (i + 1 >= args.size()) return Usage("--format needs a value");
    *format = args[++i];
  } else {
    *format = a.substr(9);
  }
  if (*format != "text" && *format != "json")
    return Usage("--format takes text or json, got '" + *format + "'");
  return std::nullopt;
}

// Reads the command line into *out. Returns the exit status when the command is done already
// (help, or bad usage), nullopt to go on.
std::optional<int> ReadDumpArgs(const std::vector<std::string>& args, DumpArgs* out) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kDumpUsage, stdout);
      return kExitOk;
    }
    if (a == "--rank" || a.rfind("--rank=", 0) == 0) {
      if (std::optional<int> status = ReadRank(args, i, &out->rank)) return status;
    } else if (a == "--format" || a.rfind("--format=", 0) == 0) {
      if (std::optional<int> status = ReadFormat(args, i, &out->format)) return status;
    } else if (!a.empty() && a[0] == '-') {
      return Usage("unknown option '" + a + "'");
    } else if (out->file.empty()) {
      out->file = a;
    } else {
      return Usage("one PROGRAM only, got '" + out->file + "' and '" + a + "'");
    }
  }
  if (out->file.empty()) return Usage("PROGRAM is required");
  return std::nullopt;
}

// The program in `file`, read, checked and verified as a whole world; nullopt (with the reason
// on stderr) when it is unreadable or invalid.
std::optional<lower::Program> ReadVerifiedProgram(const std::string& file) {
  std::vector<uint8_t> bytes;
  std::string error;
  if (!prog::ReadProgramFile(file, &bytes, &error)) {
    std::fprintf(stderr, "planc dump: cannot read '%s': %s\n", file.c_str(), error.c_str());
    return std::nullopt;
  }
  // Loops stay loops for verification (which never lists every microbatch); printing expands one
  // role at a time.
  std::optional<lower::Program> p =
      lower::FromFlatBuffer(bytes.data(), bytes.size(), &error, /*keep_loops=*/true);
  if (!p) {
    std::fprintf(stderr, "planc dump: '%s' is not a valid program: %s\n", file.c_str(),
                 error.c_str());
    return std::nullopt;
  }
  std::vector<std::string> problems = lower::VerifyWorld(*p);
  if (!problems.empty()) {
    std::fprintf(stderr, "planc dump: '%s' fails whole-world verification:\n", file.c_str());
    for (const std::string& e : problems) std::fprintf(stderr, "  %s\n", e.c_str());
    return std::nullopt;
  }
  return p;
}

// The JSON document of DESIGN.md's dump contract on stdout: one rank, or all with `rank` -1.
void PrintProgramJson(const lower::Program& p, int64_t rank) {
  llvm::raw_fd_ostream os(1, false);
  {
    llvm::json::OStream j(os, 1);
    j.object([&] {
      j.attribute("version", 1);
      j.attribute("format_version", static_cast<int64_t>(p.format_version));
      j.attribute("plan", p.plan_name);
      j.attribute("world_size", p.world_size);
      j.attributeObject("parallel", [&] {
        j.attribute("tp", p.parallel.tp);
        j.attribute("pp", p.parallel.pp);
        j.attribute("vpp", p.parallel.vpp);
        j.attribute("cp", p.parallel.cp);
        j.attribute("ep", p.parallel.ep);
        j.attribute("dp", p.parallel.dp);
        j.attribute("sp", p.parallel.sp);
        j.attribute("zero", p.parallel.zero);
        j.attribute("schedule", p.parallel.schedule == prog::ScheduleKind::Gpipe ? "gpipe"
                                : p.parallel.schedule == prog::ScheduleKind::OneFOneB
                                    ? "1f1b"
                                    : "interleaved_1f1b");
      });
      j.attribute("microbatches", p.train.microbatches);
      j.attributeArray("ranks", [&] {
        // One rank or all of them (clang-tidy 14 takes the two branches for clones).
        if (rank >= 0) {  // NOLINT(bugprone-branch-clone)
          WriteRank(j, p, static_cast<int32_t>(rank));
        } else {
          for (int32_t r = 0; r < p.world_size; ++r) WriteRank(j, p, r);
        }
      });
    });
  }
  os << "\n";
}

}  // namespace

int RunDump(const std::vector<std::string>& args) {
  DumpArgs cmd;
  if (std::optional<int> status = ReadDumpArgs(args, &cmd)) return *status;
  std::optional<lower::Program> p = ReadVerifiedProgram(cmd.file);
  if (!p) return kExitInputError;
  if (cmd.rank >= p->world_size) {
    std::fprintf(stderr, "planc dump: --rank %lld is outside the program's world of %d ranks\n",
                 static_cast<long long>(cmd.rank), p->world_size);
    return kExitUsage;
  }
  if (cmd.format == "text") {
    std::string out = cmd.rank >= 0 ? lower::PrintRank(*p, static_cast<int32_t>(cmd.rank))
                                    : lower::PrintProgram(*p);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return kExitOk;
  }
  PrintProgramJson(*p, cmd.rank);
  return kExitOk;
}

}  // namespace paraplan
