// LaunchEnvironment: who this process is in a multi-process job, read from the launcher's
// environment variables (torchrun, Slurm srun, Open MPI mpirun, MPICH/Intel MPI Hydra).
//
// Invariants of a value returned by ReadLaunchEnvironment:
//   0 <= rank < world_size, 0 <= local_rank < local_world_size <= world_size,
//   0 <= node_rank < nodes, and when world_size > 1: master_addr is non-empty and
//   1 <= master_port <= 65535 (the TCP rendezvous of rank 0 listens there).
// Made by ReadLaunchEnvironment (planrun, at start-up); read by the rendezvous, the device
// selection and the NCCL communicator set-up.
//
// Precedence (the first launcher whose rank variable is set wins; see
// docs/running-on-clusters.md):
//   1. explicit command-line values (LaunchOverrides), field by field, over everything;
//   2. torchrun:  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK;
//   3. Slurm srun step: SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS / SLURM_NPROCS),
//      SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST;
//      only inside a job step (SLURM_STEP_ID or SLURM_STEP_NUM_TASKS set): a batch script that
//      runs planrun without srun is one process, not task 0 of the allocation;
//   4. Open MPI:  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK;
//   5. MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS;
//   6. none of them: one process, rank 0 of 1.
// MASTER_ADDR / MASTER_PORT are read for every launcher. Under Slurm they default to the first
// host of the step's node list and to 20000 + SLURM_JOB_ID mod 20000; under MPI they must be
// exported (`mpirun -x MASTER_ADDR=... -x MASTER_PORT=...`) when more than one process runs.
#ifndef PARAPLAN_RUNTIME_LAUNCH_ENVIRONMENT_H_
#define PARAPLAN_RUNTIME_LAUNCH_ENVIRONMENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/launch/expected.h"

namespace paraplan::launch {

enum class Launcher { kNone, kCommandLine, kTorchrun, kSlurm, kOpenMpi, kHydra };

// "torchrun", "slurm", "open-mpi", ...: for messages and metrics.
std::string_view LauncherName(Launcher launcher);

struct LaunchEnvironment {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nodes = 1;
  std::string master_addr;  // empty only when world_size == 1
  int master_port = 0;      // 0 only when world_size == 1
  // Which variable each field came from ("RANK", "SLURM_PROCID", "--rank"), for messages.
  std::string rank_source = "default";
  std::string world_source = "default";
  // Things the user may want to know (variables of another launcher that were ignored, ...).
  std::vector<std::string> notes;

  // One line: "rank 3 of 8 (local 3 of 4, node 0 of 2) from slurm, rendezvous node001:23456".
  std::string Describe() const;
};

// Reads one environment variable; nullopt when unset. Tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnvironment();
EnvLookup MapEnvironment(std::map<std::string, std::string> variables);

// Values given on planrun's command line; each one set overrides the environment.
struct LaunchOverrides {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

Expected<LaunchEnvironment> ReadLaunchEnvironment(const EnvLookup& env,
                                                  const LaunchOverrides& overrides = {});

// How the ranks of a program of `program_world_size` ranks map onto the launched processes:
// either one process runs every rank (as threads: the host backend, or the CUDA local mode),
// or each process runs exactly one rank. Anything else is refused with a message that names
// both numbers and the variables they came from.
struct ProcessRanks {
  int first_rank = 0;
  int count = 1;
};
Expected<ProcessRanks> AssignProcessRanks(const LaunchEnvironment& env, int64_t program_world_size);

// The CUDA device ordinal for this process. `visible_devices` is what cudaGetDeviceCount
// reports (it already honours CUDA_VISIBLE_DEVICES). One visible device means the scheduler
// bound one GPU per task, so the ordinal is 0 whatever the local rank; otherwise the local
// rank, which must then be below the visible count. PARAPLAN_DEVICE (read by the caller and
// passed as `forced`) overrides both.
Expected<int> SelectDevice(const LaunchEnvironment& env, int visible_devices,
                           std::optional<int> forced = std::nullopt);

// Slurm helpers, exposed for tests.
// First host of a compressed Slurm host list: "gpu[003-010,12],login1" -> "gpu003".
Expected<std::string> FirstSlurmHost(std::string_view host_list);
// Tasks on node `node` from "2(x3),1" (node 0..2 run 2 tasks, node 3 runs 1).
Expected<int> SlurmTasksOnNode(std::string_view tasks_per_node, int node);

// Strict decimal parse of a whole string into [min, max]; the message names `what`.
Expected<int> ParseIntVariable(std::string_view what, std::string_view text, int64_t min,
                               int64_t max);

}  // namespace paraplan::launch

#endif  // PARAPLAN_RUNTIME_LAUNCH_ENVIRONMENT_H_
