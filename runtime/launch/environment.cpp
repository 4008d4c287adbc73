#include "runtime/launch/environment.h"

#include <fmt/format.h>

#include <cctype>
#include <climits>
#include <cstdlib>

namespace paraplan::launch {
namespace {

constexpr int64_t kMaxRanks = INT_MAX;
constexpr int kDefaultPort = 29500;

// A value read from the environment, remembering the variable it came from.
struct Field {
  std::optional<int> value;
  std::string source;
};

class Reader {
 public:
  explicit Reader(const EnvLookup& env) : env_(env) {}

  std::optional<std::string> Text(const std::string& name) const {
    auto v = env_(name);
    if (v && v->empty()) return std::nullopt;  // an empty variable counts as unset
    return v;
  }
  bool Has(const std::string& name) const { return Text(name).has_value(); }

  // The first of `names` that is set, parsed into [min, max]. Records a parse error.
  Field Int(std::initializer_list<const char*> names, int64_t min, int64_t max) {
    for (const char* name : names) {
      auto text = Text(name);
      if (!text) continue;
      auto parsed = ParseIntVariable(name, *text, min, max);
      if (!parsed) {
        if (error_.empty()) error_ = parsed.error();
        return Field{std::nullopt, name};
      }
      return Field{*parsed, name};
    }
    return Field{};
  }

  const std::string& Error() const { return error_; }

 private:
  const EnvLookup& env_;
  std::string error_;
};

std::string JoinNotes(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// The launcher's values before the command line's overrides, each with the variable it came from.
struct LauncherFields {
  Field rank, world, local_rank, local_world, node_rank, nodes;
};

// Whose variables are set; the first in this order that is set names the launcher.
struct LaunchersPresent {
  bool torchrun = false, slurm_step = false, open_mpi = false, hydra = false;
};

LaunchersPresent FindLaunchers(const Reader& r) {
  LaunchersPresent p;
  p.torchrun = r.Has("RANK") || r.Has("WORLD_SIZE");
  p.slurm_step = r.Has("SLURM_PROCID") &&
                 (r.Has("SLURM_STEP_ID") || r.Has("SLURM_STEPID") || r.Has("SLURM_STEP_NUM_TASKS"));
  p.open_mpi = r.Has("OMPI_COMM_WORLD_RANK") || r.Has("OMPI_COMM_WORLD_SIZE");
  p.hydra = r.Has("PMI_RANK") || r.Has("PMI_SIZE");
  return p;
}

void ReadTorchrunFields(Reader& r, LauncherFields& f) {
  f.rank = r.Int({"RANK"}, 0, kMaxRanks - 1);
  f.world = r.Int({"WORLD_SIZE"}, 1, kMaxRanks);
  f.local_rank = r.Int({"LOCAL_RANK"}, 0, kMaxRanks - 1);
  f.local_world = r.Int({"LOCAL_WORLD_SIZE"}, 1, kMaxRanks);
  f.node_rank = r.Int({"GROUP_RANK"}, 0, kMaxRanks - 1);
}

// The tasks on this node from Slurm's compressed tasks-per-node list, when SLURM_NTASKS_PER_NODE
// did not say.
Expected<Ok> ReadSlurmTasksOnNode(const Reader& r, LauncherFields& f) {
  if (f.local_world.value) return Ok{};
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    auto text = r.Text(name);
    if (!text) continue;
    auto tasks = SlurmTasksOnNode(*text, f.node_rank.value.value_or(0));
    if (!tasks) return Fail(tasks.error());
    if (*tasks < 1) {
      return Fail(fmt::format("`{}` is `{}`: this node runs no task, yet this process is one", name,
                              *text));
    }
    f.local_world = Field{*tasks, name};
    break;
  }
  return Ok{};
}

// Slurm's defaults for the rendezvous: the first host of the node list, a port from the job id.
Expected<Ok> ReadSlurmRendezvous(Reader& r, LaunchEnvironment& out) {
  if (!r.Has("MASTER_ADDR")) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      auto text = r.Text(name);
      if (!text) continue;
      auto host = FirstSlurmHost(*text);
      if (!host) return Fail(host.error());
      out.master_addr = *host;
      break;
    }
  }
  if (!r.Has("MASTER_PORT")) {
    auto job = r.Int({"SLURM_JOB_ID", "SLURM_JOBID"}, 0, kMaxRanks);
    // A per-job port keeps two jobs that share a node from meeting at the same port.
    out.master_port = job.value ? 20000 + *job.value % 20000 : kDefaultPort;
  }
  return Ok{};
}

