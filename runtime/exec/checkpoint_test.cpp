// Checkpoint files on disk: rewriting a step replaces it whole, failed attempts are cleaned up.
#include "runtime/exec/checkpoint.h"

#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "runtime/exec/interpreter.h"
#include "runtime/exec/tiny_program.h"

using namespace paraplan::exec;
namespace fs = std::filesystem;

namespace {

std::string TempDir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("paraplan_ckpt_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string TinyData() {
  const std::string path = TempDir("data") + "/tokens.u16";
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 400; ++i) {
    uint16_t t = static_cast<uint16_t>((i * 3) % 13);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  return path;
}

}  // namespace

TEST_CASE("a rewritten step replaces its checkpoint whole; failed attempts are cleaned up") {
  const std::string data = TinyData();
  auto bytes = testing::TinyProgram({1, 0, 4, 6, "tiny", data});
  const ProgramImage prog = DecodeProgramImage(bytes.data(), bytes.size(), "tiny");
  const std::string dir = TempDir("rewrite");
  RunOptions first;
  first.steps = 2;
  first.checkpoint_dir = dir;
  first.checkpoint_every = 1;
  Train(prog, first);
  // Resuming from step 1 in the same directory writes step 2 again: the new one replaces the old
  // (and nothing is left beside it).
  RunOptions again;
  again.steps = 1;
  again.resume_dir = dir + "/step-000001";
  again.checkpoint_dir = dir;
  // Without --overwrite-checkpoints this is refused: step 2 of the earlier run would be mixed in.
  CHECK_THROWS_WITH_AS(Train(prog, again), doctest::Contains("holds checkpoints after step 1"),
                       CheckpointError);
  again.overwrite_checkpoints = true;
  Train(prog, again);
  CHECK(fs::exists(dir + "/step-000002/manifest.json"));
  CHECK_FALSE(fs::exists(dir + "/.step-000002.old"));
  // Temporary directories of failed attempts go; committed checkpoints and other names stay.
  fs::create_directories(dir + "/.step-000003.tmp");
  fs::create_directories(dir + "/.step-000009.tmp");
  fs::create_directories(dir + "/.step-000003.tmpx");
  AbandonCheckpoints(dir, 3, 5);
  CHECK_FALSE(fs::exists(dir + "/.step-000003.tmp"));
  CHECK(fs::exists(dir + "/.step-000009.tmp"));
  CHECK(fs::exists(dir + "/.step-000003.tmpx"));
  CHECK(fs::exists(dir + "/step-000002/manifest.json"));
}

namespace {

ProgramImage TinyImage(const std::string& data, int dp = 1, int64_t steps = 6) {
  auto bytes = testing::TinyProgram({dp, 0, 4, steps, "tiny", data});
  return DecodeProgramImage(bytes.data(), bytes.size(), "tiny");
}

}  // namespace

TEST_CASE("a second run on a locked checkpoint directory is refused with the holder named") {
  const std::string data = TinyData();
  const ProgramImage prog = TinyImage(data);
  const std::string dir = TempDir("locked");
  {
    CheckpointLock held(dir);
    REQUIRE(held.Held());
    // Another lock of the same directory (flock locks are per open file, so this behaves as
    // another process would) and a run writing there are both refused.
    const std::string holder = "pid " + std::to_string(::getpid()) + " on host ";
    CHECK_THROWS_WITH_AS(CheckpointLock{dir}, doctest::Contains(holder.c_str()), CheckpointError);
    RunOptions run;
    run.steps = 1;
    run.checkpoint_dir = dir;
    const std::string refused = "is in use by another run (" + holder;
    CHECK_THROWS_WITH_AS(Train(prog, run), doctest::Contains(refused.c_str()), CheckpointError);
    CHECK_FALSE(fs::exists(dir + "/step-000001"));
  }
  // Released with its holder: now a run may write.
  RunOptions run;
  run.steps = 1;
  run.checkpoint_dir = dir;
  Train(prog, run);
  CHECK(fs::exists(dir + "/step-000001/manifest.json"));
}

TEST_CASE("two runs started at once on one directory: one writes, the other is refused") {
  const std::string data = TinyData();
  const ProgramImage prog = TinyImage(data, 2);
  for (int trial = 0; trial < 5; ++trial) {
    const std::string dir = TempDir("race" + std::to_string(trial));
    std::atomic<int> ok{0}, refused{0};
    std::vector<std::thread> runs;
    for (int k = 0; k < 2; ++k) {
      runs.emplace_back([&] {
        RunOptions run;
        run.steps = 3;
        run.checkpoint_every = 1;
        run.checkpoint_dir = dir;
        try {
          Train(prog, run);
          ++ok;
        } catch (const CheckpointError& e) {
          if (std::string(e.what()).find("in use by another run") != std::string::npos ||
              std::string(e.what()).find("already holds checkpoints") != std::string::npos) {
            ++refused;
          }
        }
      });
    }
    for (auto& t : runs) t.join();
    CHECK(ok.load() >= 1);
    CHECK(ok.load() + refused.load() == 2);
    // What is there resumes: every step directory is one run's, whole.
    RunOptions resume;
    resume.resume_dir = dir;
    resume.steps = 1;
    CHECK_NOTHROW(Train(prog, resume));
  }
}

