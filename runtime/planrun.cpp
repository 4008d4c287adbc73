// planrun: executes a compiled paraplan program.
//
//   planrun PROGRAM [--backend=host|cuda] [--ranks N] [--steps N] [--data PATH] [--metrics FILE]
//                   [--resume DIR] [--checkpoint-dir DIR] [--checkpoint-every N]
//                   [--overwrite-checkpoints]
//                   [--log-every N] [--profile] [--separate-buffers] [--timeout SECONDS]
//                   [--rank R --world-size N --local-rank L --local-world-size M
//                    --master-addr HOST --master-port P]
//
// Where the ranks run: with no launcher (world size 1) this process runs every rank of the
// program as a thread (host backend, or the CUDA backend's local mode on one GPU); under a
// launcher (torchrun, srun, mpirun, Hydra; runtime/launch) each process runs one rank with NCCL.
//
// Signals: the first SIGTERM, SIGINT or SIGHUP lets every rank finish the step it is in, writes a
// checkpoint of the steps done when a checkpoint directory is set, says so, and exits with
// 128 + the signal number (143, 130, 129). A second one exits at once with that status; every
// committed checkpoint stays whole (a checkpoint is committed by rename) and the next run
// removes the temporary directory of an interrupted one. Under a launcher (one rank per
// process) the processes cannot agree on a step without a collective, so the first signal
// stops at once.
//
// Loading: the file is decoded with the runtime's structural checks (runtime/exec/program_image.h)
// and then verified as a whole world (runtime/verify/verify.h), in every process and before any
// rank starts, so a program whose ranks would not meet is refused instead of waiting in a
// collective until --timeout.
//
// Exit status: 0 success, 1 bad input (program, data, checkpoint) or a failed run, 2 bad usage,
// 70 internal error, 128 + N stopped by signal N. Links neither LLVM nor ANTLR.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/data/token_data.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/program_image.h"
#include "runtime/json/json.h"
#include "runtime/launch/environment.h"
#include "runtime/verify/verify.h"
#ifdef PARAPLAN_HAVE_CUDA
#include "runtime/backends/cuda/cuda_backend.h"
#endif

namespace {

using namespace paraplan;

constexpr const char* kUsage =
    "usage: planrun PROGRAM [--backend=host] [--ranks N] [--steps N] [--data PATH] [--metrics "
    "FILE]\n"
    "               [--resume DIR] [--checkpoint-dir DIR] [--checkpoint-every N] "
    "[--overwrite-checkpoints]\n"
    "               [--log-every N]\n"
    "               [--profile] [--separate-buffers] [--timeout SECONDS]\n"
    "               [--rank R] [--world-size N] [--local-rank L] [--local-world-size M]\n"
    "               [--master-addr HOST] [--master-port P]\n";

// Signals. The handler only touches a lock-free atomic and calls write(2) and _exit(2).
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_stop_at_once{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

const char* SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
  }
  return "a signal";
}

void SignalSafeWrite(const char* a, const char* b, const char* c) {
  for (const char* t : {a, b, c}) {
    size_t n = 0;
    while (t[n]) ++n;
    while (n > 0) {
      const ssize_t w = ::write(STDERR_FILENO, t, n);
      if (w <= 0) return;
      t += w;
      n -= static_cast<size_t>(w);
    }
  }
}

extern "C" void OnStopSignal(int sig) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, sig) && !g_stop_at_once.load()) {
    SignalSafeWrite(
        "\nplanrun: ", SignalName(sig),
        ": finishing the current step, then stopping (send it again to stop at once)\n");
    return;
  }
  SignalSafeWrite(
      "\nplanrun: ", SignalName(sig),
      ": stopping at once; committed checkpoints are whole, the step in progress is lost\n");
  ::_exit(128 + sig);
}

void InstallStopHandlers(bool at_once) {
  g_stop_at_once.store(at_once);
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
}

