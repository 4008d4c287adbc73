#include "runtime/launch/environment.h"

#include <doctest/doctest.h>

namespace paraplan::launch {
namespace {

Expected<LaunchEnvironment> Read(std::map<std::string, std::string> vars,
                                 const LaunchOverrides& overrides = {}) {
  return ReadLaunchEnvironment(MapEnvironment(std::move(vars)), overrides);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("no launcher means one process") {
  auto env = Read({});
  REQUIRE(env.ok());
  CHECK(env->launcher == Launcher::kNone);
  CHECK(env->rank == 0);
  CHECK(env->world_size == 1);
  CHECK(env->local_rank == 0);
  CHECK(env->local_world_size == 1);
  CHECK(env->master_addr.empty());
}

TEST_CASE("torchrun variables") {
  auto env = Read({{"RANK", "5"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"GROUP_RANK", "1"},
                   {"MASTER_ADDR", "node7"},
                   {"MASTER_PORT", "29400"}});
  REQUIRE(env.ok());
  CHECK(env->launcher == Launcher::kTorchrun);
  CHECK(env->rank == 5);
  CHECK(env->world_size == 8);
  CHECK(env->local_rank == 1);
  CHECK(env->local_world_size == 4);
  CHECK(env->node_rank == 1);
  CHECK(env->nodes == 2);
  CHECK(env->master_addr == "node7");
  CHECK(env->master_port == 29400);
  CHECK(env->rank_source == "RANK");
  CHECK(env->Describe() ==
        "rank 5 of 8 (local 1 of 4, node 1 of 2) from torchrun, rendezvous node7:29400");
}

TEST_CASE("torchrun without local rank assumes one node and says so") {
  auto env = Read({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "localhost"}});
  REQUIRE(env.ok());
  CHECK(env->local_rank == 2);
  CHECK(env->local_world_size == 4);
  CHECK(env->master_port == 29500);  // torchrun's default
  REQUIRE(env->notes.size() == 1);
  CHECK(Contains(env->notes[0], "no local rank"));
}

TEST_CASE("slurm srun step") {
  std::map<std::string, std::string> vars = {{"SLURM_JOB_ID", "123456"},
                                             {"SLURM_STEP_ID", "0"},
                                             {"SLURM_PROCID", "6"},
                                             {"SLURM_NTASKS", "8"},
                                             {"SLURM_STEP_NUM_TASKS", "8"},
                                             {"SLURM_LOCALID", "2"},
                                             {"SLURM_NODEID", "1"},
                                             {"SLURM_STEP_NUM_NODES", "2"},
                                             {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                             {"SLURM_STEP_NODELIST", "gpu[007-008]"}};
  auto env = Read(vars);
  REQUIRE(env.ok());
  CHECK(env->launcher == Launcher::kSlurm);
  CHECK(env->rank == 6);
  CHECK(env->world_size == 8);
  CHECK(env->local_rank == 2);
  CHECK(env->local_world_size == 4);
  CHECK(env->node_rank == 1);
  CHECK(env->nodes == 2);
  CHECK(env->master_addr == "gpu007");
  CHECK(env->master_port == 20000 + 123456 % 20000);

  SUBCASE("MASTER_ADDR and MASTER_PORT win over the node list and the job id") {
    vars["MASTER_ADDR"] = "10.0.0.1";
    vars["MASTER_PORT"] = "6000";
    auto e = Read(vars);
    REQUIRE(e.ok());
    CHECK(e->master_addr == "10.0.0.1");
    CHECK(e->master_port == 6000);
  }
  SUBCASE("uneven tasks per node") {
    vars["SLURM_STEP_TASKS_PER_NODE"] = "4,3";
    vars["SLURM_STEP_NUM_TASKS"] = "7";
    auto e = Read(vars);
    REQUIRE(e.ok());
    CHECK(e->local_world_size == 3);
  }
}

TEST_CASE("a slurm batch script without srun is one process") {
  auto env = Read({{"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}});
  REQUIRE(env.ok());
  CHECK(env->launcher == Launcher::kNone);
  CHECK(env->world_size == 1);
  REQUIRE(env->notes.size() == 1);
  CHECK(Contains(env->notes[0], "not an `srun` step"));
}

TEST_CASE("open mpi variables") {
  auto env = Read({{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"OMPI_COMM_WORLD_NODE_RANK", "1"},
                   {"MASTER_ADDR", "head"}});
  REQUIRE(env.ok());
  CHECK(env->launcher == Launcher::kOpenMpi);
  CHECK(env->rank == 3);
  CHECK(env->world_size == 4);
  CHECK(env->local_rank == 1);
  CHECK(env->local_world_size == 2);
  CHECK(env->node_rank == 1);
  CHECK(env->nodes == 2);
  CHECK(env->master_port == 29500);
}

TEST_CASE("mpich hydra variables") {
  auto env = Read({{"PMI_RANK", "1"},
                   {"PMI_SIZE", "2"},
                   {"MPI_LOCALRANKID", "1"},
                   {"MPI_LOCALNRANKS", "2"},
                   {"MASTER_ADDR", "head"},
                   {"MASTER_PORT", "1234"}});
  REQUIRE(env.ok());
  CHECK(env->launcher == Launcher::kHydra);
  CHECK(env->rank == 1);
  CHECK(env->local_rank == 1);
}

TEST_CASE("precedence: torchrun over slurm over open mpi, with a note") {
  auto env = Read({{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", "1"},
                   {"MASTER_ADDR", "a"},
                   {"SLURM_PROCID", "0"},
                   {"SLURM_STEP_ID", "0"},
                   {"SLURM_NTASKS", "1"},
                   {"OMPI_COMM_WORLD_RANK", "0"},
                   {"OMPI_COMM_WORLD_SIZE", "1"}});
  REQUIRE(env.ok());
  CHECK(env->launcher == Launcher::kTorchrun);
  CHECK(env->rank == 1);
  REQUIRE(env->notes.size() == 1);
  CHECK(Contains(env->notes[0], "slurm"));
  CHECK(Contains(env->notes[0], "open-mpi"));

  auto slurm = Read({{"SLURM_PROCID", "0"},
                     {"SLURM_STEP_ID", "3"},
                     {"SLURM_NTASKS", "1"},
                     {"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "1"}});
  REQUIRE(slurm.ok());
  CHECK(slurm->launcher == Launcher::kSlurm);
}

TEST_CASE("command-line values override the environment field by field") {
  LaunchOverrides o;
  o.rank = 0;
  o.master_port = 4000;
  auto env = Read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}, o);
  REQUIRE(env.ok());
  CHECK(env->rank == 0);
  CHECK(env->rank_source == "--rank");
  CHECK(env->world_size == 2);
  CHECK(env->master_port == 4000);

  LaunchOverrides both;
  both.rank = 1;
  both.world_size = 3;
  both.master_addr = "h";
  auto cli = Read({}, both);
  REQUIRE(cli.ok());
  CHECK(cli->launcher == Launcher::kCommandLine);
  CHECK(cli->world_size == 3);

  LaunchOverrides half;
  half.rank = 1;
  auto bad = Read({}, half);
  REQUIRE_FALSE(bad.ok());
  CHECK(Contains(bad.error(), "`--rank` and `--world-size` must be given together"));
}

TEST_CASE("errors name the variable and the value") {
  auto check_error = [](std::map<std::string, std::string> vars, const std::string& expected) {
    auto env = Read(std::move(vars));
    REQUIRE_FALSE(env.ok());
    INFO(env.error());
    CHECK(Contains(env.error(), expected));
  };
  check_error({{"RANK", "two"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}},
              "`RANK` is `two`, which is not a whole number");
  check_error({{"RANK", "1"}, {"WORLD_SIZE", "4x"}, {"MASTER_ADDR", "a"}},
              "`WORLD_SIZE` is `4x`, which is not a whole number");
  check_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}},
              "`RANK` is -1, but it must be at least 0");
  check_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "`WORLD_SIZE` is 0, but it must be at least 1");
  check_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}},
              "rank 4 (`RANK`) is not below the world size 4 (`WORLD_SIZE`)");
  check_error({{"RANK", "1"}}, "`RANK` is set but `WORLD_SIZE` is not");
  check_error({{"WORLD_SIZE", "2"}}, "`WORLD_SIZE` is set but `RANK` is not");
  check_error(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}},
      "4 processes were launched (torchrun from `WORLD_SIZE`) but `MASTER_ADDR` is not set");
  check_error({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
              "`mpirun -x MASTER_ADDR=");
  check_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}},
              "is not set, so the other ranks cannot find rank 0");
  check_error({{"RANK", "0"}, {"WORLD_SIZE", "3000000000"}},
              "`WORLD_SIZE` is 3000000000, which is too large");
  check_error({{"RANK", "2"}, {"WORLD_SIZE", "4"}}, "is not set, so rank 2 cannot find rank 0");
  check_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}},
              "`MASTER_PORT` is 70000, but it must be between 1 and 65535");
  check_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "http"}},
              "`MASTER_PORT` is `http`, which is not a whole number");
  check_error(
      {{"RANK", "1"},
       {"WORLD_SIZE", "4"},
       {"LOCAL_RANK", "2"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"MASTER_ADDR", "a"}},
      "the local rank 2 (`LOCAL_RANK`) is not below the local world size 2 (`LOCAL_WORLD_SIZE`)");
  check_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}},
              "the local world size 4 (`LOCAL_WORLD_SIZE`) is larger than the world size 2");
  check_error({{"RANK", "99999999999999999999"}, {"WORLD_SIZE", "2"}}, "too large");
  check_error({{"SLURM_PROCID", "0"},
               {"SLURM_STEP_ID", "0"},
               {"SLURM_NTASKS", "2"},
               {"SLURM_STEP_NODELIST", "gpu[01-02"}},
              "unclosed `[`");
  check_error({{"SLURM_PROCID", "0"},
               {"SLURM_STEP_ID", "0"},
               {"SLURM_NTASKS", "2"},
               {"SLURM_STEP_TASKS_PER_NODE", "two"},
               {"MASTER_ADDR", "a"}},
              "is not of the form `2(x3),1`");
}

