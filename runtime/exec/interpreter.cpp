#include "runtime/exec/interpreter.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <system_error>
#include <thread>

#include "runtime/backends/host/host_backend.h"
#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/rank_runner.h"

namespace paraplan::exec {

std::string ThreadRanksLimitReason(int world_size) {
  if (world_size <= kMaxThreadRanks) return "";
  return "the program has " + std::to_string(world_size) + " ranks, but one process runs at most " +
         std::to_string(kMaxThreadRanks) +
         " ranks as threads; run it with --backend=cuda under a launcher (torchrun, srun or "
         "mpirun), one rank per process";
}

float InitValue(uint64_t seed, int64_t key, int64_t index, double std) {
  const uint64_t h1 =
      data::SplitMix64(data::SplitMix64(data::SplitMix64(seed) ^ static_cast<uint64_t>(key)) ^
                       static_cast<uint64_t>(index));
  const uint64_t h2 = data::SplitMix64(h1);
  const double u1 = (static_cast<double>(h1 >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;          // [0, 1)
  return static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

std::string FormatBytes(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 30))
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
  else
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return text;
}

namespace {

struct StepRecord {
  double end_wall = 0;
  bool holds_loss = false;
  float loss = 0, norm_square = 0;
  float mtp_loss = 0;
  double cpu = 0, kernel = 0, comm = 0;
  int64_t peak = 0;
};

// What the rank threads share with the calling thread.
struct Coordinator {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::vector<StepRecord>> records;  // per rank, per step done
  std::vector<std::string> errors;               // per rank
  bool failed = false;
  int64_t committed = -1;  // the newest step whose checkpoint the calling thread committed
  double start_wall = 0;
  int ready = 0;
  // Where every rank stops (a step index of this run), agreed under `mutex`: the first rank to
  // see the request fixes it past every step any rank has started.
  int64_t stop_index = -1, started_max = -1;
  int finished = 0;
  // Gathered parameters.
  std::map<std::string, std::vector<float>> params;
  std::map<std::string, std::vector<char>> written;
  std::string replica_error;
};

// The gradient norm from its square; NaN stays NaN (std::max(0, NaN) would show it as 0).
double GradNorm(float norm_square) {
  return std::isnan(norm_square) ? std::nan("") : std::sqrt(std::max(0.0, double{norm_square}));
}

double Wall() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The root cause of a failed run, naming the world rank of the slot that reported it: the first
// error that is not another rank's abort.
std::string FirstError(const Coordinator& co, const std::vector<int>& local_ranks) {
  for (size_t r = 0; r < co.errors.size(); ++r) {
    const auto& e = co.errors[r];
    if (!e.empty() && e.rfind("aborted:", 0) != 0)
      return "rank " + std::to_string(local_ranks[r]) + ": " + e;
  }
  for (size_t r = 0; r < co.errors.size(); ++r) {
    if (!co.errors[r].empty())
      return "rank " + std::to_string(local_ranks[r]) + ": " + co.errors[r];
  }
  return "unknown failure";
}

// Loads the run's token data and refuses data too short for one batch before any thread starts.
data::TokenStream LoadTrainingTokens(const ProgramImage& program, const RunOptions& options) {
  std::string data_path = options.data_path.empty() ? program.train.data : options.data_path;
  if (data_path.empty()) data_path = PARAPLAN_DEFAULT_DATA;  // the bundled text
  data::TokenStream tokens = data::LoadTokens(data_path, program.model.vocab);
  const data::Sampler probe(tokens,
                            {program.model.seq_len, program.train.global_batch,
                             program.model.micro_batch, program.parallel.dp},
                            static_cast<uint64_t>(program.train.seed));
  return tokens;
}

// All ranks run as threads share this machine's memory: refuses a program whose arenas cannot
// fit.
void CheckArenasFitHostMemory(const ProgramImage& program) {
  double needed = 0;
  for (const auto& r : program.ranks)
    needed += static_cast<double>(program.roles[r.role].fp32_arena_bytes);
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (physical > 0 && needed > 0.9 * physical) {
    throw RunError("the program's " + std::to_string(program.world_size) + " ranks need " +
                   std::to_string(needed / 1073741824.0) +
                   " GiB of host memory for their arenas, but this machine has " +
                   std::to_string(physical / 1073741824.0) + " GiB");
  }
}

// Checks a placement against the program and returns the world ranks it names.
std::vector<int> PlacedRanks(const RankPlacement& placement, int world_size) {
  if (!placement.world || placement.backends.size() != placement.ranks.size()) {
    throw RunError("a rank placement needs a world and one backend per rank");
  }
  for (int r : placement.ranks) {
    if (r < 0 || r >= world_size)
      throw RunError("rank " + std::to_string(r) + " is outside the program's world");
  }
  return placement.ranks;
}

// The gathered copy of one parameter: its unsharded values and which of them a rank wrote.
struct GatheredParam {
  std::vector<float>* values;
  std::vector<char>* written;
};

// Where `p` is gathered, made on first use. Called under co.mutex.
GatheredParam GatheredOf(Coordinator& co, const prog::mem::Param& p) {
  auto& dst = co.params[p.name];
  auto& flags = co.written[p.name];
  if (dst.empty()) {
    int64_t n = 1;
    for (int64_t d : p.global_shape) n *= d;
    dst.assign(n, 0.0f);
    flags.assign(n, 0);
  }
  return {&dst, &flags};
}

// Adds the fp32 master value of element `local` of `p` on `rank` to the gathered parameters,
// recording the first disagreement between replicas. Called under co.mutex.
void GatherMasterElement(Coordinator& co, const RankRunner& runner, const prog::mem::Param& p,
                         GatheredParam into, int64_t local, float value) {
  std::vector<float>& dst = *into.values;
  std::vector<char>& flags = *into.written;
  const int64_t g = runner.GlobalIndex(p, local);
  if (g < 0 || g >= static_cast<int64_t>(dst.size())) return;
  if (flags[g] && std::bit_cast<uint32_t>(dst[g]) != std::bit_cast<uint32_t>(value) &&
      co.replica_error.empty()) {
    co.replica_error = "replicas of `" + p.name + "` differ at element " + std::to_string(g) +
                       " (rank " + std::to_string(runner.Rank()) + ": " + std::to_string(value) +
                       ", another: " + std::to_string(dst[g]) + ")";
  }
  dst[g] = value;
  flags[g] = 1;
}

// One rank thread's runner and backend, and the step of the last checkpoint shard it wrote.
struct RankThread {
  int slot = 0;
  RankRunner& runner;
  Backend& backend;
  int64_t last_shard = -1;
};

// One call of Train: the ranks this process runs, the checkpoint policy, and the coordination
// between the rank threads and the calling thread, which collects metrics and commits checkpoints.
class TrainingRun {
 public:
  TrainingRun(const ProgramImage& program, const RunOptions& options,
              const RankPlacement* placement)
      : program_(program), options_(options), placement_(placement) {}

  RunResult Run();

 private:
  void ReadResumePoint();
  void PlaceRanks();
  void PrepareCheckpoints();
  // Whether a checkpoint is written after step start + i of this run.
  bool CheckpointDue(int64_t i) const {
    return writes_checkpoints_ &&
           ((options_.checkpoint_every > 0 && (start_ + i + 1) % options_.checkpoint_every == 0) ||
            i + 1 == steps_);
  }

  // On the rank threads.
  bool StopBefore(int64_t i);
  void RankMain(int slot);
  void RunRank(int slot);
  void WaitForEveryRank(RankThread& rt);
  void WriteShard(RankThread& rt, int64_t ckpt_step);
  void RecordStep(const RankThread& rt);
  void RunSteps(RankThread& rt);

  // On the calling thread.
  void StartThreads();
  bool WaitForStep(int64_t i, std::vector<StepRecord>& recs, double& previous_end);
  StepMetrics SummarizeStep(int64_t i, const std::vector<StepRecord>& recs, double& previous_end);
  std::string DivergedReason(int64_t i, const std::vector<StepRecord>& recs) const;
  void CommitDueCheckpoint(int64_t i, int64_t step, RunResult& result);
  void FinishStoppedRun(RunResult& result);
  [[noreturn]] void AbortRun(const std::string& why);
  void JoinAndReport(RunResult& result);

  const ProgramImage& program_;
  const RunOptions& options_;
  const RankPlacement* placement_;
  data::TokenStream tokens_;
  CheckpointManifest manifest_;
  int64_t start_ = 0, steps_ = 0;
  std::unique_ptr<HostCommWorld> host_world_;
  std::vector<int> local_ranks_;
  CommWorld* world_ = nullptr;
  int local_ = 0;
  // Only a process that runs every rank may clean up after a failed checkpoint: under a launcher
  // other processes may still be writing their shards.
  bool all_ranks_here_ = false;
  bool writes_checkpoints_ = false;
  CheckpointLock checkpoint_lock_;
  // A stop request is honoured only where every rank is a thread here: they agree on the step.
  const std::atomic<int>* stop_request_ = nullptr;
  Coordinator co_;
  int64_t peak_ = 0;
  std::vector<std::thread> threads_;
};

void TrainingRun::ReadResumePoint() {
  if (!options_.resume_dir.empty()) {
    manifest_ = FindCheckpoint(options_.resume_dir, program_);
    start_ = manifest_.step;
  }
  steps_ =
      options_.steps >= 0 ? options_.steps : std::max<int64_t>(0, program_.train.steps - start_);
}

void TrainingRun::PlaceRanks() {
  const int world_size = program_.world_size;
  if (placement_) {
    local_ranks_ = PlacedRanks(*placement_, world_size);
  } else {
    if (const std::string why = ThreadRanksLimitReason(world_size); !why.empty())
      throw RunError(why);
    CheckArenasFitHostMemory(program_);
    host_world_ = std::make_unique<HostCommWorld>(
        world_size, comm::HostWorldOptions{options_.comm_timeout_seconds});
    local_ranks_.resize(world_size);
    std::iota(local_ranks_.begin(), local_ranks_.end(), 0);
  }
  world_ = placement_ ? placement_->world : host_world_.get();
  local_ = static_cast<int>(local_ranks_.size());
  all_ranks_here_ = local_ == world_size;
}

// The checkpoint directory: locked, writable, with room, and holding nothing this run would mix
// with, before step 0. Under a launcher the process of rank 0 checks and holds it.
void TrainingRun::PrepareCheckpoints() {
  writes_checkpoints_ = !options_.checkpoint_dir.empty();
  if (!writes_checkpoints_ ||
      std::find(local_ranks_.begin(), local_ranks_.end(), 0) == local_ranks_.end()) {
    return;
  }
  PrepareOptions prep;
  prep.overwrite = options_.overwrite_checkpoints;
  prep.clean_leftovers = all_ranks_here_;
  if (!options_.resume_dir.empty()) {
    std::error_code ec;
    if (std::filesystem::equivalent(std::filesystem::path(manifest_.directory).parent_path(),
                                    options_.checkpoint_dir, ec)) {
      prep.resume_step = start_;
    }
  }
  checkpoint_lock_ = PrepareCheckpointDirectory(options_.checkpoint_dir, program_, prep);
}

bool TrainingRun::StopBefore(int64_t i) {
  std::lock_guard<std::mutex> lock(co_.mutex);
  if (co_.stop_index < 0 && stop_request_ && stop_request_->load() != 0) {
    co_.stop_index = std::max(i, co_.started_max + 1);
    co_.cv.notify_all();
  }
  if (co_.stop_index >= 0 && i >= co_.stop_index) return true;
  co_.started_max = std::max(co_.started_max, i);
  return false;
}

void TrainingRun::RankMain(int slot) {
  try {
    RunRank(slot);
  } catch (const std::exception& e) {
    world_->Abort(std::string("rank ") + std::to_string(local_ranks_[slot]) +
                  " failed: " + e.what());
    std::lock_guard<std::mutex> lock(co_.mutex);
    co_.errors[slot] = e.what();
    co_.failed = true;
    co_.cv.notify_all();
  }
}

void TrainingRun::RunRank(int slot) {
  const int rank = local_ranks_[slot];
  std::unique_ptr<Backend> own_backend;
  if (!placement_) own_backend = MakeHostBackend();
  Backend* backend = placement_ ? placement_->backends[slot] : own_backend.get();
  // Parameter init shares the cores among the rank threads that initialise at the same time.
  const int init_threads =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(local_, 1));
  RankRunner runner(program_, rank, *world_, *backend, tokens_, options_, init_threads);
  runner.Setup();
  if (!options_.resume_dir.empty())
    ReadRankShard(manifest_, program_, rank, runner.State(), *backend);
  RankThread rt{slot, runner, *backend};
  WaitForEveryRank(rt);
  RunSteps(rt);
  {
    std::lock_guard<std::mutex> lock(co_.mutex);
    ++co_.finished;
    co_.cv.notify_all();
  }
  // Gather the final parameters from the fp32 master shards.
  std::lock_guard<std::mutex> lock(co_.mutex);
  // The map lookups by name once per parameter, not per element.
  const prog::mem::Param* last = nullptr;
  GatheredParam into{};
  runner.ForEachMasterElement([&](const prog::mem::Param& p, int64_t local, float value) {
    if (&p != last) {
      into = GatheredOf(co_, p);
      last = &p;
    }
    GatherMasterElement(co_, runner, p, into, local, value);
  });
}

// Holds the rank until every rank is set up; the last one to arrive starts the run's clock.
void TrainingRun::WaitForEveryRank(RankThread& rt) {
  if (!placement_) {
    std::vector<int> all(program_.world_size);
    std::iota(all.begin(), all.end(), 0);
    // The runtime's own group, never in the program.
    auto barrier = world_->Join(all, rt.runner.Rank(), -1);
    barrier->Barrier();
  }
  std::lock_guard<std::mutex> lock(co_.mutex);
  if (++co_.ready == local_) co_.start_wall = Wall();
}

// A rank writes its next checkpoint shard only once its previous checkpoint is committed: shards
// of later steps written ahead could fill the disk before the calling thread commits the earlier
// step, and leave no checkpoint at all.
void TrainingRun::WriteShard(RankThread& rt, int64_t ckpt_step) {
  if (rt.last_shard >= 0) {
    std::unique_lock<std::mutex> lock(co_.mutex);
    co_.cv.wait(lock, [&] { return co_.failed || co_.committed >= rt.last_shard; });
    if (co_.failed) throw RunError("aborted: the run failed while checkpointing");
  }
  WriteRankShard(BeginCheckpoint(options_.checkpoint_dir, ckpt_step), program_, rt.runner.Rank(),
                 ckpt_step, rt.runner.State(), rt.backend);
  rt.last_shard = ckpt_step;
}

// Hands the calling thread what the rank measured in the step it just finished.
void TrainingRun::RecordStep(const RankThread& rt) {
  StepRecord rec;
  rec.end_wall = Wall();
  rec.holds_loss = rt.runner.HoldsLoss();
  rec.loss = rt.runner.Loss();
  rec.mtp_loss = rt.runner.MtpLoss();
  rec.norm_square = rt.runner.GradNormSquare();
  rec.cpu = rt.runner.cpu_seconds;
  rec.kernel = rt.runner.kernel_seconds;
  rec.comm = rt.runner.comm_seconds;
  rec.peak = rt.backend.PeakBytes();
  std::lock_guard<std::mutex> lock(co_.mutex);
  co_.records[rt.slot].push_back(rec);
  co_.cv.notify_all();
}

void TrainingRun::RunSteps(RankThread& rt) {
  int64_t done = 0;
  for (int64_t i = 0; i < steps_; ++i) {
    if (StopBefore(i)) break;
    const int64_t step = start_ + i;
    rt.runner.RunStep(step);
    done = i + 1;
    if (CheckpointDue(i)) WriteShard(rt, step + 1);
    RecordStep(rt);
  }
  // Stopped early: the steps done so far are checkpointed unless that just happened.
  if (done < steps_ && done > 0 && writes_checkpoints_ && !CheckpointDue(done - 1)) {
    WriteShard(rt, start_ + done);
  }
}

void TrainingRun::StartThreads() {
  threads_.reserve(local_);
  for (int r = 0; r < local_; ++r) {
    try {
      threads_.emplace_back([this, r] { RankMain(r); });
    } catch (const std::exception& e) {  // std::system_error, or std::bad_alloc for its state
      // The ranks already started wait for this one in their first collective: abort them and
      // join them before reporting (a joinable std::thread going out of scope terminates).
      AbortRun("cannot start the thread of rank " + std::to_string(local_ranks_[r]) + " (" +
               std::to_string(r) + " of " + std::to_string(local_) + " started): " + e.what() +
               "; raise the process's memory or thread limits");
    }
  }
}

// Aborts the world, joins every started rank, abandons this run's uncommitted checkpoints where
// that is safe, and throws `why`.
void TrainingRun::AbortRun(const std::string& why) {
  world_->Abort(why);
  {
    std::lock_guard<std::mutex> lock(co_.mutex);
    co_.failed = true;
    co_.cv.notify_all();
  }
  for (auto& t : threads_) t.join();
  if (all_ranks_here_ && writes_checkpoints_)
    AbandonCheckpoints(options_.checkpoint_dir, start_ + 1, start_ + steps_);
  throw RunError(why);
}

// Waits until every rank has finished step i of this run and copies their records; false when
// the run failed or stopped before it.
bool TrainingRun::WaitForStep(int64_t i, std::vector<StepRecord>& recs, double& previous_end) {
  std::unique_lock<std::mutex> lock(co_.mutex);
  co_.cv.wait(lock, [&] {
    if (co_.failed || (co_.stop_index >= 0 && i >= co_.stop_index)) return true;
    for (const auto& r : co_.records)
      if (static_cast<int64_t>(r.size()) <= i) return false;
    return true;
  });
  if (co_.failed) return false;
  if (co_.stop_index >= 0 && i >= co_.stop_index) return false;
  for (int r = 0; r < local_; ++r) recs[r] = co_.records[r][i];
  if (i == 0) previous_end = co_.start_wall;
  return true;
}

// The metrics of step i of this run from every local rank's record of it.
StepMetrics TrainingRun::SummarizeStep(int64_t i, const std::vector<StepRecord>& recs,
                                       double& previous_end) {
  StepMetrics m;
  m.step = start_ + i;
  double end = 0;
  bool have_loss = false;
  for (const auto& rec : recs) {
    end = std::max(end, rec.end_wall);
    peak_ = std::max(peak_, rec.peak);
    if (rec.holds_loss && !have_loss) {
      m.loss = rec.loss;
      m.mtp_loss = rec.mtp_loss;
      m.grad_norm = GradNorm(rec.norm_square);
      have_loss = true;
    }
    m.cpu_seconds += rec.cpu;
    m.kernel_seconds += rec.kernel;
    m.comm_seconds += rec.comm;
  }
  if (!have_loss) {
    m.loss = std::nan("");
    m.grad_norm = GradNorm(recs[0].norm_square);
  }
  if (i > 0) {  // profile counters are cumulative
    std::lock_guard<std::mutex> lock(co_.mutex);
    for (int r = 0; r < local_; ++r) {
      m.cpu_seconds -= co_.records[r][i - 1].cpu;
      m.kernel_seconds -= co_.records[r][i - 1].kernel;
      m.comm_seconds -= co_.records[r][i - 1].comm;
    }
  }
  m.seconds = std::max(1e-9, end - previous_end);
  previous_end = end;
  m.tokens_per_second =
      static_cast<double>(program_.train.global_batch * program_.model.seq_len) / m.seconds;
  m.peak_bytes = peak_;
  m.lr = host::WarmupCosineLr(m.step, program_.train.warmup_steps, program_.train.steps,
                              program_.train.lr, program_.train.min_lr);
  return m;
}

// Why step i of this run cannot go on: a loss or gradient norm that is not finite on any local
// rank (the run diverged, or resumed from diverged weights); "" when every one is finite.
// Megatron-LM stops the same way (--check-for-nan-in-loss-and-grad, on by default).
std::string TrainingRun::DivergedReason(int64_t i, const std::vector<StepRecord>& recs) const {
  for (size_t r = 0; r < recs.size(); ++r) {
    const bool bad_loss = recs[r].holds_loss && !std::isfinite(recs[r].loss);
    if (!bad_loss && std::isfinite(recs[r].norm_square)) continue;
    // NaN without its sign bit: "-nan" reads as a negative number.
    const auto shown = [](double v) { return std::isnan(v) ? std::nan("") : v; };
    char what[160];
    if (recs[r].holds_loss) {
      std::snprintf(what, sizeof what, "the loss is %g and the gradient norm %g",
                    shown(recs[r].loss), shown(GradNorm(recs[r].norm_square)));
    } else {
      std::snprintf(what, sizeof what, "the gradient norm is %g",
                    shown(GradNorm(recs[r].norm_square)));
    }
    char lr[32];
    std::snprintf(lr, sizeof lr, "%g", program_.train.lr);
    return "step " + std::to_string(start_ + i) + " diverged on rank " +
           std::to_string(local_ranks_[r]) + ": " + what + "; no checkpoint of it or later is " +
           "kept. Lower train.lr (" + lr + ") or lengthen the warmup, and resume from a " +
           "checkpoint written before the loss rose";
  }
  return "";
}

// Commits the checkpoint written after step `step` (index i of this run) when one is due, and
// lets the ranks write their next shards.
void TrainingRun::CommitDueCheckpoint(int64_t i, int64_t step, RunResult& result) {
  if (!CheckpointDue(i)) return;
  try {
    CommitCheckpoint(options_.checkpoint_dir, BeginCheckpoint(options_.checkpoint_dir, step + 1),
                     program_, step + 1);
    result.checkpoint_step = step + 1;
    std::lock_guard<std::mutex> lock(co_.mutex);
    co_.committed = step + 1;
    co_.cv.notify_all();
  } catch (const std::exception& e) {
    AbortRun(e.what());
  }
}

// Waits for every rank to finish; after a stop request, commits the checkpoint of the steps done
// unless a due one already holds them.
void TrainingRun::FinishStoppedRun(RunResult& result) {
  bool stopped = false;
  int64_t stopped_done = 0;
  {
    std::unique_lock<std::mutex> lock(co_.mutex);
    co_.cv.wait(lock, [&] { return co_.failed || co_.finished == local_; });
    stopped = !co_.failed && co_.stop_index >= 0 && co_.stop_index < steps_;
    stopped_done = co_.stop_index;
  }
  if (stopped && stopped_done > 0 && writes_checkpoints_ && !CheckpointDue(stopped_done - 1)) {
    try {
      CommitCheckpoint(options_.checkpoint_dir,
                       BeginCheckpoint(options_.checkpoint_dir, start_ + stopped_done), program_,
                       start_ + stopped_done);
      result.checkpoint_step = start_ + stopped_done;
    } catch (const std::exception& e) {
      AbortRun(e.what());
    }
  }
  result.stopped = stopped;
}

// Joins the ranks and throws the run's first failure, if any, or hands over the parameters.
void TrainingRun::JoinAndReport(RunResult& result) {
  for (auto& t : threads_) t.join();
  if (co_.failed && all_ranks_here_ && writes_checkpoints_) {
    AbandonCheckpoints(options_.checkpoint_dir, start_ + 1, start_ + steps_);
  }
  if (co_.failed) throw RunError(FirstError(co_, local_ranks_));
  if (!co_.replica_error.empty()) throw RunError(co_.replica_error);
  result.params = std::move(co_.params);
}

RunResult TrainingRun::Run() {
  tokens_ = LoadTrainingTokens(program_, options_);
  ReadResumePoint();
  PlaceRanks();
  PrepareCheckpoints();
  stop_request_ = all_ranks_here_ ? options_.stop_request : nullptr;
  co_.records.resize(local_);
  co_.errors.resize(local_);
  StartThreads();

  RunResult result;
  result.start_step = start_;
  result.data_description = tokens_.description;
  double previous_end = 0;
  for (int64_t i = 0; i < steps_; ++i) {
    std::vector<StepRecord> recs(local_);
    if (!WaitForStep(i, recs, previous_end)) break;
    const StepMetrics m = SummarizeStep(i, recs, previous_end);
    // The step is reported before its checkpoint is committed: a kill in between leaves a metrics
    // line of a step the checkpoint lacks (a resumed run replaces it), never a step without one.
    result.steps.push_back(m);
    if (options_.on_step) options_.on_step(m);
    if (const std::string why = DivergedReason(i, recs); !why.empty()) AbortRun(why);
    CommitDueCheckpoint(i, m.step, result);
  }
  FinishStoppedRun(result);
  JoinAndReport(result);
  return result;
}

}  // namespace

RunResult Train(const ProgramImage& program, const RunOptions& options,
                const RankPlacement* placement) {
  TrainingRun run(program, options, placement);
  return run.Run();
}

}  // namespace paraplan::exec