TEST_CASE(
    "a fresh run into a directory with checkpoints is refused unless it resumes or overwrites") {
  const std::string data = TinyData();
  const ProgramImage prog = TinyImage(data);
  const std::string dir = TempDir("fresh");
  RunOptions first;
  first.steps = 3;
  first.checkpoint_dir = dir;
  Train(prog, first);
  RunOptions fresh;
  fresh.steps = 1;
  fresh.checkpoint_dir = dir;
  CHECK_THROWS_WITH_AS(
      Train(prog, fresh),
      doctest::Contains("already holds checkpoints of this program (the newest is step 3)"),
      CheckpointError);
  CHECK(FindCheckpoint(dir, prog).step == 3);  // nothing moved backwards
  RunOptions resume;
  resume.steps = 1;
  resume.resume_dir = dir;
  resume.checkpoint_dir = dir;
  CHECK(Train(prog, resume).checkpoint_step == 4);
  fresh.overwrite_checkpoints = true;
  CHECK(Train(prog, fresh).checkpoint_step == 1);
  CHECK(FindCheckpoint(dir, prog).step == 1);
  CHECK_FALSE(fs::exists(dir + "/step-000004"));
  // Another program's checkpoint is protected the same way.
  const ProgramImage wide = TinyImage(data, 2);
  RunOptions other;
  other.steps = 1;
  other.checkpoint_dir = dir;
  CHECK_THROWS_WITH_AS(Train(wide, other), doctest::Contains("another program than this one"),
                       CheckpointError);
  CHECK(FindCheckpoint(dir, prog).step == 1);
}

TEST_CASE("a crash between the step directory and `latest` resumes from the newest complete step") {
  const std::string data = TinyData();
  const ProgramImage prog = TinyImage(data);
  const std::string dir = TempDir("latest");
  RunOptions run;
  run.steps = 2;
  run.checkpoint_every = 1;
  run.checkpoint_dir = dir;
  Train(prog, run);
  // As a crash after the rename of step-000002 and before `latest` leaves it.
  std::ofstream(dir + "/latest") << "step-000001\n";
  CHECK(FindCheckpoint(dir, prog).step == 2);
  // As a crash during the first checkpoint, after its rename: no `latest` at all.
  fs::remove(dir + "/latest");
  CHECK(FindCheckpoint(dir, prog).step == 2);
  // Temporary directories (a crash mid-write) are never taken, and the next run clears them.
  fs::create_directories(dir + "/.step-000003.tmp");
  std::ofstream(dir + "/.step-000003.tmp/manifest.json") << "{}";
  CHECK(FindCheckpoint(dir, prog).step == 2);
  RunOptions resume;
  resume.steps = 1;
  resume.resume_dir = dir;
  resume.checkpoint_dir = dir;
  CHECK(Train(prog, resume).checkpoint_step == 3);
  CHECK(FindCheckpoint(dir, prog).step == 3);
  CHECK_FALSE(fs::exists(dir + "/.step-000003.tmp"));
}

TEST_CASE("the checkpoint fingerprint covers the optimizer and the plan") {
  const std::string data = TinyData();
  const ProgramImage prog = TinyImage(data);
  const std::string dir = TempDir("fingerprint");
  RunOptions run;
  run.steps = 1;
  run.checkpoint_dir = dir;
  Train(prog, run);
  ProgramImage sgd = prog;
  sgd.train.optimizer = "sgd";
  CHECK(sgd.fingerprint == prog.fingerprint);
  CHECK_THROWS_WITH_AS(FindCheckpoint(dir, sgd),
                       doctest::Contains("another optimizer, schedule or plan name"),
                       CheckpointError);
  ProgramImage renamed = prog;
  renamed.plan_name = "other";
  CHECK_THROWS_WITH_AS(FindCheckpoint(dir, renamed),
                       doctest::Contains("resumes only the plan and layout"), CheckpointError);
  CHECK_NOTHROW(FindCheckpoint(dir, prog));
}

TEST_CASE("a checkpoint directory that cannot be written or has no room is refused before step 0") {
  const std::string data = TinyData();
  const ProgramImage prog = TinyImage(data);
  RunOptions run;
  run.steps = 1;
  run.checkpoint_dir = "/dev/null/checkpoints";
  CHECK_THROWS_WITH_AS(Train(prog, run), doctest::Contains("cannot create checkpoint directory"),
                       CheckpointError);
  // A full file system, where this process may mount a small one (root); else the check is
  // exercised by the measured size alone.
  const std::string mnt = TempDir("small_fs");
  CHECK(CheckpointBytes(prog) > 4.0 * 264 * 3);
  if (std::system(("mount -t tmpfs -o size=4k tmpfs " + mnt + " 2>/dev/null").c_str()) == 0) {
    run.checkpoint_dir = mnt + "/ckpt";
    int steps_run = 0;
    run.on_step = [&](const StepMetrics&) { ++steps_run; };
    CHECK_THROWS_WITH_AS(Train(prog, run), doctest::Contains("has no room for a checkpoint"),
                         CheckpointError);
    CHECK(steps_run == 0);
    CHECK(std::system(("umount " + mnt).c_str()) == 0);  // the checks above do not throw
  } else {
    MESSAGE("tmpfs cannot be mounted here: the full-file-system case is not exercised");
  }
}