Expected<Ok> ReadSlurmFields(Reader& r, LauncherFields& f, LaunchEnvironment& out) {
  f.rank = r.Int({"SLURM_PROCID"}, 0, kMaxRanks - 1);
  f.world = r.Int({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, 1, kMaxRanks);
  f.local_rank = r.Int({"SLURM_LOCALID"}, 0, kMaxRanks - 1);
  f.node_rank = r.Int({"SLURM_NODEID"}, 0, kMaxRanks - 1);
  f.nodes = r.Int({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1, kMaxRanks);
  f.local_world = r.Int({"SLURM_NTASKS_PER_NODE"}, 1, kMaxRanks);
  if (auto tasks = ReadSlurmTasksOnNode(r, f); !tasks) return Fail(tasks.error());
  return ReadSlurmRendezvous(r, out);
}

void ReadOpenMpiFields(Reader& r, LauncherFields& f) {
  f.rank = r.Int({"OMPI_COMM_WORLD_RANK"}, 0, kMaxRanks - 1);
  f.world = r.Int({"OMPI_COMM_WORLD_SIZE"}, 1, kMaxRanks);
  f.local_rank = r.Int({"OMPI_COMM_WORLD_LOCAL_RANK"}, 0, kMaxRanks - 1);
  f.local_world = r.Int({"OMPI_COMM_WORLD_LOCAL_SIZE"}, 1, kMaxRanks);
  f.node_rank = r.Int({"OMPI_COMM_WORLD_NODE_RANK"}, 0, kMaxRanks - 1);
}

void ReadHydraFields(Reader& r, LauncherFields& f) {
  f.rank = r.Int({"PMI_RANK"}, 0, kMaxRanks - 1);
  f.world = r.Int({"PMI_SIZE"}, 1, kMaxRanks);
  f.local_rank = r.Int({"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, 0, kMaxRanks - 1);
  f.local_world = r.Int({"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}, 1, kMaxRanks);
}

// Picks the launcher by precedence and reads its fields, noting the launchers it ignored.
Expected<Ok> ReadLauncherFields(Reader& r, LauncherFields& f, LaunchEnvironment& out) {
  const LaunchersPresent present = FindLaunchers(r);
  std::vector<std::string> ignored;
  if (present.torchrun) {
    out.launcher = Launcher::kTorchrun;
    ReadTorchrunFields(r, f);
    if (present.slurm_step) ignored.push_back("slurm (SLURM_PROCID)");
    if (present.open_mpi) ignored.push_back("open-mpi (OMPI_COMM_WORLD_RANK)");
    if (present.hydra) ignored.push_back("mpich-hydra (PMI_RANK)");
  } else if (present.slurm_step) {
    out.launcher = Launcher::kSlurm;
    if (auto slurm = ReadSlurmFields(r, f, out); !slurm) return Fail(slurm.error());
    if (present.open_mpi) ignored.push_back("open-mpi (OMPI_COMM_WORLD_RANK)");
    if (present.hydra) ignored.push_back("mpich-hydra (PMI_RANK)");
  } else if (present.open_mpi) {
    out.launcher = Launcher::kOpenMpi;
    ReadOpenMpiFields(r, f);
  } else if (present.hydra) {
    out.launcher = Launcher::kHydra;
    ReadHydraFields(r, f);
  } else if (r.Has("SLURM_JOB_ID") && r.Has("SLURM_PROCID")) {
    out.notes.push_back(
        "a Slurm allocation was found but this is not an `srun` step, so planrun runs as one "
        "process; start it with `srun` to use the allocation's tasks");
  }
  if (!r.Error().empty()) return Fail(r.Error());
  if (!ignored.empty()) {
    out.notes.push_back(fmt::format("ignored the variables of {}: {} takes precedence",
                                    JoinNotes(ignored), LauncherName(out.launcher)));
  }
  return Ok{};
}

// Both halves of a launcher's identity must be present.
Expected<Ok> CheckLauncherIdentity(Launcher launcher, const LauncherFields& f) {
  if (launcher == Launcher::kNone) return Ok{};
  static const char* const kRankVar[] = {
      "", "", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
  static const char* const kWorldVar[] = {
      "", "", "WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  const int k = static_cast<int>(launcher);
  if (!f.rank.value) {
    return Fail(fmt::format("`{}` is set but `{}` is not; {} sets both", kWorldVar[k], kRankVar[k],
                            LauncherName(launcher)));
  }
  if (!f.world.value) {
    return Fail(fmt::format("`{}` is set but `{}` is not; {} sets both", kRankVar[k], kWorldVar[k],
                            LauncherName(launcher)));
  }
  return Ok{};
}

// Command-line values override field by field.
Expected<Ok> ApplyOverrides(const LaunchOverrides& overrides, LauncherFields& f,
                            LaunchEnvironment& out) {
  auto apply = [](Field& field, const std::optional<int>& v, const char* flag) {
    if (v) field = Field{*v, flag};
  };
  apply(f.rank, overrides.rank, "--rank");
  apply(f.world, overrides.world_size, "--world-size");
  apply(f.local_rank, overrides.local_rank, "--local-rank");
  apply(f.local_world, overrides.local_world_size, "--local-world-size");
  if (out.launcher == Launcher::kNone && (overrides.rank || overrides.world_size)) {
    out.launcher = Launcher::kCommandLine;
    if (!overrides.rank || !overrides.world_size) {
      return Fail("`--rank` and `--world-size` must be given together when no launcher set them");
    }
  }
  return Ok{};
}

Expected<Ok> ResolveRankInWorld(const LauncherFields& f, LaunchEnvironment& out) {
  out.rank = f.rank.value.value_or(0);
  out.world_size = f.world.value.value_or(1);
  out.rank_source = f.rank.source.empty() ? "default" : f.rank.source;
  out.world_source = f.world.source.empty() ? "default" : f.world.source;
  if (out.rank >= out.world_size) {
    return Fail(fmt::format("rank {} (`{}`) is not below the world size {} (`{}`)", out.rank,
                            out.rank_source, out.world_size, out.world_source));
  }
  if (out.rank < 0 || out.world_size < 1) {
    return Fail(fmt::format("rank {} of world size {} is out of range", out.rank, out.world_size));
  }
  return Ok{};
}

// Local rank and node: when the launcher did not say, assume every rank runs on this node.
Expected<Ok> ResolveRankOnNode(const LauncherFields& f, LaunchEnvironment& out) {
  out.local_world_size = f.local_world.value ? *f.local_world.value : out.world_size;
  if (out.local_world_size < 1) {
    return Fail(fmt::format("the local world size {} (`{}`) must be at least 1",
                            out.local_world_size, f.local_world.source));
  }
  if (f.local_rank.value) {
    out.local_rank = *f.local_rank.value;
  } else {
    out.local_rank = out.rank % out.local_world_size;
    if (out.world_size > 1 && out.launcher != Launcher::kCommandLine) {
      out.notes.push_back(fmt::format("the launcher set no local rank; using {}", out.local_rank));
    }
  }
  const std::string local_world_source =
      f.local_world.source.empty() ? "default" : f.local_world.source;
  if (out.local_world_size > out.world_size) {
    return Fail(
        fmt::format("the local world size {} (`{}`) is larger than the world size {} (`{}`)",
                    out.local_world_size, local_world_source, out.world_size, out.world_source));
  }
  if (out.local_rank >= out.local_world_size) {
    return Fail(fmt::format("the local rank {} (`{}`) is not below the local world size {} (`{}`)",
                            out.local_rank,
                            f.local_rank.source.empty() ? "default" : f.local_rank.source,
                            out.local_world_size, local_world_source));
  }
  out.nodes =
      f.nodes.value.value_or((out.world_size + out.local_world_size - 1) / out.local_world_size);
  out.node_rank = f.node_rank.value.value_or(out.rank / out.local_world_size);
  if (out.node_rank >= out.nodes) {
    return Fail(fmt::format("the node rank {} (`{}`) is not below the node count {}", out.node_rank,
                            f.node_rank.source.empty() ? "derived" : f.node_rank.source,
                            out.nodes));
  }
  return Ok{};
}

// The rendezvous address: MASTER_ADDR / MASTER_PORT over the launcher's defaults, the command
// line over both; required when more than one process runs.
Expected<Ok> ResolveRendezvous(Reader& r, const LaunchOverrides& overrides,
                               LaunchEnvironment& out) {
  if (auto addr = r.Text("MASTER_ADDR")) out.master_addr = *addr;
  if (overrides.master_addr) out.master_addr = *overrides.master_addr;
  Field port = r.Int({"MASTER_PORT"}, 1, 65535);
  if (!r.Error().empty()) return Fail(r.Error());
  if (port.value) out.master_port = *port.value;
  if (overrides.master_port) {
    if (*overrides.master_port < 1 || *overrides.master_port > 65535) {
      return Fail(fmt::format("`--master-port` is {}, but it must be between 1 and 65535",
                              *overrides.master_port));
    }
    out.master_port = *overrides.master_port;
  }
  if (out.world_size <= 1) return Ok{};
  if (out.master_addr.empty()) {
    return Fail(fmt::format(
        "{} processes were launched ({} from `{}`) but `MASTER_ADDR` is not set, so {} "
        "cannot find rank 0; export `MASTER_ADDR` (the host name of rank 0) and `MASTER_PORT`, "
        "e.g. `mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...`",
        out.world_size, LauncherName(out.launcher), out.world_source,
        out.rank == 0 ? std::string("the other ranks") : fmt::format("rank {}", out.rank)));
  }
  for (char c : out.master_addr) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      return Fail(fmt::format("`MASTER_ADDR` is `{}`, which is not a host name", out.master_addr));
    }
  }
  if (out.master_port == 0) out.master_port = kDefaultPort;
  return Ok{};
}

}  // namespace

std::string_view LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "no launcher";
    case Launcher::kCommandLine:
      return "the command line";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kSlurm:
      return "slurm";
    case Launcher::kOpenMpi:
      return "open-mpi";
    case Launcher::kHydra:
      return "mpich-hydra";
  }
  return "unknown";
}

std::string LaunchEnvironment::Describe() const {
  std::string s =
      fmt::format("rank {} of {} (local {} of {}, node {} of {}) from {}", rank, world_size,
                  local_rank, local_world_size, node_rank, nodes, LauncherName(launcher));
  if (world_size > 1) s += fmt::format(", rendezvous {}:{}", master_addr, master_port);
  return s;
}

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup MapEnvironment(std::map<std::string, std::string> variables) {
  return [vars = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Expected<int> ParseIntVariable(std::string_view what, std::string_view text, int64_t min,
                               int64_t max) {
  std::string_view t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  bool negative = false;
  if (!t.empty() && (t.front() == '-' || t.front() == '+')) {
    negative = t.front() == '-';
    t.remove_prefix(1);
  }
  if (t.empty()) return Fail(fmt::format("`{}` is `{}`, which is not a whole number", what, text));
  int64_t value = 0;
  for (char c : t) {
    if (c < '0' || c > '9') {
      return Fail(fmt::format("`{}` is `{}`, which is not a whole number", what, text));
    }
    if (value > (INT64_MAX - 9) / 10) {
      return Fail(fmt::format("`{}` is `{}`, which is too large", what, text));
    }
    value = value * 10 + (c - '0');
  }
  if (negative) value = -value;
  if (value < min || value > max) {
    if (max >= kMaxRanks - 1) {
      if (value > max)
        return Fail(fmt::format("`{}` is {}, which is too large (at most {})", what, value, max));
      return Fail(fmt::format("`{}` is {}, but it must be at least {}", what, value, min));
    }
    return Fail(fmt::format("`{}` is {}, but it must be between {} and {}", what, value, min, max));
  }
  return static_cast<int>(value);
}

Expected<std::string> FirstSlurmHost(std::string_view host_list) {
  // Only the first top-level item matters; commas inside brackets do not split items.
  std::string out;
  size_t i = 0;
  while (i < host_list.size() && host_list[i] != ',') {
    char c = host_list[i];
    if (c == '[') {
      size_t close = host_list.find(']', i);
      if (close == std::string_view::npos) {
        return Fail(fmt::format("the Slurm node list `{}` has an unclosed `[`", host_list));
      }
      std::string_view inside = host_list.substr(i + 1, close - i - 1);
      // First element of the bracket: up to ',' then up to '-'.
      std::string_view first = inside.substr(0, inside.find(','));
      first = first.substr(0, first.find('-'));
      if (first.empty()) {
        return Fail(fmt::format("the Slurm node list `{}` has an empty range", host_list));
      }
      for (char d : first) {
        if (d < '0' || d > '9') {
          return Fail(
              fmt::format("the Slurm node list `{}` has a range that is not numeric", host_list));
        }
      }
      out += first;
      i = close + 1;
      continue;
    }
    if (c == ']') return Fail(fmt::format("the Slurm node list `{}` has a stray `]`", host_list));
    out += c;
    ++i;
  }
  if (out.empty()) return Fail(fmt::format("the Slurm node list `{}` is empty", host_list));
  return out;
}

Expected<int> SlurmTasksOnNode(std::string_view tasks_per_node, int node) {
  // Items: "N" or "N(xK)", comma separated.
  int64_t seen = 0;
  std::string_view rest = tasks_per_node;
  auto bad = [&] {
    return Fail(fmt::format("the Slurm tasks-per-node value `{}` is not of the form `2(x3),1`",
                            tasks_per_node));
  };
  // A well-formed number out of range says so; anything else is not of the form.
  auto too_large = [&](const std::string& why) {
    if (why.find("too large") == std::string::npos) return bad();
    return Fail(fmt::format("the Slurm tasks-per-node value `{}`: {}", tasks_per_node, why));
  };
  while (!rest.empty()) {
    std::string_view item = rest.substr(0, rest.find(','));
    rest.remove_prefix(std::min(rest.size(), item.size() + 1));
    std::string_view count_text = item.substr(0, item.find('('));
    int64_t repeat = 1;
    if (count_text.size() != item.size()) {
      std::string_view rep = item.substr(count_text.size());
      if (rep.size() < 4 || rep.substr(0, 2) != "(x" || rep.back() != ')') return bad();
      auto r =
          ParseIntVariable("SLURM_TASKS_PER_NODE", rep.substr(2, rep.size() - 3), 1, kMaxRanks);
      if (!r) return too_large(r.error());
      repeat = *r;
    }
    if (count_text.empty()) return bad();
    auto count = ParseIntVariable("SLURM_TASKS_PER_NODE", count_text, 0, kMaxRanks);
    if (!count) return too_large(count.error());
    if (node < seen + repeat) return *count;
    seen += repeat;
  }
  return Fail(
      fmt::format("the Slurm tasks-per-node value `{}` describes {} nodes, but this is node {}",
                  tasks_per_node, seen, node));
}

Expected<LaunchEnvironment> ReadLaunchEnvironment(const EnvLookup& env,
                                                  const LaunchOverrides& overrides) {
  Reader r(env);
  LaunchEnvironment out;
  LauncherFields f;
  if (auto read = ReadLauncherFields(r, f, out); !read) return Fail(read.error());
  if (auto identity = CheckLauncherIdentity(out.launcher, f); !identity)
    return Fail(identity.error());
  if (auto applied = ApplyOverrides(overrides, f, out); !applied) return Fail(applied.error());
  if (auto ranks = ResolveRankInWorld(f, out); !ranks) return Fail(ranks.error());
  if (auto node = ResolveRankOnNode(f, out); !node) return Fail(node.error());
  if (auto rendezvous = ResolveRendezvous(r, overrides, out); !rendezvous)
    return Fail(rendezvous.error());
  return out;
}

Expected<ProcessRanks> AssignProcessRanks(const LaunchEnvironment& env,
                                          int64_t program_world_size) {
  if (program_world_size < 1 || program_world_size > kMaxRanks) {
    return Fail(fmt::format("the program has {} ranks, which is out of range", program_world_size));
  }
  if (env.world_size == 1) return ProcessRanks{0, static_cast<int>(program_world_size)};
  if (env.world_size == program_world_size) return ProcessRanks{env.rank, 1};
  return Fail(fmt::format(
      "{} launched {} processes (`{}` = {}) but the program was compiled for {} ranks; launch {} "
      "processes (one per rank), or one process that runs every rank itself, or recompile the "
      "plan for {} GPUs",
      LauncherName(env.launcher), env.world_size, env.world_source, env.world_size,
      program_world_size, program_world_size, env.world_size));
}

Expected<int> SelectDevice(const LaunchEnvironment& env, int visible_devices,
                           std::optional<int> forced) {
  if (visible_devices <= 0) {
    return Fail(
        "no CUDA device is visible to this process (check `CUDA_VISIBLE_DEVICES` and the "
        "job's GPU request), so the CUDA backend cannot run; use `--backend=host`");
  }
  if (forced) {
    if (*forced < 0 || *forced >= visible_devices) {
      return Fail(fmt::format("`PARAPLAN_DEVICE` is {}, but only devices 0 to {} are visible",
                              *forced, visible_devices - 1));
    }
    return *forced;
  }
  // One visible device: the scheduler bound a GPU to this task.
  if (visible_devices == 1) return 0;
  if (env.local_world_size > visible_devices) {
    return Fail(fmt::format(
        "{} processes run on this node but only {} GPUs are visible; NCCL needs one GPU per rank, "
        "so start at most {} processes per node (e.g. `srun --ntasks-per-node={}`)",
        env.local_world_size, visible_devices, visible_devices, visible_devices));
  }
  return env.local_rank;
}

}  // namespace paraplan::launch