TEST_CASE("slurm host lists") {
  CHECK(*FirstSlurmHost("gpu[003-010,12],login1") == "gpu003");
  CHECK(*FirstSlurmHost("node1,node2") == "node1");
  CHECK(*FirstSlurmHost("rack[2-3]-n[07,09]") == "rack2-n07");
  CHECK(*FirstSlurmHost("single") == "single");
  CHECK_FALSE(FirstSlurmHost("").ok());
  CHECK_FALSE(FirstSlurmHost("a[x-y]").ok());
  CHECK_FALSE(FirstSlurmHost("a]").ok());
  CHECK(*SlurmTasksOnNode("2(x3),1", 0) == 2);
  CHECK(*SlurmTasksOnNode("2(x3),1", 2) == 2);
  CHECK(*SlurmTasksOnNode("2(x3),1", 3) == 1);
  CHECK_FALSE(SlurmTasksOnNode("2(x3),1", 4).ok());
  CHECK_FALSE(SlurmTasksOnNode("2(3)", 0).ok());
  // A count that is well formed but too large says so, rather than "not of the form".
  auto huge = SlurmTasksOnNode("4(x99999999999999)", 0);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.error().find("which is too large") != std::string::npos);
  CHECK_FALSE(SlurmTasksOnNode("(x2)", 0).ok());
}

