#include "runtime/exec/interpreter.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
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

namespace {

struct StepRecord {
  double end_wall = 0;
  bool holds_loss = false;
  float loss = 0, norm_square = 0;
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
  // Gathered parameters.
  std::map<std::string, std::vector<float>> params;
  std::map<std::string, std::vector<char>> written;
  std::string replica_error;
};

double Wall() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string FirstError(const Coordinator& co) {
  // The root cause is the first error that is not another rank's abort.
  for (size_t r = 0; r < co.errors.size(); ++r) {
    const auto& e = co.errors[r];
    if (!e.empty() && e.rfind("aborted:", 0) != 0) return "rank " + std::to_string(r) + ": " + e;
  }
  for (size_t r = 0; r < co.errors.size(); ++r) {
    if (!co.errors[r].empty()) return "rank " + std::to_string(r) + ": " + co.errors[r];
  }
  return "unknown failure";
}

}  // namespace

RunResult Train(const ProgramImage& program, const RunOptions& options,
                const RankPlacement* placement) {
  std::string data_path = options.data_path.empty() ? program.train.data : options.data_path;
  if (data_path.empty()) data_path = PARAPLAN_DEFAULT_DATA;  // the bundled text
  const data::TokenStream tokens = data::LoadTokens(data_path, program.model.vocab);
  {  // Refuse short data before starting any thread.
    data::Sampler probe(tokens,
                        {program.model.seq_len, program.train.global_batch,
                         program.model.micro_batch, program.parallel.dp},
                        static_cast<uint64_t>(program.train.seed));
  }
  CheckpointManifest manifest;
  int64_t start = 0;
  if (!options.resume_dir.empty()) {
    manifest = FindCheckpoint(options.resume_dir, program);
    start = manifest.step;
  }
  const int64_t steps =
      options.steps >= 0 ? options.steps : std::max<int64_t>(0, program.train.steps - start);
  const int world_size = program.world_size;

  std::unique_ptr<HostCommWorld> host_world;
  std::vector<int> local_ranks;
  if (placement) {
    if (!placement->world || placement->backends.size() != placement->ranks.size()) {
      throw RunError("a rank placement needs a world and one backend per rank");
    }
    for (int r : placement->ranks) {
      if (r < 0 || r >= world_size)
        throw RunError("rank " + std::to_string(r) + " is outside the program's world");
    }
    local_ranks = placement->ranks;
  } else {
    if (const std::string why = ThreadRanksLimitReason(world_size); !why.empty())
      throw RunError(why);
    // All ranks share this machine's memory: refuse a program whose arenas cannot fit.
    double needed = 0;
    for (const auto& r : program.ranks)
      needed += static_cast<double>(program.roles[r.role].fp32_arena_bytes);
    const double physical =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    if (physical > 0 && needed > 0.9 * physical) {
      throw RunError("the program's " + std::to_string(world_size) + " ranks need " +
                     std::to_string(needed / 1073741824.0) +
                     " GiB of host memory for their arenas, but this machine has " +
                     std::to_string(physical / 1073741824.0) + " GiB");
    }
    host_world = std::make_unique<HostCommWorld>(
        world_size, comm::HostWorldOptions{options.comm_timeout_seconds});
    local_ranks.resize(world_size);
    std::iota(local_ranks.begin(), local_ranks.end(), 0);
  }
  CommWorld& world = placement ? *placement->world : *host_world;
  const int local = static_cast<int>(local_ranks.size());
  // Only a process that runs every rank may clean up after a failed checkpoint: under a launcher
  // other processes may still be writing their shards.
  const bool all_ranks_here = local == world_size;
  // The checkpoint directory: locked, writable, with room, and holding nothing this run would mix
  // with, before step 0. Under a launcher the process of rank 0 checks and holds it.
  CheckpointLock checkpoint_lock;
  const bool writes_checkpoints = !options.checkpoint_dir.empty();
  if (writes_checkpoints &&
      std::find(local_ranks.begin(), local_ranks.end(), 0) != local_ranks.end()) {
    PrepareOptions prep;
    prep.overwrite = options.overwrite_checkpoints;
    prep.clean_leftovers = all_ranks_here;
    if (!options.resume_dir.empty()) {
      std::error_code ec;
      if (std::filesystem::equivalent(std::filesystem::path(manifest.directory).parent_path(),
                                      options.checkpoint_dir, ec)) {
        prep.resume_step = start;
      }
    }
    checkpoint_lock = PrepareCheckpointDirectory(options.checkpoint_dir, program, prep);
  }
  auto checkpoint_due = [&](int64_t i) {  // after step start + i of this run
    return writes_checkpoints &&
           ((options.checkpoint_every > 0 && (start + i + 1) % options.checkpoint_every == 0) ||
            i + 1 == steps);
  };
  // A stop request is honoured only where every rank is a thread here: they agree on the step.
  const std::atomic<int>* stop_request = all_ranks_here ? options.stop_request : nullptr;
  Coordinator co;
  co.records.resize(local);
  co.errors.resize(local);
  // Where every rank stops (a step index of this run), agreed under co.mutex: the first rank
  // to see the request fixes it past every step any rank has started.
  int64_t stop_index = -1, started_max = -1;
  int finished = 0;
  auto stop_before = [&](int64_t i) {
    std::lock_guard<std::mutex> lock(co.mutex);
    if (stop_index < 0 && stop_request && stop_request->load() != 0) {
      stop_index = std::max(i, started_max + 1);
      co.cv.notify_all();
    }
    if (stop_index >= 0 && i >= stop_index) return true;
    started_max = std::max(started_max, i);
    return false;
  };

  auto rank_main = [&](int slot) {
    const int rank = local_ranks[slot];
    try {
      std::unique_ptr<Backend> own_backend;
      if (!placement) own_backend = MakeHostBackend();
      Backend* backend = placement ? placement->backends[slot] : own_backend.get();
      RankRunner runner(program, rank, world, *backend, tokens, options);
      runner.Setup();
      if (start > 0) ReadRankShard(manifest, program, rank, runner.State(), *backend);
      if (!placement) {
        std::vector<int> all(world_size);
        std::iota(all.begin(), all.end(), 0);
        auto barrier = world.Join(all, rank, -1);  // the runtime's own group, never in the program
        barrier->Barrier();
      }
      {
        std::lock_guard<std::mutex> lock(co.mutex);
        if (++co.ready == local) co.start_wall = Wall();
      }
      // A rank writes its next checkpoint shard only once its previous checkpoint is committed:
      // shards of later steps written ahead could fill the disk before the calling thread commits
      // the earlier step, and leave no checkpoint at all.
      int64_t last_shard = -1;
      auto write_shard = [&](int64_t ckpt_step) {
        if (last_shard >= 0) {
          std::unique_lock<std::mutex> lock(co.mutex);
          co.cv.wait(lock, [&] { return co.failed || co.committed >= last_shard; });
          if (co.failed) throw RunError("aborted: the run failed while checkpointing");
        }
        WriteRankShard(BeginCheckpoint(options.checkpoint_dir, ckpt_step), program, rank, ckpt_step,
                       runner.State(), *backend);
        last_shard = ckpt_step;
      };
      int64_t done = 0;
      for (int64_t i = 0; i < steps; ++i) {
        if (stop_before(i)) break;
        const int64_t step = start + i;
        runner.RunStep(step);
        done = i + 1;
        if (checkpoint_due(i)) write_shard(step + 1);
        StepRecord rec;
        rec.end_wall = Wall();
        rec.holds_loss = runner.HoldsLoss();
        rec.loss = runner.Loss();
        rec.norm_square = runner.GradNormSquare();
        rec.cpu = runner.cpu_seconds;
        rec.kernel = runner.kernel_seconds;
        rec.comm = runner.comm_seconds;
        rec.peak = backend->PeakBytes();
        std::lock_guard<std::mutex> lock(co.mutex);
        co.records[slot].push_back(rec);
        co.cv.notify_all();
      }
      // Stopped early: the steps done so far are checkpointed unless that just happened.
      if (done < steps && done > 0 && writes_checkpoints && !checkpoint_due(done - 1)) {
        write_shard(start + done);
      }
      {
        std::lock_guard<std::mutex> lock(co.mutex);
        ++finished;
        co.cv.notify_all();
      }
      // Gather the final parameters from the fp32 master shards.
      std::lock_guard<std::mutex> lock(co.mutex);
      runner.ForEachMasterElement([&](const prog::mem::Param& p, int64_t local, float value) {
        auto& dst = co.params[p.name];
        auto& flags = co.written[p.name];
        if (dst.empty()) {
          int64_t n = 1;
          for (int64_t d : p.global_shape) n *= d;
          dst.assign(n, 0.0f);
          flags.assign(n, 0);
        }
        const int64_t g = runner.GlobalIndex(p, local);
        if (g < 0 || g >= static_cast<int64_t>(dst.size())) return;
        if (flags[g] && std::bit_cast<uint32_t>(dst[g]) != std::bit_cast<uint32_t>(value) &&
            co.replica_error.empty()) {
          co.replica_error = "replicas of `" + p.name + "` differ at element " + std::to_string(g) +
                             " (rank " + std::to_string(rank) + ": " + std::to_string(value) +
                             ", another: " + std::to_string(dst[g]) + ")";
        }
        dst[g] = value;
        flags[g] = 1;
      });
    } catch (const std::exception& e) {
      world.Abort(std::string("rank ") + std::to_string(rank) + " failed: " + e.what());
      std::lock_guard<std::mutex> lock(co.mutex);
      co.errors[slot] = e.what();
      co.failed = true;
      co.cv.notify_all();
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < local; ++r) {
    try {
      threads.emplace_back(rank_main, r);
    } catch (const std::exception& e) {  // std::system_error, or std::bad_alloc for its state
      // The ranks already started wait for this one in their first collective: abort them and
      // join them before reporting (a joinable std::thread going out of scope terminates).
      const std::string why = "cannot start the thread of rank " + std::to_string(local_ranks[r]) +
                              " (" + std::to_string(r) + " of " + std::to_string(local) +
                              " started): " + e.what() +
                              "; raise the process's memory or thread limits";
      world.Abort(why);
      for (auto& t : threads) t.join();
      if (all_ranks_here && writes_checkpoints)
        AbandonCheckpoints(options.checkpoint_dir, start + 1, start + steps);
      throw RunError(why);
    }
  }

  RunResult result;
  result.start_step = start;
  result.data_description = tokens.description;
  double previous_end = 0;
  int64_t peak = 0;
  for (int64_t i = 0; i < steps; ++i) {
    std::vector<StepRecord> recs(local);
    {
      std::unique_lock<std::mutex> lock(co.mutex);
      co.cv.wait(lock, [&] {
        if (co.failed || (stop_index >= 0 && i >= stop_index)) return true;
        for (const auto& r : co.records)
          if (static_cast<int64_t>(r.size()) <= i) return false;
        return true;
      });
      if (co.failed) break;
      if (stop_index >= 0 && i >= stop_index) break;
      for (int r = 0; r < local; ++r) recs[r] = co.records[r][i];
      if (i == 0) previous_end = co.start_wall;
    }
    StepMetrics m;
    m.step = start + i;
    double end = 0;
    bool have_loss = false;
    for (const auto& rec : recs) {
      end = std::max(end, rec.end_wall);
      peak = std::max(peak, rec.peak);
      if (rec.holds_loss && !have_loss) {
        m.loss = rec.loss;
        m.grad_norm = std::sqrt(std::max(0.0f, rec.norm_square));
        have_loss = true;
      }
      m.cpu_seconds += rec.cpu;
      m.kernel_seconds += rec.kernel;
      m.comm_seconds += rec.comm;
    }
    if (!have_loss) {
      m.loss = std::nan("");
      m.grad_norm = std::sqrt(std::max(0.0f, recs[0].norm_square));
    }
    if (i > 0) {  // profile counters are cumulative
      std::lock_guard<std::mutex> lock(co.mutex);
      for (int r = 0; r < local; ++r) {
        m.cpu_seconds -= co.records[r][i - 1].cpu;
        m.kernel_seconds -= co.records[r][i - 1].kernel;
        m.comm_seconds -= co.records[r][i - 1].comm;
      }
    }
    m.seconds = std::max(1e-9, end - previous_end);
    previous_end = end;
    m.tokens_per_second =
        static_cast<double>(program.train.global_batch * program.model.seq_len) / m.seconds;
    m.peak_bytes = peak;
    m.lr = host::WarmupCosineLr(m.step, program.train.warmup_steps, program.train.steps,
                                program.train.lr, program.train.min_lr);
    // The step is reported before its checkpoint is committed: a kill in between leaves a metrics
    // line of a step the checkpoint lacks (a resumed run replaces it), never a step without one.
    result.steps.push_back(m);
    if (options.on_step) options.on_step(m);
    if (checkpoint_due(i)) {
      try {
        CommitCheckpoint(options.checkpoint_dir,
                         BeginCheckpoint(options.checkpoint_dir, m.step + 1), program, m.step + 1);
        result.checkpoint_step = m.step + 1;
        std::lock_guard<std::mutex> lock(co.mutex);
        co.committed = m.step + 1;
        co.cv.notify_all();
      } catch (const std::exception& e) {
        world.Abort(e.what());
        {
          std::lock_guard<std::mutex> lock(co.mutex);
          co.failed = true;
          co.cv.notify_all();
        }
        for (auto& t : threads) t.join();
        if (all_ranks_here) AbandonCheckpoints(options.checkpoint_dir, start + 1, start + steps);
        throw RunError(e.what());
      }
    }
  }
  bool stopped = false;
  int64_t stopped_done = 0;
  {
    std::unique_lock<std::mutex> lock(co.mutex);
    co.cv.wait(lock, [&] { return co.failed || finished == local; });
    stopped = !co.failed && stop_index >= 0 && stop_index < steps;
    stopped_done = stop_index;
  }
  if (stopped && stopped_done > 0 && writes_checkpoints && !checkpoint_due(stopped_done - 1)) {
    try {
      CommitCheckpoint(options.checkpoint_dir,
                       BeginCheckpoint(options.checkpoint_dir, start + stopped_done), program,
                       start + stopped_done);
      result.checkpoint_step = start + stopped_done;
    } catch (const std::exception& e) {
      world.Abort(e.what());
      for (auto& t : threads) t.join();
      if (all_ranks_here) AbandonCheckpoints(options.checkpoint_dir, start + 1, start + steps);
      throw RunError(e.what());
    }
  }
  result.stopped = stopped;
  for (auto& t : threads) t.join();
  if (co.failed && all_ranks_here && !options.checkpoint_dir.empty()) {
    AbandonCheckpoints(options.checkpoint_dir, start + 1, start + steps);
  }
  if (co.failed) {
    std::string first = FirstError(co);
    // FirstError numbers slots; name world ranks instead.
    for (int r = 0; r < local; ++r) {
      const std::string slot = "rank " + std::to_string(r) + ": ";
      if (first.rfind(slot, 0) == 0) {
        first = "rank " + std::to_string(local_ranks[r]) + ": " + first.substr(slot.size());
        break;
      }
    }
    throw RunError(first);
  }
  if (!co.replica_error.empty()) throw RunError(co.replica_error);
  result.params = std::move(co.params);
  return result;
}

}  // namespace paraplan::exec
