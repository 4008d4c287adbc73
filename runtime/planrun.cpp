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
// Exit status: 0 success, 1 bad input (program, data, checkpoint) or a failed run, 2 bad usage,
// 70 internal error, 128 + N stopped by signal N. Links neither LLVM nor ANTLR.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/data/token_data.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/program_image.h"
#include "runtime/launch/environment.h"
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
          const size_t at = text.find("\"step\": ", pos);
          if (at == std::string::npos || at > nl ||
              std::atoll(text.c_str() + at + 8) >= keep_before)
            break;
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
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < 0) return false;
  out = v;
  return true;
}

std::string Bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  return buf;
}

std::string Duration(double s) {
  char buf[32];
  if (s >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string program_path, backend = "host", data_path, metrics_path, resume_dir, checkpoint_dir;
  int64_t ranks = -1, steps = -1, checkpoint_every = 0, log_every = 0;
  double timeout = 600;
  bool profile = false, separate = false, checkpoint_every_given = false,
       overwrite_checkpoints = false;
  launch::LaunchOverrides overrides;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    const bool has_eq = a.rfind("--", 0) == 0 && a.find('=') != std::string::npos;
    if (has_eq) {
      value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
    }
    auto take = [&](const char* flag) -> bool {
      if (has_eq) return true;
      if (i + 1 >= args.size()) return false;
      value = args[++i];
      (void)flag;
      return true;
    };
    auto int_flag = [&](const char* flag, int64_t& out) -> int {
      if (!take(flag)) return Usage(std::string(flag) + " needs a value");
      if (!ParseInt(value, out))
        return Usage(std::string(flag) + " needs a non-negative integer, got `" + value + "`");
      return 0;
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--backend") {
      if (!take("--backend")) return Usage("--backend needs a value");
      backend = value;
    } else if (a == "--ranks") {
      if (int rc = int_flag("--ranks", ranks)) return rc;
    } else if (a == "--steps") {
      if (int rc = int_flag("--steps", steps)) return rc;
    } else if (a == "--checkpoint-every") {
      if (int rc = int_flag("--checkpoint-every", checkpoint_every)) return rc;
      checkpoint_every_given = true;
    } else if (a == "--log-every") {
      if (int rc = int_flag("--log-every", log_every)) return rc;
    } else if (a == "--timeout") {
      int64_t t = 0;
      if (int rc = int_flag("--timeout", t)) return rc;
      if (t == 0) return Usage("--timeout must be at least 1 second");
      timeout = static_cast<double>(t);
    } else if (a == "--rank" || a == "--world-size" || a == "--local-rank" ||
               a == "--local-world-size" || a == "--master-port") {
      int64_t v = 0;
      if (int rc = int_flag(a.c_str(), v)) return rc;
      if (v > 1000000) return Usage(a + " is out of range");
      const int iv = static_cast<int>(v);
      if (a == "--rank")
        overrides.rank = iv;
      else if (a == "--world-size")
        overrides.world_size = iv;
      else if (a == "--local-rank")
        overrides.local_rank = iv;
      else if (a == "--local-world-size")
        overrides.local_world_size = iv;
      else
        overrides.master_port = iv;
    } else if (a == "--master-addr") {
      if (!take("--master-addr")) return Usage("--master-addr needs a host");
      overrides.master_addr = value;
    } else if (a == "--data") {
      if (!take("--data")) return Usage("--data needs a path");
      data_path = value;
    } else if (a == "--metrics") {
      if (!take("--metrics")) return Usage("--metrics needs a file");
      metrics_path = value;
    } else if (a == "--resume") {
      if (!take("--resume")) return Usage("--resume needs a directory");
      resume_dir = value;
    } else if (a == "--checkpoint-dir") {
      if (!take("--checkpoint-dir")) return Usage("--checkpoint-dir needs a directory");
      checkpoint_dir = value;
    } else if (a == "--overwrite-checkpoints" && !has_eq) {
      overwrite_checkpoints = true;
    } else if (a == "--profile" && !has_eq) {
      profile = true;
    } else if (a == "--separate-buffers" && !has_eq) {
      separate = true;
    } else if (a.rfind("-", 0) == 0 && a != "-") {
      return Usage("unknown option `" + args[i] + "`");
    } else if (program_path.empty()) {
      program_path = args[i];
    } else {
      return Usage("more than one program given (`" + program_path + "` and `" + args[i] + "`)");
    }
  }
  if (program_path.empty())
    return Usage("no program given; compile one with `planc compile PLAN -o PROGRAM`");
  if (backend != "host" && backend != "cuda")
    return Usage("unknown backend `" + backend + "` (expected host or cuda)");
#ifndef PARAPLAN_HAVE_CUDA
  if (backend == "cuda") {
    std::cerr << "planrun: error: this planrun was built without CUDA; rebuild where a CUDA "
                 "toolkit is found, or use "
                 "--backend=host\n";
    return 2;
  }
#endif

  const auto env = launch::ReadLaunchEnvironment(launch::ProcessEnvironment(), overrides);
  if (!env) {
    std::cerr << "planrun: error: " << env.error() << "\n";
    return 2;
  }
  for (const auto& note : env->notes) std::cerr << "planrun: note: " << note << "\n";
  InstallStopHandlers(/*at_once=*/env->world_size > 1);

  try {
    const exec::ProgramImage program = exec::LoadProgramImage(program_path);
    const auto process_ranks = launch::AssignProcessRanks(*env, program.world_size);
    if (!process_ranks) {
      std::cerr << "planrun: error: " << process_ranks.error() << "\n";
      return 2;
    }
    const bool one_rank_per_process = env->world_size > 1;
    if (one_rank_per_process && backend == "host") {
      std::cerr << "planrun: error: " << launch::LauncherName(env->launcher)
                << " started this process as " << env->Describe()
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
    if (ranks >= 0 && ranks != program.world_size) {
      std::cerr << "planrun: error: the program is for " << program.world_size
                << " ranks but --ranks " << ranks
                << " was given; the host backend runs every rank of the program as a thread\n";
      return 2;
    }
    // The metrics file: never the program or the data; checked writable now without truncating
    // it, and truncated only when the first step has run, so a run refused at start (bad data, a
    // checkpoint of another plan) leaves an earlier run's metrics intact.
    MetricsFile metrics;
    std::string metrics_error;
    if (!metrics_path.empty()) {
      for (const std::string& input : {program_path, data_path}) {
        std::error_code ec;
        if (!input.empty() && std::filesystem::exists(metrics_path, ec) &&
            std::filesystem::is_regular_file(metrics_path, ec) &&
            std::filesystem::equivalent(metrics_path, input, ec)) {
          return Usage("--metrics `" + metrics_path + "` is the " +
                       (input == program_path ? "program" : "data") +
                       " file; writing metrics there would destroy it");
        }
      }
      const std::string why = MetricsFile::Check(metrics_path);
      if (!why.empty()) {
        std::cerr << "planrun: error: cannot write metrics file `" << metrics_path << "`: " << why
                  << "\n";
        return 1;
      }
    }
    const auto& m = program.model;
    const auto& p = program.parallel;
    // Where the ranks run: host threads (default), or CUDA ranks as threads on one device.
    exec::RankPlacement placement;
    const exec::RankPlacement* where = nullptr;
#ifdef PARAPLAN_HAVE_CUDA
    cuda::CudaRanks cuda_ranks;
    if (backend == "cuda") {
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
      const auto device = launch::SelectDevice(*env, cuda::CudaDeviceCount(), forced);
      if (!device) {
        std::cerr << "planrun: error: " << device.error() << "\n";
        return 1;
      }
      if (one_rank_per_process) {  // NCCL: this process is one rank
        std::vector<cuda::CommGroup> groups;
        for (const auto& c : program.communicators) {
          groups.push_back(
              {static_cast<int>(c.kind), std::vector<int>(c.members.begin(), c.members.end())});
        }
        cuda_ranks = cuda::MakeNcclRank(*env, *device, program.fingerprint, groups, lookup);
        placement.ranks.push_back(process_ranks->first_rank);
      } else {  // local mode: every rank a thread on one device
        cuda_ranks = cuda::MakeLocalCudaRanks(program.world_size, *device, timeout);
        for (int r = 0; r < program.world_size; ++r) placement.ranks.push_back(r);
      }
      for (auto& b : cuda_ranks.backends) placement.backends.push_back(b.get());
      placement.world = cuda_ranks.world.get();
      where = &placement;
    }
#endif
    if (one_rank_per_process) {
      std::printf("planrun: plan `%s` (%s): %s on the %s backend\n", program.plan_name.c_str(),
                  program.producer.c_str(), env->Describe().c_str(), backend.c_str());
    } else {
      std::printf("planrun: plan `%s` (%s): %d ranks as threads on the %s backend\n",
                  program.plan_name.c_str(), program.producer.c_str(), program.world_size,
                  backend.c_str());
    }
    std::printf(
        "planrun: model %s: %d layers, hidden %lld, heads %lld/%lld, vocab %lld, seq %lld; "
        "tp %d pp %d vpp %d dp %d sp %s zero %d\n",
        m.name.c_str(), m.layers, static_cast<long long>(m.hidden), static_cast<long long>(m.heads),
        static_cast<long long>(m.kv_heads), static_cast<long long>(m.vocab),
        static_cast<long long>(m.seq_len), p.tp, p.pp, p.vpp, p.dp, p.sp ? "on" : "off", p.zero);
    std::fflush(stdout);

    exec::RunOptions options;
    options.steps = steps;
    options.data_path = data_path;
    options.profile = profile;
    options.separate_buffers = separate;
    options.comm_timeout_seconds = timeout;
    // The plan's train.checkpoint_dir / checkpoint_every apply unless the flags say otherwise.
    if (checkpoint_dir.empty()) checkpoint_dir = program.train.checkpoint_dir;
    if (!checkpoint_every_given) checkpoint_every = program.train.checkpoint_every;
    options.checkpoint_dir = checkpoint_dir;
    options.checkpoint_every = checkpoint_every;
    options.resume_dir = resume_dir;
    options.overwrite_checkpoints = overwrite_checkpoints;
    options.stop_request = &g_stop_signal;
    int64_t total_steps = steps;
    double elapsed = 0;
    int64_t done = 0;
    options.on_step = [&](const exec::StepMetrics& s) {
      ++done;
      elapsed += s.seconds;
      const int64_t every = log_every > 0 ? log_every : (total_steps > 100 ? total_steps / 50 : 1);
      if (done == 1 || done % every == 0 || done == total_steps) {
        const double eta =
            total_steps > 0 ? elapsed / done * static_cast<double>(total_steps - done) : 0;
        std::printf(
            "[%3d%%] step %lld  loss %.4f  grad_norm %.3f  lr %.2e  %.3f s/step  %.0f tokens/s  "
            "peak %s  "
            "elapsed %s  eta %s\n",
            total_steps > 0 ? static_cast<int>(100 * done / total_steps) : 100,
            static_cast<long long>(s.step), s.loss, s.grad_norm, s.lr, s.seconds,
            s.tokens_per_second, Bytes(s.peak_bytes).c_str(), Duration(elapsed).c_str(),
            Duration(eta).c_str());
        if (profile && s.cpu_seconds > 0) {
          const double other = s.cpu_seconds - s.kernel_seconds - s.comm_seconds;
          std::printf("       cpu %.3f s: kernels %.1f%%, collectives %.1f%%, interpreter %.2f%%\n",
                      s.cpu_seconds, 100 * s.kernel_seconds / s.cpu_seconds,
                      100 * s.comm_seconds / s.cpu_seconds, 100 * other / s.cpu_seconds);
        }
        std::fflush(stdout);
      }
      if (!metrics_path.empty() && metrics_error.empty()) {
        if (!metrics.IsOpen() &&
            !metrics.Open(metrics_path, resume_dir.empty() ? -1 : s.step, &metrics_error)) {
          std::cerr << "planrun: error: " << metrics_error << "; the run goes on without metrics\n";
          return;
        }
        std::string text;
        char line[512];
        std::snprintf(
            line, sizeof line,
            "{\"version\": 1, \"step\": %lld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, "
            "\"step_seconds\": %.6f, \"tokens_per_second\": %.3f, \"peak_bytes\": %lld",
            static_cast<long long>(s.step), s.loss, s.grad_norm, s.lr, s.seconds,
            s.tokens_per_second, static_cast<long long>(s.peak_bytes));
        text += line;
        if (profile) {
          std::snprintf(line, sizeof line,
                        ", \"cpu_seconds\": %.6f, \"kernel_seconds\": %.6f, \"comm_seconds\": %.6f",
                        s.cpu_seconds, s.kernel_seconds, s.comm_seconds);
          text += line;
        }
        text += "}\n";
        if (!metrics.Append(text, metrics_path,
                            &metrics_error)) {  // said now, and the run fails at its end
          std::cerr << "planrun: error: " << metrics_error << "; the run goes on without metrics\n";
        }
      }
    };
    if (total_steps < 0) total_steps = program.train.steps;
    if (!resume_dir.empty() && steps < 0) {
      total_steps = std::max<int64_t>(
          0, program.train.steps - exec::FindCheckpoint(resume_dir, program).step);
    }
    const exec::RunResult result = exec::Train(program, options, where);
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
          first.loss, last.loss, tokens / std::max(1e-9, secs), Bytes(last.peak_bytes).c_str());
    }
    if (result.checkpoint_step >= 0) {
      std::printf("planrun: checkpoint of step %lld written to %s\n",
                  static_cast<long long>(result.checkpoint_step), checkpoint_dir.c_str());
    }
    const int sig = g_stop_signal.load();
    if (result.stopped) {
      const int64_t done_steps = static_cast<int64_t>(result.steps.size());
      std::printf(
          "planrun: stopped by %s after %lld of %lld steps (every rank finished the step it was "
          "in); %s\n",
          SignalName(sig), static_cast<long long>(done_steps), static_cast<long long>(total_steps),
          checkpoint_dir.empty() ? "no checkpoint directory is set, so the steps done are not saved"
          : result.checkpoint_step >= 0 ? ("resume with: planrun " + program_path + " --resume " +
                                           checkpoint_dir + " --checkpoint-dir " + checkpoint_dir)
                                              .c_str()
                                        : "no step was done, nothing was written");
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
