#include "runtime/exec/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace paraplan::exec {
namespace {

namespace fs = std::filesystem;
constexpr char kShardMagic[8] = {'P', 'P', 'C', 'K', 'P', 'T', '0', '1'};

std::string StepName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string ShardName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t Fnv(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

void FsyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open `" + path + "` to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError("cannot sync `" + path + "`: " + std::strerror(errno));
}

void WriteFileSynced(const std::string& path, const std::string& bytes) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw CheckpointError("cannot write `" + path + "`");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw CheckpointError("writing `" + path + "` failed (disk full?)");
  }
  FsyncPath(path, false);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read `" + path + "`");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

std::string Field(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\"\\s*:\\s*(\"([^\"]*)\"|(-?[0-9]+))");
  if (!std::regex_search(json, m, re)) return "";
  return m[2].matched ? m[2].str() : m[3].str();
}

}  // namespace

std::string BeginCheckpoint(const std::string& dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError("cannot create checkpoint directory `" + dir + "`: " + ec.message());
  const std::string tmp = (fs::path(dir) / ("." + StepName(step) + ".tmp")).string();
  fs::create_directories(tmp, ec);
  if (ec) throw CheckpointError("cannot create `" + tmp + "`: " + ec.message());
  return tmp;
}

void WriteRankShard(const std::string& tmp_dir, const ProgramImage& program, int rank, int64_t step,
                    const std::vector<StateTensor>& state, Backend& backend) {
  std::string bytes(kShardMagic, 8);
  Put<uint64_t>(bytes, program.fingerprint);
  Put<int64_t>(bytes, rank);
  Put<int64_t>(bytes, step);
  Put<uint64_t>(bytes, state.size());
  for (const auto& t : state) {
    Put<uint32_t>(bytes, static_cast<uint32_t>(t.name.size()));
    bytes += t.name;
    Put<int64_t>(bytes, t.elements);
    const size_t at = bytes.size();
    bytes.resize(at + static_cast<size_t>(t.elements) * 4);
    backend.CopyToHost(bytes.data() + at, t.data, t.elements * 4);
  }
  Put<uint64_t>(bytes, Fnv(bytes));
  WriteFileSynced((fs::path(tmp_dir) / ShardName(rank)).string(), bytes);
}

void CommitCheckpoint(const std::string& dir, const std::string& tmp_dir, const ProgramImage& program,
                      int64_t step) {
  std::ostringstream m;
  m << "{\"version\": 1, \"plan\": \"" << JsonEscape(program.plan_name) << "\", \"fingerprint\": \""
    << Hex(program.fingerprint) << "\", \"step\": " << step << ", \"world_size\": " << program.world_size
    << ", \"shards\": [";
  for (int r = 0; r < program.world_size; ++r) m << (r ? ", " : "") << "\"" << ShardName(r) << "\"";
  m << "]}\n";
  WriteFileSynced((fs::path(tmp_dir) / "manifest.json").string(), m.str());
  FsyncPath(tmp_dir, true);
  const std::string final_dir = (fs::path(dir) / StepName(step)).string();
  std::error_code ec;
  // An older checkpoint of the same step moves aside until the new one is in place, so that a
  // failure in between leaves one of them whole.
  const std::string old_dir = (fs::path(dir) / ("." + StepName(step) + ".old")).string();
  fs::remove_all(old_dir, ec);
  const bool had_old = fs::exists(final_dir, ec);
  if (had_old) {
    fs::rename(final_dir, old_dir, ec);
    if (ec) throw CheckpointError("cannot move the older `" + final_dir + "` aside: " + ec.message());
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    const std::string why = ec.message();
    if (had_old) fs::rename(old_dir, final_dir, ec);
    throw CheckpointError("cannot move the checkpoint into `" + final_dir + "`: " + why);
  }
  if (had_old) fs::remove_all(old_dir, ec);
  const std::string latest_tmp = (fs::path(dir) / ".latest.tmp").string();
  WriteFileSynced(latest_tmp, StepName(step) + "\n");
  fs::rename(latest_tmp, fs::path(dir) / "latest", ec);
  if (ec) throw CheckpointError("cannot update `" + dir + "/latest`: " + ec.message());
  FsyncPath(dir, true);
}

namespace {

// Finds and parses the manifest of the checkpoint in `dir` (DIR/latest, or `dir` itself when it
// holds a manifest), without comparing it with a program.
CheckpointManifest LocateManifest(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw CheckpointError("`" + dir + "` is a file, not a checkpoint directory");
  }
  if (!fs::is_directory(dir, ec)) throw CheckpointError("checkpoint directory `" + dir + "` does not exist");
  std::string step_dir = dir;
  if (!fs::exists(fs::path(dir) / "manifest.json", ec)) {
    const auto latest = fs::path(dir) / "latest";
    if (!fs::exists(latest, ec)) {
      throw CheckpointError("`" + dir + "` holds no checkpoint (neither `latest` nor `manifest.json`)");
    }
    std::string name = ReadAll(latest.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos) throw CheckpointError("`" + latest.string() + "` is malformed");
    step_dir = (fs::path(dir) / name).string();
  }
  const std::string text = ReadAll((fs::path(step_dir) / "manifest.json").string());
  CheckpointManifest man;
  man.directory = step_dir;
  man.plan = Field(text, "plan");
  const std::string fp = Field(text, "fingerprint"), step = Field(text, "step"), world = Field(text, "world_size");
  if (fp.empty() || step.empty() || world.empty() || Field(text, "version") != "1") {
    throw CheckpointError("the manifest of `" + step_dir + "` is malformed or of an unknown version");
  }
  char* end = nullptr;
  errno = 0;
  man.fingerprint = std::strtoull(fp.c_str(), &end, 16);
  const bool fp_ok = errno == 0 && *end == '\0' && fp.size() <= 16;
  errno = 0;
  man.step = std::strtoll(step.c_str(), &end, 10);
  const bool step_ok = errno == 0 && *end == '\0';
  errno = 0;
  const long long world_value = std::strtoll(world.c_str(), &end, 10);
  const bool world_ok = errno == 0 && *end == '\0' && world_value > 0 && world_value <= INT32_MAX;
  if (!fp_ok || !step_ok || !world_ok) {
    throw CheckpointError("the manifest of `" + step_dir + "` is damaged: " +
                          (!fp_ok ? "fingerprint `" + fp + "`" : !step_ok ? "step " + step : "world_size " + world) +
                          " is not a valid value");
  }
  man.world_size = static_cast<int32_t>(world_value);
  if (man.step < 0) throw CheckpointError("the manifest of `" + step_dir + "` names step " + step);
  return man;
}

}  // namespace

