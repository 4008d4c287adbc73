// The interpreter: runs every rank of a program for a number of training steps.
//
// Train() starts one thread per rank (host backend), each with its own Backend and its
// communicators (joined from one CommWorld by the program's member lists), allocates the rank's
// f32 arena, initialises parameters deterministically and shard-aware (see InitValue), reads its
// data-parallel slice of the token data, and runs the role's schedule once per step. The calling
// thread collects per-step metrics in step order and hands them to `on_step`; the first failing
// rank aborts the world so no rank hangs, and Train throws RunError with that rank's message.
// A rank thread that cannot be created (memory or thread limits) aborts the ranks already
// started, which are joined, and Train throws RunError. A stop request (RunOptions::stop_request)
// ends the run at a step boundary, with a final checkpoint when checkpointing.
//
// Made by: planrun, tests. Reads: ProgramImage, token data, checkpoints.
#ifndef PARAPLAN_RUNTIME_EXEC_INTERPRETER_H_
#define PARAPLAN_RUNTIME_EXEC_INTERPRETER_H_

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/data/token_data.h"
#include "runtime/exec/program_image.h"

namespace paraplan::exec {

// The most ranks one process runs as threads (the host backend, and the CUDA backend's local
// mode on one device). Larger programs run one rank per process under a launcher.
inline constexpr int kMaxThreadRanks = 4096;

// Why a program of `world_size` ranks cannot run as threads of one process, or "" when it can.
std::string ThreadRanksLimitReason(int world_size);

class RunError : public std::runtime_error {
 public:
  explicit RunError(const std::string& what) : std::runtime_error(what) {}
};

struct StepMetrics {
  int64_t step = 0;  // from 0
  double loss = 0;   // mean token loss of the global batch
  // Multi-token prediction: the mean over its modules of their mean token loss (NaN without).
  double mtp_loss = std::nan("");
  double grad_norm = 0;  // before clipping (0 when the program computes none)
  double lr = 0;
  double seconds = 0;  // wall time of the step (slowest rank)
  double tokens_per_second = 0;
  int64_t peak_bytes = 0;  // largest backend footprint of any rank so far
  // With profiling: CPU seconds of all ranks in the step, and the part spent in kernels and in
  // collectives / transfers; the rest is the interpreter's own work.
  double cpu_seconds = 0, kernel_seconds = 0, comm_seconds = 0;
};

struct RunOptions {
  int64_t steps = -1;             // -1: the program's train.steps (counted from start_step)
  std::string data_path;          // empty: the program's train.data, else the bundled text
  bool separate_buffers = false;  // allocate each buffer on its own instead of the planned arena
  bool profile = false;           // measure kernel / collective / interpreter CPU time
  double comm_timeout_seconds = 600;
  std::string checkpoint_dir;    // where to write checkpoints (empty: none)
  int64_t checkpoint_every = 0;  // steps between checkpoints (0: only at the end when a dir is set)
  std::string resume_dir;        // resume from the latest checkpoint in this directory
  // Remove checkpoints in checkpoint_dir that the run would otherwise be refused for (another
  // program's, this program's when starting fresh, those after the resumed step).
  bool overwrite_checkpoints = false;
  // When set and nonzero (a signal number, set from a signal handler), the run stops at the
  // next step boundary that every rank can agree on: every rank finishes the step it is in, no
  // rank starts another, and a checkpoint of the steps done is written when checkpoint_dir is
  // set. Honoured when this process runs every rank (no launcher).
  const std::atomic<int>* stop_request = nullptr;
  std::function<void(const StepMetrics&)> on_step;  // called on the calling thread, in order
};

struct RunResult {
  int64_t start_step = 0;
  std::vector<StepMetrics> steps;
  bool stopped = false;          // stop_request ended the run before its last step
  int64_t checkpoint_step = -1;  // the step of the last checkpoint this run committed (-1: none)
  // Every parameter by name, assembled unsharded from the ranks' fp32 master shards after the
  // last step. Replicas are checked to be bitwise equal (RunError otherwise).
  std::map<std::string, std::vector<float>> params;
  std::string data_description;
};

// Where the ranks run. Train without a placement runs every rank of the program as a thread of
// this process on its own host backend, with an in-process communicator world. A placement
// names the world ranks this process runs (one thread each), their backends and the world
// their communicators come from (e.g. the CUDA backend's local or NCCL world). Metrics then
// cover the local ranks only (loss is NaN when none of them holds the loss).
struct RankPlacement {
  std::vector<int> ranks;
  std::vector<class Backend*> backends;  // one per entry of `ranks`
  class CommWorld* world = nullptr;
};

RunResult Train(const ProgramImage& program, const RunOptions& options,
                const RankPlacement* placement = nullptr);

// `bytes` for people: "1.25 GiB" from 1 GiB up, else "50.0 MiB" (planrun's progress lines and its
// messages about memory).
std::string FormatBytes(int64_t bytes);

// The initial value of element `index` (row-major, of the unsharded tensor) of the parameter
// with `key`: N(0, std²) from a counter-based generator keyed by (seed, key, index).
float InitValue(uint64_t seed, int64_t key, int64_t index, double std);

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_INTERPRETER_H_