// The --metrics file: one JSON line per step, each written by one write(2). A failed or short
// write is undone (the file is cut back to its last whole line) and reported at once; a resumed
// run keeps the lines of the steps before the one it resumes from and drops later ones (they
// belong to steps the checkpoint does not hold), so a stopped and resumed run has one line per
// step.
class MetricsFile {
 public:
  // Refuses a FIFO (opening it would block), a directory, a socket. Opens nothing yet.
  static std::string Check(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
      return S_ISDIR(st.st_mode)    ? "it is a directory"
             : S_ISFIFO(st.st_mode) ? "it is a FIFO"
                                    : "it is not a regular file";
    }
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) return std::strerror(errno);
    ::close(fd);
    return "";
  }

  // Opens for the first line; keeps lines of steps before `keep_before` (-1: keeps none).
  bool Open(const std::string& path, int64_t keep_before, std::string* error) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      *error = "cannot open metrics file `" + path + "`: " + std::strerror(errno);
      return false;
    }
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) {
      off_t keep = 0;
      if (keep_before > 0) {
        // Whole lines, in step order, up to the first of a step at or after keep_before.
        std::string text(static_cast<size_t>(std::min<off_t>(st.st_size, off_t{1} << 30)), '\0');
        const ssize_t n = ::pread(fd_, text.data(), text.size(), 0);
        text.resize(n > 0 ? static_cast<size_t>(n) : 0);
        size_t pos = 0;
        while (pos < text.size()) {
          const size_t nl = text.find('\n', pos);
          if (nl == std::string::npos) break;  // a torn last line goes
          const auto line = json::Parse(std::string_view(text).substr(pos, nl - pos), nullptr);
          const json::Value* step = line ? line->Find("step") : nullptr;
          const std::optional<int64_t> step_value = step ? step->AsInt64() : std::nullopt;
          if (!step_value || *step_value >= keep_before) break;
          pos = nl + 1;
        }
        keep = static_cast<off_t>(pos);
      }
      if (::ftruncate(fd_, keep) != 0) {
        *error = "cannot truncate metrics file `" + path + "`: " + std::strerror(errno);
        return false;
      }
      size_ = keep;
    }
    ::lseek(fd_, 0, SEEK_END);
    return true;
  }
  bool IsOpen() const { return fd_ >= 0; }

  // Appends one line; false with `error` set (and the line undone) when it could not be written.
  bool Append(const std::string& line, const std::string& path, std::string* error) {
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        *error =
            "writing metrics file `" + path + "` failed: " + std::strerror(w < 0 ? errno : ENOSPC);
        if (::ftruncate(fd_, size_) == 0) ::lseek(fd_, 0, SEEK_END);  // no torn line
        return false;
      }
      done += static_cast<size_t>(w);
    }
    size_ += static_cast<off_t>(line.size());
    return true;
  }
  ~MetricsFile() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
  off_t size_ = 0;
};

int Usage(const std::string& message) {
  std::cerr << "planrun: error: " << message << "\n" << kUsage;
  return 2;
}

bool ParseInt(const std::string& text, int64_t& out) {
  // Digits only: strtoll alone would take " 3" and "+3".
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < 0) return false;
  out = v;
  return true;
}

