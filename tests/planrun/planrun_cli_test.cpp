// planrun as a user runs it: a program file written from tiny_program.h, run through the real
// binary; exit status, messages, JSON-lines metrics and --resume.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/data/token_data.h"
#include "runtime/exec/tiny_program.h"
#include "runtime/format/program_model.h"

namespace fs = std::filesystem;
using paraplan::exec::testing::TinyOptions;
using paraplan::exec::testing::TinyProgram;

namespace {

std::string Dir() {
  static const std::string kDir = [] {
    auto d = fs::temp_directory_path() / ("paraplan_planrun_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return kDir;
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
  const std::string cmd =
      (variables.empty() ? "" : "env " + variables + " ") + PARAPLAN_PLANRUN + " " + args;
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
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
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

// A program the structural decoder accepts but whose ranks would not meet: rank 1 plays a copy of
// the role without the data-parallel collectives (the gradient all-reduce, the loss average), so
// rank 0 would wait in the first of them until --timeout. planrun runs the whole-world verifier
// on load and refuses the program before any rank starts.
TEST_CASE(
    "a program whose collectives do not match is refused on load with the verifier's message") {
  const std::string good = WriteProgram("unmatched_base", {2, 0, 4, 2});
  std::ifstream in(good, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  namespace mem = paraplan::prog::mem;
  mem::Program p = mem::DecodeProgram(bytes.data(), bytes.size(), "tiny");
  REQUIRE(p.roles.size() == 1);
  mem::Role damaged = p.roles[0];
  damaged.name = "stage0_alone";
  size_t dropped = 0;
  for (mem::Body& body : damaged.bodies)
    dropped += std::erase_if(
        body.ops, [](const mem::Op& op) { return op.kind == paraplan::prog::OpKind::AllReduce; });
  REQUIRE(dropped == 2);
  p.roles.push_back(std::move(damaged));
  p.ranks[1].role = 1;
  const std::vector<uint8_t> out = mem::EncodeProgram(p);
  const std::string path = Dir() + "/unmatched.pplan";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  // The structural decoder alone accepts the file.
  CHECK_NOTHROW(mem::DecodeProgram(out.data(), out.size(), "unmatched"));

  // A timeout well under ctest's: should the check ever be lost, the run fails instead of hanging.
  const auto r = Planrun(path + " --timeout 60");
  CHECK(r.status == 1);
  CHECK(r.out.find("planrun: error: program `" + path + "` fails whole-world verification: ") !=
        std::string::npos);
  CHECK(r.out.find("all_reduce") != std::string::npos);
  CHECK(r.out.find("no rank was started") != std::string::npos);
  // Nothing ran: no banner (printed once the ranks are placed), no step.
  CHECK(r.out.find("planrun: plan `") == std::string::npos);
  CHECK(r.out.find("tokens/s") == std::string::npos);
  // The good program still runs.
  CHECK(Planrun(good + " --steps 1").status == 0);
}

// train.microbatches is read by the verifier only (it sizes a counter per microbatch and chunk);
// a damaged value is refused by the structural checks before that, not met with exit 70 or the
// memory of the whole machine.
TEST_CASE("a program with a damaged microbatch count is refused on load, exit 1") {
  const std::string good = WriteProgram("microbatches_base", {2, 0, 4, 2});
  std::ifstream in(good, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  namespace mem = paraplan::prog::mem;
  mem::Program p = mem::DecodeProgram(bytes.data(), bytes.size(), "tiny");
  p.train.microbatches = int64_t{1} << 40;
  const std::vector<uint8_t> out = mem::EncodeProgram(p);
  const std::string path = Dir() + "/microbatches.pplan";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  const auto r = Planrun(path);
  CHECK(r.status == 1);
  CHECK(r.out.find("stage0: the schedule holds 5 ops, fewer than the microbatches · chunks = "
                   "1099511627776 · 1 forwards of a step") != std::string::npos);
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
  // The resumed run keeps the lines of steps 0-2 and adds 3-5: one line per step.
  CHECK(Lines(Read(metrics)) == 6);
  CHECK(Read(metrics).find("\"step\": 5") != std::string::npos);
  CHECK(Read(metrics).find("\"step\": 0") != std::string::npos);
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
  CHECK(r.out.find("the host backend runs every rank of the program as a thread of one process") !=
        std::string::npos);
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
  CHECK(r.out.find("is damaged: step 99999999999999999999 is not a valid value") !=
        std::string::npos);
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

TEST_CASE(
    "a run never destroys another program's checkpoints, the program, the data or old metrics") {
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
    // Said when it happens, not only after the run.
    CHECK(r.out.find("the run goes on without metrics") < r.out.find("planrun: data"));
  }
}

namespace {

// planrun started in the background (its own process, so that it can be signalled).
struct Background {
  pid_t pid = -1;
  std::string log;
};

Background Start(const std::string& args, const std::string& name) {
  Background b;
  b.log = Dir() + "/" + name + ".log";
  const std::string cmd =
      std::string("exec ") + PARAPLAN_PLANRUN + " " + args + " > " + b.log + " 2>&1";
  b.pid = fork();
  REQUIRE(b.pid >= 0);
  if (b.pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return b;
}

int Wait(const Background& b) {
  int status = 0;
  REQUIRE(waitpid(b.pid, &status, 0) == b.pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Waits (at most 60 s) until `path` holds at least `lines` lines.
bool WaitForLines(const std::string& path, int lines) {
  for (int i = 0; i < 600; ++i) {
    if (Lines(Read(path)) >= lines) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

bool HasTemporaryDirectories(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(".step-", 0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE(
    "SIGTERM, SIGINT and SIGHUP mid-run: the step finishes, a checkpoint is written, resume "
    "continues") {
  const std::string prog = WriteProgram("long", {2, 1, 4, 1000000});
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const std::string name = "sig" + std::to_string(sig);
    const std::string ckpt = Dir() + "/" + name + "_ckpt", metrics = Dir() + "/" + name + ".jsonl";
    auto run = Start(
        prog + " --checkpoint-dir " + ckpt + " --checkpoint-every 1000000 --metrics " + metrics,
        name);
    REQUIRE(WaitForLines(metrics, 3));
    kill(run.pid, sig);
    const int status = Wait(run);
    const std::string out = Read(run.log);
    CHECK_MESSAGE(status == 128 + sig, out);
    CHECK(out.find("finishing the current step") != std::string::npos);
    CHECK(out.find("stopped by SIG") != std::string::npos);
    CHECK(out.find("resume with: planrun") != std::string::npos);
    // The checkpoint holds exactly the steps the metrics file reports.
    const int done = Lines(Read(metrics));
    char step_dir[32];
    std::snprintf(step_dir, sizeof step_dir, "/step-%06d", done);
    CHECK_MESSAGE(fs::exists(ckpt + step_dir + "/manifest.json"), out);
    CHECK_FALSE(HasTemporaryDirectories(ckpt));
    auto r = Planrun(prog + " --resume " + ckpt + " --steps 2 --metrics " + metrics);
    CHECK_MESSAGE(r.status == 0, r.out);
    CHECK(r.out.find("from step " + std::to_string(done)) != std::string::npos);
    CHECK(Lines(Read(metrics)) == done + 2);
    CHECK(Read(metrics).find("\"step\": " + std::to_string(done + 1) + ",") != std::string::npos);
  }
}

TEST_CASE(
    "a second signal mid-checkpoint stops at once and leaves every committed checkpoint whole") {
  const std::string prog = WriteProgram("twice", {2, 1, 4, 1000000});
  for (int trial = 0; trial < 4; ++trial) {
    const std::string name = "twice" + std::to_string(trial);
    const std::string ckpt = Dir() + "/" + name + "_ckpt", metrics = Dir() + "/" + name + ".jsonl";
    // A checkpoint every step: the signals land while shards are being written.
    auto run = Start(
        prog + " --checkpoint-dir " + ckpt + " --checkpoint-every 1 --metrics " + metrics, name);
    REQUIRE(WaitForLines(metrics, 2 + trial));
    kill(run.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::microseconds(200 * trial));
    kill(run.pid, SIGTERM);
    CHECK(Wait(run) == 128 + SIGTERM);
    // Whatever was committed resumes; the interrupted write's temporary directory is removed.
    auto r = Planrun(prog + " --resume " + ckpt + " --checkpoint-dir " + ckpt + " --steps 1");
    CHECK_MESSAGE(r.status == 0, r.out);
    CHECK_FALSE(HasTemporaryDirectories(ckpt));
  }
}

TEST_CASE("a second run on a checkpoint directory in use is refused with the holder named") {
  const std::string prog = WriteProgram("holder", {2, 1, 4, 1000000});
  const std::string ckpt = Dir() + "/held_ckpt", metrics = Dir() + "/held.jsonl";
  auto run =
      Start(prog + " --checkpoint-dir " + ckpt + " --checkpoint-every 1000000 --metrics " + metrics,
            "held");
  REQUIRE(WaitForLines(metrics, 1));
  auto r = Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt + " --overwrite-checkpoints");
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.out.find("is in use by another run (pid " + std::to_string(run.pid) +
                           " on host") != std::string::npos,
                r.out);
  kill(run.pid, SIGTERM);
  CHECK(Wait(run) == 128 + SIGTERM);
  // A fresh run there is refused until told to resume or overwrite.
  r = Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("--overwrite-checkpoints") != std::string::npos);
  r = Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt + " --overwrite-checkpoints");
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK(fs::exists(ckpt + "/step-000001/manifest.json"));
}

TEST_CASE("FIFOs and devices are refused as program, data, metrics and checkpoint files") {
  const std::string prog = WriteProgram("special", {1, 0, 4, 2});
  const std::string fifo = Dir() + "/fifo";
  fs::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  auto r = Planrun(fifo);
  CHECK(r.status == 1);
  CHECK(r.out.find("it is a FIFO") != std::string::npos);
  fs::remove(Dir() + "/fifo.u16");
  REQUIRE(mkfifo((Dir() + "/fifo.u16").c_str(), 0600) == 0);
  r = Planrun(prog + " --data " + Dir() + "/fifo.u16");
  CHECK(r.status == 1);
  CHECK(r.out.find("it is a FIFO") != std::string::npos);
  fs::remove(Dir() + "/zero.u16");
  fs::create_symlink("/dev/zero", Dir() + "/zero.u16");
  r = Planrun(prog + " --data " + Dir() + "/zero.u16");
  CHECK(r.status == 1);
  CHECK(r.out.find("a character device") != std::string::npos);
  r = Planrun(prog + " --metrics " + fifo);
  CHECK(r.status == 1);
  CHECK(r.out.find("it is a FIFO") != std::string::npos);
  // A shard replaced by a FIFO, a manifest by /dev/zero.
  const std::string ckpt = Dir() + "/special_ckpt";
  REQUIRE(Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt).status == 0);
  fs::remove(ckpt + "/step-000001/rank-00000.bin");
  REQUIRE(mkfifo((ckpt + "/step-000001/rank-00000.bin").c_str(), 0600) == 0);
  r = Planrun(prog + " --resume " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("it is a FIFO") != std::string::npos);
  fs::remove(ckpt + "/step-000001/manifest.json");
  fs::create_symlink("/dev/zero", ckpt + "/step-000001/manifest.json");
  r = Planrun(prog + " --resume " +
              ckpt);  // a step directory without a regular manifest is not one
  CHECK(r.status == 1);
  CHECK(r.out.find("holds no `manifest.json`") != std::string::npos);
  r = Planrun(prog + " --resume " + ckpt + "/step-000001");
  CHECK(r.status == 1);
  CHECK(r.out.find("a character device") != std::string::npos);
}

TEST_CASE("--metrics never names a data file behind a prefix or a file of a checkpoint") {
  const std::string prog = WriteProgram("metrics_guard", {1, 0, 4, 6});
  // A Megatron dataset named by its prefix: its .bin and .idx are data files too.
  const std::string prefix = Dir() + "/mg";
  std::vector<std::vector<int32_t>> sequences(8, std::vector<int32_t>(40));
  for (size_t s = 0; s < sequences.size(); ++s)
    for (size_t i = 0; i < sequences[s].size(); ++i)
      sequences[s][i] = static_cast<int32_t>((s + i) % 13);
  paraplan::data::WriteIndexedDataset(prefix, sequences, true);
  const std::string bin = Read(prefix + ".bin");
  for (const std::string& data : {prefix, prefix + ".idx"}) {
    auto r = Planrun(prog + " --steps 2 --data " + data + " --metrics " + prefix + ".bin");
    CHECK(r.status == 2);
    CHECK(r.out.find("is the data file") != std::string::npos);
    CHECK(Read(prefix + ".bin") == bin);
  }
  REQUIRE(Planrun(prog + " --steps 1 --data " + prefix).status == 0);
  // Inside a checkpoint (the one resumed, or the directory written): refused, nothing written.
  const std::string ckpt = Dir() + "/metrics_guard_ckpt";
  REQUIRE(Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt).status == 0);
  const std::string manifest = ckpt + "/step-000001/manifest.json", text = Read(manifest);
  auto r = Planrun(prog + " --steps 1 --resume " + ckpt + " --metrics " + manifest);
  CHECK(r.status == 2);
  CHECK(r.out.find("lies in the checkpoints of --resume") != std::string::npos);
  r = Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt + " --overwrite-checkpoints " +
              "--metrics " + ckpt + "/.lock");
  CHECK(r.status == 2);
  CHECK(r.out.find("lies in the checkpoints of the checkpoint directory") != std::string::npos);
  CHECK(Read(manifest) == text);
  // Beside the step directories is fine.
  r = Planrun(prog + " --steps 1 --resume " + ckpt + " --metrics " + ckpt + "/metrics.jsonl");
  CHECK(r.status == 0);
  CHECK(Lines(Read(ckpt + "/metrics.jsonl")) == 1);
}

TEST_CASE("a step directory without a manifest is neither replaced nor skipped silently") {
  const std::string prog = WriteProgram("foreign_step", {1, 0, 4, 6});
  const std::string ckpt = Dir() + "/foreign_ckpt";
  fs::create_directories(ckpt + "/step-000001");
  std::ofstream(ckpt + "/step-000001/important.dat") << "keep me";
  auto r = Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("named like a checkpoint but without a `manifest.json`") != std::string::npos);
  CHECK(Read(ckpt + "/step-000001/important.dat") == "keep me");
  // --overwrite-checkpoints removes it, as it removes checkpoints the run would replace.
  r = Planrun(prog + " --steps 1 --checkpoint-dir " + ckpt + " --overwrite-checkpoints");
  CHECK(r.status == 0);
  CHECK(fs::exists(ckpt + "/step-000001/manifest.json"));
  // The newest step without a manifest: resume says so instead of resuming from the one before.
  REQUIRE(Planrun(prog + " --steps 1 --resume " + ckpt + " --checkpoint-dir " + ckpt).status == 0);
  fs::remove(ckpt + "/step-000002/manifest.json");
  r = Planrun(prog + " --steps 1 --resume " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("is named like the newest checkpoint") != std::string::npos);
  CHECK(r.out.find("step-000001") != std::string::npos);
  // A manifest naming step 0 is refused (the shards would never be read).
  fs::remove_all(ckpt + "/step-000002");
  const std::string manifest = ckpt + "/step-000001/manifest.json";
  std::string text = Read(manifest);
  text.replace(text.find("\"step\": 1"), 9, "\"step\": 0");
  std::ofstream(manifest) << text;
  r = Planrun(prog + " --steps 1 --resume " + ckpt);
  CHECK(r.status == 1);
  CHECK(r.out.find("names step 0, but a checkpoint is written after at least one step") !=
        std::string::npos);
}

TEST_CASE("a run whose loss is not finite stops with exit 1 and keeps no checkpoint of it") {
  TinyOptions o{1, 0, 4, 6};
  o.lr = 1e30;  // the first update sends the weights to 1e30; the next logits overflow
  const std::string prog = WriteProgram("diverged", o);
  const std::string ckpt = Dir() + "/diverged_ckpt", metrics = Dir() + "/diverged.jsonl";
  auto r = Planrun(prog + " --steps 6 --checkpoint-dir " + ckpt + " --checkpoint-every 1 " +
                   "--metrics " + metrics);
  CHECK(r.status == 1);
  CHECK(r.out.find("diverged on rank 0") != std::string::npos);
  CHECK(r.out.find("Lower train.lr (1e+30)") != std::string::npos);
  // The diverged step's line is written (it shows what happened); no checkpoint after it.
  const std::string m = Read(metrics);
  CHECK(m.find("\"loss\": null") != std::string::npos);
  int64_t diverged = -1;
  for (int64_t s = 0; s < 6; ++s) {
    if (r.out.find("step " + std::to_string(s) + " diverged") != std::string::npos) diverged = s;
  }
  REQUIRE(diverged >= 0);
  const std::string next = std::to_string(diverged + 1);
  CHECK(!fs::exists(ckpt + "/step-" + std::string(6 - next.size(), '0') + next));
}

TEST_CASE("launcher flags out of range and token ids beyond int32 are named as given") {
  const std::string prog = WriteProgram("launch_flags", {1, 0, 4, 6});
  auto r = Planrun(prog + " --local-world-size 0");
  CHECK(r.status == 2);
  CHECK(r.out.find("the local world size 0 (`--local-world-size`) must be at least 1") !=
        std::string::npos);
  r = Planrun(prog + " --steps +3");
  CHECK(r.status == 2);
  r = Planrun(prog + " --steps ' 3'");
  CHECK(r.status == 2);
  const std::string data = Dir() + "/big_ids.u32";
  {
    std::ofstream out(data, std::ios::binary);
    for (int i = 0; i < 400; ++i) {
      const uint32_t t = i == 17 ? 4294967295u : static_cast<uint32_t>(i % 13);
      out.write(reinterpret_cast<const char*>(&t), 4);
    }
  }
  r = Planrun(prog + " --steps 1 --data " + data);
  CHECK(r.status == 1);
  CHECK(r.out.find("token 4294967295 at position 17") != std::string::npos);
}