CheckpointManifest FindCheckpoint(const std::string& dir, const ProgramImage& program) {
  CheckpointManifest man = LocateManifest(dir);
  if (man.fingerprint != program.fingerprint || man.world_size != program.world_size) {
    throw CheckpointError("checkpoint `" + man.directory + "` was written by plan `" + man.plan + "` (" +
                          std::to_string(man.world_size) + " ranks, fingerprint " + Hex(man.fingerprint) +
                          "), but this program is plan `" + program.plan_name + "` (" +
                          std::to_string(program.world_size) + " ranks, fingerprint " + Hex(program.fingerprint) +
                          "); a checkpoint resumes only the plan and layout that wrote it");
  }
  return man;
}

void CheckCheckpointDirectory(const std::string& dir, const ProgramImage& program) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw CheckpointError("--checkpoint-dir `" + dir + "` is a file, not a directory");
  }
  if (!fs::exists(dir, ec)) return;
  CheckpointManifest man;
  try {
    man = LocateManifest(dir);
  } catch (const CheckpointError&) {
    return;  // no readable checkpoint to protect
  }
  if (man.fingerprint != program.fingerprint || man.world_size != program.world_size) {
    throw CheckpointError("--checkpoint-dir `" + dir + "` holds checkpoint `" + man.directory + "` of plan `" +
                          man.plan + "` (" + std::to_string(man.world_size) + " ranks, fingerprint " +
                          Hex(man.fingerprint) + "), another program than this one (fingerprint " +
                          Hex(program.fingerprint) + "); this run would replace it: choose another directory");
  }
}

void AbandonCheckpoints(const std::string& dir, int64_t first_step, int64_t last_step) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    long long step = -1;
    char tail[8] = {};
    if (std::sscanf(name.c_str(), ".step-%lld%7s", &step, tail) == 2 && std::string(tail) == ".tmp" &&
        step >= first_step && step <= last_step && name == "." + StepName(step) + ".tmp") {
      doomed.push_back(it->path());
    }
  }
  for (const fs::path& p : doomed) fs::remove_all(p, ec);
}

void ReadRankShard(const CheckpointManifest& manifest, const ProgramImage& program, int rank,
                   const std::vector<StateTensor>& state, Backend& backend) {
  const std::string path = (fs::path(manifest.directory) / ShardName(rank)).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError("checkpoint shard `" + path + "` is missing");
  const std::string bytes = ReadAll(path);
  auto bad = [&](const std::string& what) { return CheckpointError("checkpoint shard `" + path + "`: " + what); };
  if (bytes.size() < 8 + 32 + 8 || std::memcmp(bytes.data(), kShardMagic, 8) != 0) throw bad("not a paraplan shard");
  uint64_t sum;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  if (sum != Fnv(bytes.substr(0, bytes.size() - 8))) throw bad("checksum mismatch (the file is damaged)");
  size_t pos = 8;
  auto get = [&](auto& v) {
    if (pos + sizeof v > bytes.size() - 8) throw bad("truncated");
    std::memcpy(&v, bytes.data() + pos, sizeof v);
    pos += sizeof v;
  };
  uint64_t fp, count;
  int64_t r, step;
  get(fp);
  get(r);
  get(step);
  get(count);
  if (fp != program.fingerprint || r != rank || step != manifest.step) throw bad("belongs to another plan, rank or step");
  if (count != state.size()) throw bad("holds " + std::to_string(count) + " tensors, the rank has " + std::to_string(state.size()));
  for (const auto& t : state) {
    uint32_t len;
    get(len);
    if (pos + len > bytes.size() - 8) throw bad("truncated");
    const std::string name = bytes.substr(pos, len);
    pos += len;
    int64_t elements;
    get(elements);
    if (name != t.name || elements != t.elements) {
      throw bad("tensor `" + name + "` (" + std::to_string(elements) + " elements) where `" + t.name + "` (" +
                std::to_string(t.elements) + ") was expected");
    }
    if (pos + static_cast<size_t>(elements) * 4 > bytes.size() - 8) throw bad("truncated");
    backend.CopyToDevice(t.data, bytes.data() + pos, elements * 4);
    pos += static_cast<size_t>(elements) * 4;
  }
}

}  // namespace paraplan::exec