std::string Duration(double s) {
  char buf[32];
  if (s >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

// The command line, parsed.
struct Flags {
  std::string program_path, backend = "host", data_path, metrics_path, resume_dir, checkpoint_dir;
  int64_t ranks = -1, steps = -1, checkpoint_every = 0, log_every = 0;
  double timeout = 600;
  bool profile = false, separate = false, checkpoint_every_given = false,
       overwrite_checkpoints = false;
  launch::LaunchOverrides overrides;
};

// The launcher overrides (--rank, --world-size, ...): true when `flag` is one.
bool SetOverride(const std::string& flag, int value, launch::LaunchOverrides& o) {
  if (flag == "--rank") {
    o.rank = value;
  } else if (flag == "--world-size") {
    o.world_size = value;
  } else if (flag == "--local-rank") {
    o.local_rank = value;
  } else if (flag == "--local-world-size") {
    o.local_world_size = value;
  } else if (flag == "--master-port") {
    o.master_port = value;
  } else {
    return false;
  }
  return true;
}

// Parses the arguments into `f`. Returns an exit status when planrun must stop here (usage
// error: 2, --help: 0), nullopt to go on.
std::optional<int> ParseFlags(const std::vector<std::string>& args, Flags& f) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    const bool has_eq = a.rfind("--", 0) == 0 && a.find('=') != std::string::npos;
    if (has_eq) {
      value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
    }
    auto take = [&]() -> bool {
      if (has_eq) return true;
      if (i + 1 >= args.size()) return false;
      value = args[++i];
      return true;
    };
    auto int_flag = [&](int64_t& out) -> int {
      if (!take()) return Usage(a + " needs a value");
      if (!ParseInt(value, out))
        return Usage(a + " needs a non-negative integer, got `" + value + "`");
      return 0;
    };
    // Flags with a text value: the flag, where the value goes, what the value is.
    struct TextFlag {
      const char* name;
      std::string* value;
      const char* needs;
    };
    const TextFlag text_flags[] = {{"--backend", &f.backend, "a value"},
                                   {"--data", &f.data_path, "a path"},
                                   {"--metrics", &f.metrics_path, "a file"},
                                   {"--resume", &f.resume_dir, "a directory"},
                                   {"--checkpoint-dir", &f.checkpoint_dir, "a directory"}};
    const TextFlag* text_flag = nullptr;
    for (const TextFlag& t : text_flags) {
      if (a == t.name) text_flag = &t;
    }
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (text_flag) {
      if (!take()) return Usage(a + " needs " + text_flag->needs);
      *text_flag->value = value;
    } else if (a == "--master-addr") {
      if (!take()) return Usage("--master-addr needs a host");
      f.overrides.master_addr = value;
    } else if (a == "--ranks") {
      if (int rc = int_flag(f.ranks)) return rc;
    } else if (a == "--steps") {
      if (int rc = int_flag(f.steps)) return rc;
    } else if (a == "--checkpoint-every") {
      if (int rc = int_flag(f.checkpoint_every)) return rc;
      f.checkpoint_every_given = true;
    } else if (a == "--log-every") {
      if (int rc = int_flag(f.log_every)) return rc;
    } else if (a == "--timeout") {
      int64_t t = 0;
      if (int rc = int_flag(t)) return rc;
      if (t == 0) return Usage("--timeout must be at least 1 second");
      f.timeout = static_cast<double>(t);
    } else if (launch::LaunchOverrides probe; SetOverride(a, 0, probe)) {
      int64_t v = 0;
      if (int rc = int_flag(v)) return rc;
      if (v > 1000000) return Usage(a + " is out of range");
      SetOverride(a, static_cast<int>(v), f.overrides);
    } else if (a == "--overwrite-checkpoints" && !has_eq) {
      f.overwrite_checkpoints = true;
    } else if (a == "--profile" && !has_eq) {
      f.profile = true;
    } else if (a == "--separate-buffers" && !has_eq) {
      f.separate = true;
    } else if (a.rfind("-", 0) == 0 && a != "-") {
      return Usage("unknown option `" + args[i] + "`");
    } else if (f.program_path.empty()) {
      f.program_path = args[i];
    } else {
      return Usage("more than one program given (`" + f.program_path + "` and `" + args[i] + "`)");
    }
  }
  if (f.program_path.empty())
    return Usage("no program given; compile one with `planc compile PLAN -o PROGRAM`");
  if (f.backend != "host" && f.backend != "cuda")
    return Usage("unknown backend `" + f.backend + "` (expected host or cuda)");
#ifndef PARAPLAN_HAVE_CUDA
  if (f.backend == "cuda") {
    std::cerr << "planrun: error: this planrun was built without CUDA; rebuild where a CUDA "
                 "toolkit is found, or use "
                 "--backend=host\n";
    return 2;
  }
#endif
  return std::nullopt;
}

// Refuses a program that this process cannot run as launched. Returns an exit status, or
// nullopt when the program fits.
std::optional<int> CheckRankPlacement(const Flags& f, const launch::LaunchEnvironment& env,
                                      const exec::ProgramImage& program) {
  const bool one_rank_per_process = env.world_size > 1;
  if (one_rank_per_process && f.backend == "host") {
    std::cerr << "planrun: error: " << launch::LauncherName(env.launcher)
              << " started this process as " << env.Describe()
              << ", but the host backend runs every rank of the program as a thread of "
              << "one process; start planrun once, without a launcher, or use --backend=cuda "
                 "with one GPU "
              << "per process\n";
    return 2;
  }
  if (!one_rank_per_process) {
    if (const std::string why = exec::ThreadRanksLimitReason(program.world_size); !why.empty()) {
      std::cerr << "planrun: error: " << why << "\n";
      return 1;
    }
  }
  if (f.ranks >= 0 && f.ranks != program.world_size) {
    std::cerr << "planrun: error: the program is for " << program.world_size
              << " ranks but --ranks " << f.ranks
              << " was given; the host backend runs every rank of the program as a thread\n";
    return 2;
  }
  return std::nullopt;
}