TEST_CASE("process ranks against the program's world size") {
  LaunchEnvironment one;
  auto all = AssignProcessRanks(one, 8);
  REQUIRE(all.ok());
  CHECK(all->first_rank == 0);
  CHECK(all->count == 8);

  auto env = Read({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "a"}});
  REQUIRE(env.ok());
  auto mine = AssignProcessRanks(*env, 8);
  REQUIRE(mine.ok());
  CHECK(mine->first_rank == 3);
  CHECK(mine->count == 1);

  auto wrong = AssignProcessRanks(*env, 16);
  REQUIRE_FALSE(wrong.ok());
  CHECK(Contains(wrong.error(),
                 "torchrun launched 8 processes (`WORLD_SIZE` = 8) but the program "
                 "was compiled for 16 ranks"));
  CHECK_FALSE(AssignProcessRanks(one, 0).ok());
}

TEST_CASE("device selection") {
  auto env = Read({{"RANK", "5"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"MASTER_ADDR", "a"}});
  REQUIRE(env.ok());
  CHECK(*SelectDevice(*env, 4) == 1);
  CHECK(*SelectDevice(*env, 8) == 1);
  CHECK(*SelectDevice(*env, 1) == 0);  // the scheduler bound one GPU to this task
  CHECK(*SelectDevice(*env, 4, 3) == 3);
  auto too_few = SelectDevice(*env, 2);
  REQUIRE_FALSE(too_few.ok());
  CHECK(Contains(too_few.error(), "4 processes run on this node but only 2 GPUs are visible"));
  auto none = SelectDevice(*env, 0);
  REQUIRE_FALSE(none.ok());
  CHECK(Contains(none.error(), "no CUDA device is visible"));
  auto forced = SelectDevice(*env, 4, 4);
  REQUIRE_FALSE(forced.ok());
  CHECK(Contains(forced.error(), "`PARAPLAN_DEVICE` is 4, but only devices 0 to 3 are visible"));
}

TEST_CASE("integer parsing") {
  CHECK(*ParseIntVariable("X", " 42 ", 0, 100) == 42);
  CHECK(*ParseIntVariable("X", "+7", 0, 100) == 7);
  CHECK_FALSE(ParseIntVariable("X", "", 0, 100).ok());
  CHECK_FALSE(ParseIntVariable("X", "-", 0, 100).ok());
  CHECK_FALSE(ParseIntVariable("X", "1e3", 0, 10000).ok());
  CHECK(ParseIntVariable("X", "101", 0, 100).error() ==
        "`X` is 101, but it must be between 0 and 100");
}

}  // namespace
}  // namespace paraplan::launch