TEST_CASE("a disk that fills while committing fails the run cleanly; committed steps resume") {
  // A small tmpfs (where this process may mount one) with room for the first checkpoints only.
  const std::string data = TinyData();
  const ProgramImage prog = TinyImage(data, 2);
  const std::string mnt = TempDir("full_fs");
  if (std::system(("mount -t tmpfs -o size=64k tmpfs " + mnt + " 2>/dev/null").c_str()) != 0) {
    MESSAGE("tmpfs cannot be mounted here: the full-disk commit is not exercised");
    return;
  }
  struct Unmount {  // also when a check below throws
    std::string path;
    ~Unmount() { (void)std::system(("umount " + path + " 2>/dev/null").c_str()); }
  } unmount{mnt};
  const std::string dir = mnt + "/ckpt";
  RunOptions run;
  run.steps = 40;
  run.checkpoint_every = 1;
  run.checkpoint_dir = dir;
  CHECK_THROWS_WITH_AS(Train(prog, run), doctest::Contains("disk full"), RunError);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    CHECK_MESSAGE((name == ".lock" || name == "latest" || name.rfind("step-", 0) == 0),
                  name);  // no leftovers
  }
  const CheckpointManifest newest = FindCheckpoint(dir, prog);
  CHECK(newest.step >= 1);
  RunOptions resume;
  resume.steps = 1;
  resume.resume_dir = dir;
  CHECK(Train(prog, resume).steps.size() == 1);
}

TEST_CASE("the manifest is JSON: any plan name round-trips, damage is named field by field") {
  const std::string data = TinyData();
  ProgramImage prog = TinyImage(data);
  prog.plan_name = "llama \"8b\" \\ tp2\n\x01 \xc3\xa9";
  const std::string dir = TempDir("manifest_json");
  RunOptions run;
  run.steps = 1;
  run.checkpoint_dir = dir;
  Train(prog, run);
  const CheckpointManifest man = FindCheckpoint(dir, prog);
  CHECK(man.plan == prog.plan_name);
  CHECK(man.step == 1);
  CHECK(man.world_size == prog.world_size);

  const std::string path = dir + "/step-000001/manifest.json";
  std::string good;
  {
    std::ifstream in(path);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  CHECK(good.rfind("{\"version\": 2, \"plan\": \"llama \\\"8b\\\" \\\\ tp2\\n\\u0001 \xc3\xa9\", ",
                   0) == 0);
  auto refused = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    try {
      FindCheckpoint(dir, prog);
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  CHECK(refused(good.substr(0, good.size() / 2))
            .find("is malformed or of an unknown version "
                  "(not JSON: line 1, column") != std::string::npos);
  CHECK(refused("[1, 2]").find("(not a JSON object)") != std::string::npos);
  CHECK(refused(replaced("\"version\": 2", "\"version\": 3")).find("(version 3)") !=
        std::string::npos);
  CHECK(refused(replaced("\"step\": 1", "\"steps\": 1")).find("(no `step`)") != std::string::npos);
  CHECK(refused(replaced("\"step\": 1", "\"step\": \"1\"")).find("is damaged: step 1 is not") !=
        std::string::npos);
  CHECK(refused(replaced("\"step\": 1", "\"step\": 1.5")).find("step 1.5 is not a valid value") !=
        std::string::npos);
  CHECK(refused(replaced("\"step\": 1", "\"step\": -1")).find("names step -1") !=
        std::string::npos);
  CHECK(refused(replaced("\"world_size\": 1", "\"world_size\": 0"))
            .find("world_size 0 is not a valid value") != std::string::npos);
  const size_t fp = good.find("\"fingerprint\": \"") + 16;
  CHECK(refused(replaced(good.substr(fp, 16), "-1")).find("fingerprint `-1` is not") !=
        std::string::npos);
  CHECK(refused(replaced(good.substr(fp, 16), good.substr(fp, 16) + "0"))
            .find("is not a valid value") != std::string::npos);
  const size_t state = good.find("\"state_fingerprint\": \"") + 22;
  CHECK(refused(replaced(good.substr(state, 16), "0000000000000000"))
            .find("state_fingerprint `0000000000000000` is not a valid value") !=
        std::string::npos);
  // Whitespace and key order are JSON's business, not the reader's.
  CHECK(refused(replaced("{\"version\": 2, ", "{\n  \"version\" :\t2 ,\n  ")) == "accepted");
}