// The metrics file: never the program, the data or a checkpoint; checked writable now without
// truncating it (it is truncated only when the first step has run, so a run refused at start,
// for bad data or a checkpoint of another plan, leaves an earlier run's metrics intact). Returns
// an exit status when it cannot be used.
std::optional<int> CheckMetricsPath(const Flags& f) {
  if (f.metrics_path.empty()) return std::nullopt;
  std::vector<std::pair<std::string, const char*>> inputs = {{f.program_path, "program"}};
  for (const std::string& file : data::DataFiles(f.data_path)) inputs.push_back({file, "data"});
  for (const auto& [input, what] : inputs) {
    std::error_code ec;
    if (std::filesystem::exists(f.metrics_path, ec) &&
        std::filesystem::is_regular_file(f.metrics_path, ec) &&
        std::filesystem::equivalent(f.metrics_path, input, ec)) {
      return Usage("--metrics `" + f.metrics_path + "` is the " + what + " file `" + input +
                   "`; writing metrics there would destroy it");
    }
  }
  for (const auto& [dir, flag] : {std::pair{f.resume_dir, "--resume"},
                                  std::pair{f.checkpoint_dir, "the checkpoint directory"}}) {
    if (exec::WritingDamagesCheckpoints(f.metrics_path, dir)) {
      return Usage("--metrics `" + f.metrics_path + "` lies in the checkpoints of " + flag + " `" +
                   dir + "`; writing metrics there would damage them (a metrics file beside " +
                   "the step directories is fine)");
    }
  }
  const std::string why = MetricsFile::Check(f.metrics_path);
  if (!why.empty()) {
    std::cerr << "planrun: error: cannot write metrics file `" << f.metrics_path << "`: " << why
              << "\n";
    return 1;
  }
  return std::nullopt;
}

#ifdef PARAPLAN_HAVE_CUDA
// --backend=cuda: the CUDA ranks of this process (one, under a launcher, with NCCL; else every
// rank as a thread on one device) into `ranks` and `placement`. Returns an exit status when
// there is no usable device.
std::optional<int> PlaceCudaRanks(const Flags& f, const launch::LaunchEnvironment& env,
                                  const exec::ProgramImage& program, int first_rank,
                                  cuda::CudaRanks& ranks, exec::RankPlacement& placement) {
  const std::string why = cuda::CudaUnavailableReason();
  if (!why.empty()) {
    std::cerr << "planrun: error: --backend=cuda: " << why << "\n";
    return 1;
  }
  const auto lookup = launch::ProcessEnvironment();
  std::optional<int> forced;
  if (auto text = lookup("PARAPLAN_DEVICE")) {
    auto parsed = launch::ParseIntVariable("`PARAPLAN_DEVICE`", *text, 0, 1023);
    if (!parsed) {
      std::cerr << "planrun: error: " << parsed.error() << "\n";
      return 2;
    }
    forced = *parsed;
  }
  const auto device = launch::SelectDevice(env, cuda::CudaDeviceCount(), forced);
  if (!device) {
    std::cerr << "planrun: error: " << device.error() << "\n";
    return 1;
  }
  if (env.world_size > 1) {  // NCCL: this process is one rank
    std::vector<cuda::CommGroup> groups;
    for (const auto& c : program.communicators) {
      groups.push_back(
          {static_cast<int>(c.kind), std::vector<int>(c.members.begin(), c.members.end())});
    }
    ranks = cuda::MakeNcclRank(env, *device, program.fingerprint, groups, lookup);
    placement.ranks.push_back(first_rank);
  } else {  // local mode: every rank a thread on one device
    ranks = cuda::MakeLocalCudaRanks(program.world_size, *device, f.timeout);
    for (int r = 0; r < program.world_size; ++r) placement.ranks.push_back(r);
  }
  for (auto& b : ranks.backends) placement.backends.push_back(b.get());
  placement.world = ranks.world.get();
  return std::nullopt;
}
#endif

