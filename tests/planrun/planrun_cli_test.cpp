// planrun as a user runs it: a program file written from tiny_program.h, run through the real
// binary; exit status, messages, JSON-lines metrics and --resume.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/exec/tiny_program.h"

namespace fs = std::filesystem;
using paraplan::exec::testing::TinyOptions;
using paraplan::exec::testing::TinyProgram;

namespace {

std::string Dir() {
  static const std::string dir = [] {
    auto d = fs::temp_directory_path() / ("paraplan_planrun_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Result {
  int status;
  std::string out;
};

// Runs `[env VARIABLES] planrun ARGS`.
Result Planrun(const std::string& args, const std::string& variables = "") {
  const std::string log = Dir() + "/out.txt";
  const std::string cmd = (variables.empty() ? "" : "env " + variables + " ") + PARAPLAN_PLANRUN + " " + args;
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, Read(log)};
}

std::string WriteProgram(const std::string& name, TinyOptions o) {
  const std::string data = Dir() + "/tokens.u16";
  if (!fs::exists(data)) {
    std::ofstream out(data, std::ios::binary);
    for (int i = 0; i < 400; ++i) {
      uint16_t t = static_cast<uint16_t>((i * 3) % 13);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  o.data = data;
  const auto bytes = TinyProgram(o);
  const std::string path = Dir() + "/" + name + ".pplan";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return path;
}

int Lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("usage errors exit 2 with a message") {
  auto r = Planrun("");
  CHECK(r.status == 2);
  CHECK(r.out.find("no program given") != std::string::npos);
  const std::string prog = WriteProgram("dp2", {2, 1, 4, 4});
  r = Planrun(prog + " --steps nine");
  CHECK(r.status == 2);
  CHECK(r.out.find("--steps needs a non-negative integer") != std::string::npos);
  r = Planrun(prog + " --frobnicate");
  CHECK(r.status == 2);
  CHECK(r.out.find("unknown option `--frobnicate`") != std::string::npos);
  r = Planrun(prog + " --backend=tpu");
  CHECK(r.status == 2);
  r = Planrun(prog + " --ranks 3");
  CHECK(r.status == 2);
  CHECK(r.out.find("the program is for 2 ranks") != std::string::npos);
}

TEST_CASE("bad files exit 1 with a message") {
  auto r = Planrun(Dir() + "/missing.pplan");
  CHECK(r.status == 1);
  CHECK(r.out.find("does not exist") != std::string::npos);
  std::ofstream(Dir() + "/garbage.pplan") << "this is not a program";
  r = Planrun(Dir() + "/garbage.pplan");
  CHECK(r.status == 1);
  CHECK(r.out.find("not a paraplan program") != std::string::npos);
  const std::string prog = WriteProgram("one", {1, 0, 4, 2});
  r = Planrun(prog + " --data " + Dir() + "/nothing.u16");
  CHECK(r.status == 1);
  CHECK(r.out.find("does not exist") != std::string::npos);
  r = Planrun(prog + " --resume " + Dir() + "/no_checkpoints");
  CHECK(r.status == 1);
  CHECK(r.out.find("does not exist") != std::string::npos);
}

TEST_CASE("a run prints progress and writes one JSON line per step; resume continues") {
  const std::string prog = WriteProgram("train", {2, 1, 4, 6});
  const std::string metrics = Dir() + "/m.jsonl", ckpt = Dir() + "/ckpt";
  auto r = Planrun(prog + " --steps 3 --metrics " + metrics + " --checkpoint-dir " + ckpt);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("step 2") != std::string::npos);
  CHECK(r.out.find("tokens/s") != std::string::npos);
  const std::string m = Read(metrics);
  CHECK(Lines(m) == 3);
  CHECK(m.find("\"loss\": ") != std::string::npos);
  CHECK(m.find("\"peak_bytes\": ") != std::string::npos);
  CHECK(m.find("\"tokens_per_second\": ") != std::string::npos);
  r = Planrun(prog + " --resume " + ckpt + " --metrics " + metrics);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("from step 3") != std::string::npos);
  CHECK(Lines(Read(metrics)) == 3);  // steps 3, 4, 5
  CHECK(Read(metrics).find("\"step\": 5") != std::string::npos);
  // Another plan's checkpoint is refused.
  const std::string other = WriteProgram("other", {1, 0, 4, 6});
  r = Planrun(other + " --resume " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("resumes only the plan and layout that wrote it") != std::string::npos);
}

TEST_CASE("launcher environments: bad values and a host run under a launcher are refused") {
  const std::string prog = WriteProgram("env", {2, 0, 4, 2});
  auto r = Planrun(prog, "RANK=two WORLD_SIZE=2");
  CHECK(r.status == 2);
  CHECK(r.out.find("`RANK` is `two`, which is not a whole number") != std::string::npos);
  r = Planrun(prog, "RANK=0 WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=29500");
  CHECK(r.status == 2);
  CHECK(r.out.find("the host backend runs every rank of the program as a thread of one process") != std::string::npos);
  r = Planrun(prog, "RANK=0 WORLD_SIZE=3 MASTER_ADDR=localhost MASTER_PORT=29500");
  CHECK(r.status == 2);
  CHECK(r.out.find("but the program was compiled for 2 ranks") != std::string::npos);
  r = Planrun(prog + " --rank 5 --world-size 2");
  CHECK(r.status == 2);
}

TEST_CASE("the plan's checkpoint settings apply unless flags override them") {
  TinyOptions o{1, 0, 4, 4};
  o.checkpoint_dir = Dir() + "/plan_ckpt";
  o.checkpoint_every = 2;
  const std::string prog = WriteProgram("ckpt_in_plan", o);
  auto r = Planrun(prog);
  REQUIRE(r.status == 0);
  CHECK(fs::exists(Dir() + "/plan_ckpt/step-000002/manifest.json"));
  CHECK(fs::exists(Dir() + "/plan_ckpt/step-000004/manifest.json"));
  r = Planrun(prog + " --checkpoint-dir " + Dir() + "/flag_ckpt --checkpoint-every 0");
  REQUIRE(r.status == 0);
  CHECK(!fs::exists(Dir() + "/flag_ckpt/step-000002"));
  CHECK(fs::exists(Dir() + "/flag_ckpt/step-000004/manifest.json"));
}

TEST_CASE("damaged manifests and misplaced paths are refused with exit 1, never 70") {
  const std::string prog = WriteProgram("manifest", {2, 1, 4, 6});
  const std::string ckpt = Dir() + "/mckpt";
  REQUIRE(Planrun(prog + " --steps 2 --checkpoint-dir " + ckpt).status == 0);
  const std::string manifest = ckpt + "/step-000002/manifest.json";
  const std::string good = Read(manifest);
  auto damage = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    std::ofstream(manifest) << text;
  };
  damage("\"step\": 2", "\"step\": 99999999999999999999");
  auto r = Planrun(prog + " --resume " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("is damaged: step 99999999999999999999 is not a valid value") != std::string::npos);
  damage("\"world_size\": 2", "\"world_size\": 99999999999");
  r = Planrun(prog + " --resume " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("is damaged") != std::string::npos);
  const size_t fp = good.find("\"fingerprint\": \"") + 16;
  damage(good.substr(fp, 16), "zz");
  r = Planrun(prog + " --resume " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("fingerprint `zz` is not a valid value") != std::string::npos);
  std::ofstream(manifest) << good;
  r = Planrun(prog + " --resume " + prog);
  CHECK(r.status == 1);
  CHECK(r.out.find("is a file, not a checkpoint directory") != std::string::npos);
  r = Planrun(prog + " --checkpoint-dir " + prog);
  CHECK(r.status == 1);
  CHECK(r.out.find("is a file, not a directory") != std::string::npos);
}

TEST_CASE("a run never destroys another program's checkpoints, the program, the data or old metrics") {
  const std::string prog = WriteProgram("keep", {2, 1, 4, 6});
  const std::string ckpt = Dir() + "/keep_ckpt";
  REQUIRE(Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt).status == 0);
  const std::string manifest = Read(ckpt + "/step-000001/manifest.json");
  // Another program writing into that directory would replace step-000001 and `latest`.
  const std::string other = WriteProgram("keep_other", {1, 0, 4, 6});
  auto r = Planrun(other + " --steps 1 --checkpoint-dir " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("holds checkpoint") != std::string::npos);
  CHECK(r.out.find("choose another directory") != std::string::npos);
  CHECK(Read(ckpt + "/step-000001/manifest.json") == manifest);
  // The same program continues into its own directory.
  CHECK(Planrun(prog + " --steps 1 --resume " + ckpt + " --checkpoint-dir " + ckpt).status == 0);
  CHECK(fs::exists(ckpt + "/step-000002/manifest.json"));
  // --metrics naming the program or the data file is refused before anything is written.
  const std::string program_bytes = Read(prog);
  r = Planrun(prog + " --steps 1 --metrics " + prog);
  CHECK(r.status == 2);
  CHECK(r.out.find("is the program file") != std::string::npos);
  CHECK(Read(prog) == program_bytes);
  const std::string data = Dir() + "/tokens.u16", data_bytes = Read(data);
  r = Planrun(prog + " --steps 1 --data " + data + " --metrics " + data);
  CHECK(r.status == 2);
  CHECK(Read(data) == data_bytes);
  // A run refused at start (here: a checkpoint of another plan) leaves earlier metrics alone.
  const std::string metrics = Dir() + "/old.jsonl";
  std::ofstream(metrics) << "{\"step\": 0}\n";
  r = Planrun(other + " --steps 1 --resume " + ckpt + " --metrics " + metrics);
  CHECK(r.status == 1);
  CHECK(Read(metrics) == "{\"step\": 0}\n");
  // A metrics file that cannot be written fails the run instead of losing the numbers silently.
  if (fs::is_character_file("/dev/full")) {
    r = Planrun(prog + " --steps 1 --metrics /dev/full");
    CHECK(r.status == 1);
    CHECK(r.out.find("writing metrics file `/dev/full` failed") != std::string::npos);
  }
}
