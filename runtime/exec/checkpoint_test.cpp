// Checkpoint files on disk: rewriting a step replaces it whole, failed attempts are cleaned up.
#include "runtime/exec/checkpoint.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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