void PrintBanner(const Flags& f, const launch::LaunchEnvironment& env,
                 const exec::ProgramImage& program) {
  const auto& m = program.model;
  const auto& p = program.parallel;
  if (env.world_size > 1) {
    std::printf("planrun: plan `%s` (%s): %s on the %s backend\n", program.plan_name.c_str(),
                program.producer.c_str(), env.Describe().c_str(), f.backend.c_str());
  } else {
    std::printf("planrun: plan `%s` (%s): %d ranks as threads on the %s backend\n",
                program.plan_name.c_str(), program.producer.c_str(), program.world_size,
                f.backend.c_str());
  }
  std::printf(
      "planrun: model %s: %d layers, hidden %lld, heads %lld/%lld, vocab %lld, seq %lld; "
      "tp %d pp %d vpp %d dp %d sp %s zero %d\n",
      m.name.c_str(), m.layers, static_cast<long long>(m.hidden), static_cast<long long>(m.heads),
      static_cast<long long>(m.kv_heads), static_cast<long long>(m.vocab),
      static_cast<long long>(m.seq_len), p.tp, p.pp, p.vpp, p.dp, p.sp ? "on" : "off", p.zero);
  std::fflush(stdout);
}

// What planrun says and writes after each step: a progress line every `log_every` steps (or
// about 50 in all), and one line of the --metrics file.
class StepReporter {
 public:
  StepReporter(const Flags& f, int64_t total_steps) : f_(f), total_steps_(total_steps) {}

  void operator()(const exec::StepMetrics& s) {
    ++done_;
    elapsed_ += s.seconds;
    const int64_t every =
        f_.log_every > 0 ? f_.log_every : (total_steps_ > 100 ? total_steps_ / 50 : 1);
    if (done_ == 1 || done_ % every == 0 || done_ == total_steps_) PrintProgress(s);
    if (!f_.metrics_path.empty() && metrics_error_.empty()) WriteMetrics(s);
  }

  // Why the metrics file failed ("" when it did not); the run then fails at its end.
  const std::string& MetricsError() const { return metrics_error_; }

 private:
  void PrintProgress(const exec::StepMetrics& s) const {
    const double eta =
        total_steps_ > 0 ? elapsed_ / done_ * static_cast<double>(total_steps_ - done_) : 0;
    char mtp[48] = "";
    if (std::isfinite(s.mtp_loss)) std::snprintf(mtp, sizeof mtp, "  mtp_loss %.4f", s.mtp_loss);
    std::printf(
        "[%3d%%] step %lld  loss %.4f%s  grad_norm %.3f  lr %.2e  %.3f s/step  %.0f tokens/s  "
        "peak %s  "
        "elapsed %s  eta %s\n",
        total_steps_ > 0 ? static_cast<int>(100 * done_ / total_steps_) : 100,
        static_cast<long long>(s.step), s.loss, mtp, s.grad_norm, s.lr, s.seconds,
        s.tokens_per_second, exec::FormatBytes(s.peak_bytes).c_str(), Duration(elapsed_).c_str(),
        Duration(eta).c_str());
    if (f_.profile && s.cpu_seconds > 0) {
      const double other = s.cpu_seconds - s.kernel_seconds - s.comm_seconds;
      std::printf("       cpu %.3f s: kernels %.1f%%, collectives %.1f%%, interpreter %.2f%%\n",
                  s.cpu_seconds, 100 * s.kernel_seconds / s.cpu_seconds,
                  100 * s.comm_seconds / s.cpu_seconds, 100 * other / s.cpu_seconds);
    }
    std::fflush(stdout);
  }

  void WriteMetrics(const exec::StepMetrics& s) {
    if (!metrics_.IsOpen() &&
        !metrics_.Open(f_.metrics_path, f_.resume_dir.empty() ? -1 : s.step, &metrics_error_)) {
      std::cerr << "planrun: error: " << metrics_error_ << "; the run goes on without metrics\n";
      return;
    }
    json::Writer line;
    line.BeginObject().Key("version").Int(1).Key("step").Int(s.step);
    line.Key("loss").Number(s.loss, 9).Key("grad_norm").Number(s.grad_norm, 9);
    if (std::isfinite(s.mtp_loss)) line.Key("mtp_loss").Number(s.mtp_loss, 9);
    line.Key("lr").Number(s.lr, 9).Key("step_seconds").Fixed(s.seconds, 6);
    line.Key("tokens_per_second").Fixed(s.tokens_per_second, 3);
    line.Key("peak_bytes").Int(s.peak_bytes);
    if (f_.profile) {
      line.Key("cpu_seconds").Fixed(s.cpu_seconds, 6);
      line.Key("kernel_seconds").Fixed(s.kernel_seconds, 6);
      line.Key("comm_seconds").Fixed(s.comm_seconds, 6);
    }
    line.EndObject();
    if (!metrics_.Append(line.Text() + "\n", f_.metrics_path, &metrics_error_)) {
      std::cerr << "planrun: error: " << metrics_error_ << "; the run goes on without metrics\n";
    }
  }

  const Flags& f_;
  int64_t total_steps_;
  int64_t done_ = 0;
  double elapsed_ = 0;
  MetricsFile metrics_;
  std::string metrics_error_;
};

// The summary after the run and planrun's exit status: 128 + signal when a signal stopped it,
// 1 when the metrics file failed, else 0.
int Summarize(const Flags& f, const exec::RunResult& result, int64_t total_steps,
              const std::string& checkpoint_dir, const std::string& metrics_error) {
  std::printf("planrun: data %s\n", result.data_description.c_str());
  if (!result.steps.empty()) {
    const auto& first = result.steps.front();
    const auto& last = result.steps.back();
    double tokens = 0, secs = 0;
    for (const auto& s : result.steps) {
      secs += s.seconds;
      tokens += s.tokens_per_second * s.seconds;
    }
    std::printf(
        "planrun: %zu steps (from step %lld) in %s: loss %.4f -> %.4f, %.0f tokens/s, peak %s "
        "per rank\n",
        result.steps.size(), static_cast<long long>(result.start_step), Duration(secs).c_str(),
        first.loss, last.loss, tokens / std::max(1e-9, secs),
        exec::FormatBytes(last.peak_bytes).c_str());
  }
  if (result.checkpoint_step >= 0) {
    std::printf("planrun: checkpoint of step %lld written to %s\n",
                static_cast<long long>(result.checkpoint_step), checkpoint_dir.c_str());
  }
  const int sig = g_stop_signal.load();
  if (result.stopped) {
    const int64_t done_steps = static_cast<int64_t>(result.steps.size());
    const std::string next =
        checkpoint_dir.empty() ? "no checkpoint directory is set, so the steps done are not saved"
        : result.checkpoint_step >= 0 ? "resume with: planrun " + f.program_path + " --resume " +
                                            checkpoint_dir + " --checkpoint-dir " + checkpoint_dir
                                      : "no step was done, nothing was written";
    std::printf(
        "planrun: stopped by %s after %lld of %lld steps (every rank finished the step it was "
        "in); %s\n",
        SignalName(sig), static_cast<long long>(done_steps), static_cast<long long>(total_steps),
        next.c_str());
    std::fflush(stdout);
    return 128 + sig;
  }
  if (sig != 0)
    std::printf("planrun: %s came after the last step had started; the run completed\n",
                SignalName(sig));
  if (!metrics_error.empty()) {
    std::cerr << "planrun: error: " << metrics_error << "\n";
    return 1;
  }
  return 0;
}

// The whole-world verifier `planc compile` runs before writing (runtime/verify/verify.h), on the
// program as loaded (loops kept, as the file holds them). A damaged or hand-edited file whose
// sends, receives or collectives do not meet is refused here, before any rank starts, instead of
// waiting in a collective until --timeout. Returns an exit status when the program fails.
std::optional<int> VerifyLoadedProgram(const Flags& f, const exec::ProgramImage& program) {
  const std::vector<std::string> problems = verify::VerifyWorld(program);
  if (problems.empty()) return std::nullopt;
  std::cerr << "planrun: error: program `" << f.program_path
            << "` fails whole-world verification: " << problems.front() << "\n";
  for (size_t i = 1; i < problems.size(); ++i)
    std::cerr << "planrun: note: " << problems[i] << "\n";
  std::cerr << "planrun: note: no rank was started; `planc compile` verifies every program it "
               "writes, so this file was damaged or edited since: compile the plan again\n";
  return 1;
}

// Loads and verifies the program, places its ranks, trains, and reports. Returns planrun's exit
// status.
int Run(Flags f, const launch::LaunchEnvironment& env) {
  const exec::ProgramImage program = exec::LoadProgramImage(f.program_path);
  if (auto rc = VerifyLoadedProgram(f, program)) return *rc;
  const auto process_ranks = launch::AssignProcessRanks(env, program.world_size);
  if (!process_ranks) {
    std::cerr << "planrun: error: " << process_ranks.error() << "\n";
    return 2;
  }
  if (auto rc = CheckRankPlacement(f, env, program)) return *rc;
  // The plan's train.checkpoint_dir / checkpoint_every apply unless the flags say otherwise.
  if (f.checkpoint_dir.empty()) f.checkpoint_dir = program.train.checkpoint_dir;
  if (!f.checkpoint_every_given) f.checkpoint_every = program.train.checkpoint_every;
  if (auto rc = CheckMetricsPath(f)) return *rc;
  // Where the ranks run: host threads (default), or CUDA ranks.
  exec::RankPlacement placement;
  const exec::RankPlacement* where = nullptr;
#ifdef PARAPLAN_HAVE_CUDA
  cuda::CudaRanks cuda_ranks;
  if (f.backend == "cuda") {
    if (auto rc =
            PlaceCudaRanks(f, env, program, process_ranks->first_rank, cuda_ranks, placement)) {
      return *rc;
    }
    where = &placement;
  }
#endif
  PrintBanner(f, env, program);

  exec::RunOptions options;
  options.steps = f.steps;
  options.data_path = f.data_path;
  options.profile = f.profile;
  options.separate_buffers = f.separate;
  options.comm_timeout_seconds = f.timeout;
  options.checkpoint_dir = f.checkpoint_dir;
  options.checkpoint_every = f.checkpoint_every;
  options.resume_dir = f.resume_dir;
  options.overwrite_checkpoints = f.overwrite_checkpoints;
  options.stop_request = &g_stop_signal;
  int64_t total_steps = f.steps >= 0 ? f.steps : program.train.steps;
  if (!f.resume_dir.empty() && f.steps < 0) {
    total_steps = std::max<int64_t>(
        0, program.train.steps - exec::FindCheckpoint(f.resume_dir, program).step);
  }
  StepReporter reporter(f, total_steps);
  options.on_step = [&](const exec::StepMetrics& s) { reporter(s); };
  const exec::RunResult result = exec::Train(program, options, where);
  return Summarize(f, result, total_steps, f.checkpoint_dir, reporter.MetricsError());
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (auto rc = ParseFlags(std::vector<std::string>(argv + 1, argv + argc), flags)) return *rc;
  const auto env = launch::ReadLaunchEnvironment(launch::ProcessEnvironment(), flags.overrides);
  if (!env) {
    std::cerr << "planrun: error: " << env.error() << "\n";
    return 2;
  }
  for (const auto& note : env->notes) std::cerr << "planrun: note: " << note << "\n";
  InstallStopHandlers(/*at_once=*/env->world_size > 1);
  try {
    return Run(flags, *env);
  } catch (const exec::ProgramError& e) {
    std::cerr << "planrun: error: " << e.what() << "\n";
    return 1;
  } catch (const data::DataError& e) {
    std::cerr << "planrun: error: " << e.what() << "\n";
    return 1;
  } catch (const exec::CheckpointError& e) {
    std::cerr << "planrun: error: " << e.what() << "\n";
    return 1;
  } catch (const exec::RunError& e) {
    std::cerr << "planrun: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "planrun: internal error: " << e.what() << "\n";
    return 70;
  }
}
