#include "runtime/exec/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include "runtime/format/input_file.h"
#include "runtime/json/json.h"

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
  if (fd < 0)
    throw CheckpointError("cannot open `" + path + "` to sync it: " + std::strerror(errno));
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
  std::string bytes, why;  // a FIFO or a device in place of a checkpoint file is refused unread
  if (!ReadRegularFile(path, uint64_t{1} << 40, &bytes, &why))
    throw CheckpointError("cannot read `" + path + "`: " + why);
  return bytes;
}

// The step of a committed step directory name ("step-000010" -> 10), -1 for any other name.
int64_t StepOfName(const std::string& name) {
  long long step = -1;
  int used = 0;
  if (std::sscanf(name.c_str(), "step-%lld%n", &step, &used) != 1 ||
      used != static_cast<int>(name.size()) || step < 0 || name != StepName(step)) {
    return -1;
  }
  return step;
}

// The entries of `dir` named like step directories, by step: those with a regular
// `manifest.json` (the checkpoints) and those without one (a file, or a directory without its
// manifest: never written so by planrun, which renames a step directory into place complete).
struct StepEntries {
  std::vector<std::pair<int64_t, fs::path>> committed, uncommitted;
};

StepEntries ListStepEntries(const std::string& dir) {
  StepEntries out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = StepOfName(it->path().filename().string());
    if (step < 0) continue;
    std::error_code ec2;
    (fs::is_regular_file(it->path() / "manifest.json", ec2) ? out.committed : out.uncommitted)
        .push_back({step, it->path()});
  }
  std::sort(out.committed.begin(), out.committed.end());
  std::sort(out.uncommitted.begin(), out.uncommitted.end());
  return out;
}

// The committed step directories of `dir`, by step.
std::vector<std::pair<int64_t, fs::path>> StepDirectories(const std::string& dir) {
  return ListStepEntries(dir).committed;
}

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The 16-digit lower-case hex the manifest writes, strictly (no sign, no spaces, no 0x).
bool ParseHex64(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 16) return false;
  uint64_t v = 0;
  for (const char c : text) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return false;
    v = v << 4 | static_cast<uint64_t>(digit);
  }
  *out = v;
  return true;
}

// A manifest value as it appears in an error: a number's text, a string's text.
std::string Shown(const json::Value& v) {
  if (v.GetKind() == json::Value::Kind::kNumber) return v.NumberText();
  if (auto s = v.AsString()) return *s;
  return v.GetKind() == json::Value::Kind::kNull ? "null" : "a non-scalar value";
}

// The fields of a manifest (version 1 or 2), read with a JSON reader. Throws CheckpointError
// saying which field is missing or damaged.
CheckpointManifest ParseManifest(const std::string& text, const std::string& step_dir) {
  const std::string where = "the manifest of `" + step_dir + "`";
  std::string error;
  const std::optional<json::Value> doc = json::Parse(text, &error);
  if (!doc || doc->GetKind() != json::Value::Kind::kObject) {
    throw CheckpointError(where + " is malformed or of an unknown version (" +
                          (doc ? std::string("not a JSON object") : "not JSON: " + error) + ")");
  }
  const json::Value* version = doc->Find("version");
  const std::optional<int64_t> version_number = version ? version->AsInt64() : std::nullopt;
  if (version_number != 1 && version_number != 2) {
    throw CheckpointError(where + " is malformed or of an unknown version (version " +
                          (version ? Shown(*version) : std::string("missing")) + ")");
  }
  const json::Value* plan = doc->Find("plan");
  const json::Value* fp = doc->Find("fingerprint");
  const json::Value* step = doc->Find("step");
  const json::Value* world = doc->Find("world_size");
  for (const auto& [value, name] :
       {std::pair{fp, "fingerprint"}, std::pair{step, "step"}, std::pair{world, "world_size"}}) {
    if (!value) {
      throw CheckpointError(where + " is malformed or of an unknown version (no `" + name + "`)");
    }
  }
  CheckpointManifest man;
  man.directory = step_dir;
  man.plan = plan ? plan->AsString().value_or("") : "";
  const std::optional<std::string> fp_text = fp->AsString();
  const bool fp_ok = fp_text && ParseHex64(*fp_text, &man.fingerprint);
  const std::optional<int64_t> step_value = step->AsInt64();
  const std::optional<int64_t> world_value = world->AsInt64();
  const bool world_ok = world_value && *world_value > 0 && *world_value <= INT32_MAX;
  if (!fp_ok || !step_value || !world_ok) {
    throw CheckpointError(where + " is damaged: " +
                          (!fp_ok        ? "fingerprint `" + Shown(*fp) + "`"
                           : !step_value ? "step " + Shown(*step)
                                         : "world_size " + Shown(*world)) +
                          " is not a valid value");
  }
  man.step = *step_value;
  man.world_size = static_cast<int32_t>(*world_value);
  if (*version_number == 2) {
    const json::Value* state = doc->Find("state_fingerprint");
    const std::optional<std::string> state_text = state ? state->AsString() : std::nullopt;
    if (!state_text || !ParseHex64(*state_text, &man.state_fingerprint) ||
        man.state_fingerprint == 0) {
      throw CheckpointError(where + " is damaged: state_fingerprint `" +
                            (state ? Shown(*state) : std::string("missing")) +
                            "` is not a valid value");
    }
  }
  if (man.step < 1) {
    throw CheckpointError(where + " names step " + std::to_string(man.step) +
                          ", but a checkpoint is written after at least one step");
  }
  return man;
}

}  // namespace

std::string BeginCheckpoint(const std::string& dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw CheckpointError("cannot create checkpoint directory `" + dir + "`: " + ec.message());
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

void CommitCheckpoint(const std::string& dir, const std::string& tmp_dir,
                      const ProgramImage& program, int64_t step) {
  json::Writer m;
  m.BeginObject().Key("version").Int(2).Key("plan").String(program.plan_name);
  m.Key("fingerprint").String(Hex(program.fingerprint));
  m.Key("state_fingerprint").String(Hex(StateFingerprint(program)));
  m.Key("step").Int(step).Key("world_size").Int(program.world_size).Key("shards").BeginArray();
  for (int r = 0; r < program.world_size; ++r) m.String(ShardName(r));
  m.EndArray().EndObject();
  WriteFileSynced((fs::path(tmp_dir) / "manifest.json").string(), m.Text() + "\n");
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
    if (ec)
      throw CheckpointError("cannot move the older `" + final_dir + "` aside: " + ec.message());
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    const std::string why = ec.message();
    if (had_old) fs::rename(old_dir, final_dir, ec);
    throw CheckpointError("cannot move the checkpoint into `" + final_dir + "`: " + why);
  }
  FsyncPath(dir, true);  // the step directory is committed before `latest` names it
  if (had_old) fs::remove_all(old_dir, ec);
  const std::string latest_tmp = (fs::path(dir) / ".latest.tmp").string();
  try {
    WriteFileSynced(latest_tmp, StepName(step) + "\n");
  } catch (const CheckpointError&) {
    fs::remove(latest_tmp, ec);  // the step directory is committed; only `latest` lags
    throw;
  }
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
  if (!fs::is_directory(dir, ec))
    throw CheckpointError("checkpoint directory `" + dir + "` does not exist");
  std::string step_dir = dir;
  if (!fs::exists(fs::path(dir) / "manifest.json", ec)) {
    // The newest committed step directory: a step directory exists only complete, while
    // `latest` is renamed after it and may lag behind after a crash.
    const auto [steps, uncommitted] = ListStepEntries(dir);
    if (!uncommitted.empty() && (steps.empty() || uncommitted.back().first > steps.back().first)) {
      throw CheckpointError(
          "`" + uncommitted.back().second.string() + "` is named like the newest checkpoint of `" +
          dir +
          "` but holds no `manifest.json`; planrun moves a checkpoint into place only when it is "
          "complete, so it was damaged or made by hand: move it away to resume from " +
          (steps.empty() ? std::string("nothing (no other checkpoint is there)")
                         : "`" + steps.back().second.string() + "`"));
    }
    if (steps.empty()) {
      throw CheckpointError("`" + dir +
                            "` holds no checkpoint (no step directory with a `manifest.json`)");
    }
    step_dir = steps.back().second.string();
  }
  const std::string text = ReadAll((fs::path(step_dir) / "manifest.json").string());
  return ParseManifest(text, step_dir);
}

}  // namespace

CheckpointManifest FindCheckpoint(const std::string& dir, const ProgramImage& program) {
  CheckpointManifest man = LocateManifest(dir);
  if (man.fingerprint != program.fingerprint || man.world_size != program.world_size ||
      (man.state_fingerprint != 0 && man.state_fingerprint != StateFingerprint(program))) {
    throw CheckpointError(
        "checkpoint `" + man.directory + "` was written by plan `" + man.plan + "` (" +
        std::to_string(man.world_size) + " ranks, fingerprint " + Hex(man.fingerprint) +
        "), but this program is plan `" + program.plan_name + "` (" +
        std::to_string(program.world_size) + " ranks, fingerprint " + Hex(program.fingerprint) +
        ")" +
        (man.fingerprint == program.fingerprint && man.world_size == program.world_size
             ? std::string(", with the same model and layout but another optimizer, schedule or "
                           "plan name")
             : std::string()) +
        "; a checkpoint resumes only the plan and layout that wrote it");
  }
  return man;
}

uint64_t StateFingerprint(const ProgramImage& program) {
  uint64_t h = 1469598103934665603ull;
  auto bytes = [&](const void* p, size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  };
  auto num = [&](int64_t v) { bytes(&v, sizeof v); };
  auto text = [&](const std::string& t) {
    num(static_cast<int64_t>(t.size()));
    bytes(t.data(), t.size());
  };
  num(static_cast<int64_t>(program.fingerprint));
  text(program.plan_name);
  text(program.train.optimizer);
  num(static_cast<int64_t>(program.parallel.schedule));
  text(program.parallel.order);
  num(program.world_size);
  for (const auto& rank : program.ranks) {
    num(rank.role);
    if (rank.role < 0 || rank.role >= static_cast<int32_t>(program.roles.size())) continue;
    const auto& role = program.roles[rank.role];
    auto elements = [&](int32_t buffer) -> int64_t {
      return buffer >= 0 && buffer < static_cast<int32_t>(role.buffers.size())
                 ? role.buffers[buffer].Elements()
                 : -1;
    };
    for (const auto& b : role.buckets) {
      for (int32_t buffer : {b.params, b.master, b.exp_avg, b.exp_avg_sq, b.param_shard})
        num(elements(buffer));
    }
    for (const auto& b : role.buffers) {
      if (b.kind != prog::BufferKind::State) continue;
      text(b.name);
      num(b.Elements());
    }
  }
  return h;
}

double CheckpointBytes(const ProgramImage& program) {
  double total = 4096;  // manifest, `latest`, directory entries
  for (const auto& rank : program.ranks) {
    if (rank.role < 0 || rank.role >= static_cast<int32_t>(program.roles.size())) continue;
    const auto& role = program.roles[rank.role];
    total += 4096;  // shard header, names, checksum
    for (const auto& b : role.buckets) {
      for (int32_t buffer :
           {b.param_shard < 0 ? b.params : -1, b.master, b.exp_avg, b.exp_avg_sq, b.param_shard}) {
        if (buffer >= 0 && buffer < static_cast<int32_t>(role.buffers.size())) {
          total += 4.0 * static_cast<double>(role.buffers[buffer].Elements());
        }
      }
    }
    for (const auto& b : role.buffers)
      if (b.kind == prog::BufferKind::State) total += 4.0 * static_cast<double>(b.Elements());
  }
  return total;
}

CheckpointLock::CheckpointLock(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw CheckpointError("--checkpoint-dir `" + dir + "` is a file, not a directory");
  }
  fs::create_directories(dir, ec);
  if (ec)
    throw CheckpointError("cannot create checkpoint directory `" + dir + "`: " + ec.message());
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0) {
    throw CheckpointError("cannot write in checkpoint directory `" + dir + "` (creating `" + path +
                          "`): " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw CheckpointError("`" + path + "` is not a regular file; remove it");
  }
  if (st.st_nlink > 1) {  // a hard link: writing the holder's line would overwrite another file
    ::close(fd_);
    fd_ = -1;
    throw CheckpointError("`" + path + "` is a hard link to another file (" +
                          std::to_string(st.st_nlink) + " names); remove it");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw CheckpointError(
          "checkpoint directory `" + dir + "` is in use by another run (" +
          (holder.empty() ? std::string("holder unknown") : holder) +
          "); two runs writing one directory would mix their checkpoints: wait for it to end, "
          "or choose another directory");
    }
    throw CheckpointError("cannot lock checkpoint directory `" + dir + "`: " + std::strerror(err));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string line =
      "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()) ||
      ::fsync(fd_) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    throw CheckpointError("cannot write in checkpoint directory `" + dir + "`: " + why);
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

CheckpointLock& CheckpointLock::operator=(CheckpointLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

namespace {

// Room for one more checkpoint (the previous one stays until the new one is committed).
void CheckRoomForCheckpoint(const std::string& dir, const ProgramImage& program) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return;
  const double free_bytes = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  const double need = CheckpointBytes(program);
  if (free_bytes < need) {
    char text[160];
    std::snprintf(text, sizeof text, "%.1f KiB free, one checkpoint takes %.1f KiB",
                  free_bytes / 1024.0, need / 1024.0);
    throw CheckpointError("checkpoint directory `" + dir + "` has no room for a checkpoint (" +
                          text + "); free space or choose another directory");
  }
}

// Removes the leftovers of interrupted writes, putting back a committed step that a rewrite
// moved aside. Nobody else writes here (the caller holds the lock).
void CleanInterruptedWrites(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> tmps;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto ends = [&](const char* tail) {
      const std::string t = tail;
      return name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    if (name.rfind(".step-", 0) == 0 && (ends(".tmp") || ends(".old"))) tmps.push_back(it->path());
    if (name == ".latest.tmp") tmps.push_back(it->path());
  }
  for (const fs::path& p : tmps) {
    const std::string name = p.filename().string();
    std::error_code ec2;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".old") == 0) {
      // A rewrite of a step was cut between moving the old one aside and moving the new one in.
      const fs::path committed = fs::path(dir) / name.substr(1, name.size() - 5);
      if (!fs::exists(committed, ec2)) {
        fs::rename(p, committed, ec2);
        continue;
      }
    }
    fs::remove_all(p, ec2);
  }
}

// The step directories a run would be refused for, and why.
struct ConflictingCheckpoints {
  std::vector<fs::path> doomed;
  std::string why;
};

// The checkpoints in `dir` (its step directories, oldest first) that this run must not mix
// with: another program's, this program's when starting fresh, those after the resumed step.
ConflictingCheckpoints FindConflictingCheckpoints(
    const std::string& dir, const ProgramImage& program, const PrepareOptions& options,
    const std::vector<std::pair<int64_t, fs::path>>& steps) {
  const std::string newest = steps.back().second.string();
  CheckpointManifest man;
  bool ours = false;
  std::string damaged;
  try {
    man = LocateManifest(newest);
    ours = man.fingerprint == program.fingerprint && man.world_size == program.world_size &&
           (man.state_fingerprint == 0 || man.state_fingerprint == StateFingerprint(program));
  } catch (const CheckpointError& e) {
    damaged = e.what();
  }
  ConflictingCheckpoints c;
  if (!damaged.empty()) {
    for (const auto& [step, path] : steps) c.doomed.push_back(path);
    c.why = "--checkpoint-dir `" + dir + "` holds a checkpoint this run cannot read (" + damaged +
            "); this run would replace it: choose another directory, or pass "
            "--overwrite-checkpoints to remove it";
  } else if (!ours) {
    for (const auto& [step, path] : steps) c.doomed.push_back(path);
    c.why = "--checkpoint-dir `" + dir + "` holds checkpoint `" + man.directory + "` of plan `" +
            man.plan + "` (" + std::to_string(man.world_size) + " ranks, fingerprint " +
            Hex(man.fingerprint) + "), another program than this one (fingerprint " +
            Hex(program.fingerprint) +
            "); this run would replace it: choose another directory, or pass "
            "--overwrite-checkpoints to remove it";
  } else if (options.resume_step < 0) {
    for (const auto& [step, path] : steps) c.doomed.push_back(path);
    c.why = "--checkpoint-dir `" + dir +
            "` already holds checkpoints of this program (the newest is step " +
            std::to_string(steps.back().first) +
            "); a fresh run would write over them: resume with --resume " + dir +
            ", or pass --overwrite-checkpoints to remove them and start over";
  } else {
    for (const auto& [step, path] : steps) {
      if (step > options.resume_step) c.doomed.push_back(path);
    }
    c.why = "--checkpoint-dir `" + dir + "` holds checkpoints after step " +
            std::to_string(options.resume_step) + " (up to step " +
            std::to_string(steps.back().first) + "), the step this run resumes from: it would " +
            "mix two histories; pass --overwrite-checkpoints to remove the later ones, or write " +
            "into another directory";
  }
  return c;
}

// Removes `doomed` step directories and points `latest` at the newest one left.
void RemoveCheckpoints(const std::string& dir, const std::vector<fs::path>& doomed) {
  std::error_code ec;
  for (const fs::path& p : doomed) {
    fs::remove_all(p, ec);
    if (ec) throw CheckpointError("cannot remove `" + p.string() + "`: " + ec.message());
  }
  const auto left = StepDirectories(dir);
  const fs::path latest = fs::path(dir) / "latest";
  if (left.empty()) {
    fs::remove(latest, ec);
  } else {
    WriteFileSynced((fs::path(dir) / ".latest.tmp").string(),
                    left.back().second.filename().string() + "\n");
    fs::rename(fs::path(dir) / ".latest.tmp", latest, ec);
  }
  FsyncPath(dir, true);
}

}  // namespace

CheckpointLock PrepareCheckpointDirectory(const std::string& dir, const ProgramImage& program,
                                          const PrepareOptions& options) {
  CheckpointLock lock(dir);
  CheckRoomForCheckpoint(dir, program);
  if (options.clean_leftovers) CleanInterruptedWrites(dir);
  // Entries named like checkpoints that are none: a checkpoint of that step would replace them.
  if (const auto foreign = ListStepEntries(dir).uncommitted; !foreign.empty()) {
    if (!options.overwrite) {
      throw CheckpointError(
          "--checkpoint-dir `" + dir + "` holds `" + foreign.front().second.string() +
          "`, named like a checkpoint but without a `manifest.json` (" +
          std::to_string(foreign.size()) + " such entr" + (foreign.size() == 1 ? "y" : "ies") +
          "); a checkpoint of that step would replace it: move it away, or pass "
          "--overwrite-checkpoints to remove it");
    }
    std::vector<fs::path> doomed;
    for (const auto& [step, path] : foreign) doomed.push_back(path);
    RemoveCheckpoints(dir, doomed);
  }
  const auto steps = StepDirectories(dir);
  if (steps.empty()) return lock;
  const ConflictingCheckpoints conflicts = FindConflictingCheckpoints(dir, program, options, steps);
  if (conflicts.doomed.empty()) return lock;
  if (!options.overwrite) throw CheckpointError(conflicts.why);
  RemoveCheckpoints(dir, conflicts.doomed);
  return lock;
}

void AbandonCheckpoints(const std::string& dir, int64_t first_step, int64_t last_step) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    long long step = -1;
    char tail[8] = {};
    if (std::sscanf(name.c_str(), ".step-%lld%7s", &step, tail) == 2 &&
        std::string(tail) == ".tmp" && step >= first_step && step <= last_step &&
        name == "." + StepName(step) + ".tmp") {
      doomed.push_back(it->path());
    }
  }
  for (const fs::path& p : doomed) fs::remove_all(p, ec);
}

bool WritingDamagesCheckpoints(const std::string& file, const std::string& dir) {
  if (dir.empty()) return false;
  std::error_code ec;
  const fs::path f = fs::weakly_canonical(file, ec);
  if (ec) return false;
  const fs::path d = fs::weakly_canonical(dir, ec);
  if (ec) return false;
  const fs::path rel = f.lexically_relative(d);
  if (rel.empty() || *rel.begin() == "..") return false;
  const std::string first = rel.begin()->string();
  const auto starts = [&](const char* head) { return first.rfind(head, 0) == 0; };
  return first == ".lock" || first == "latest" || first == ".latest.tmp" || first == "." ||
         first == "manifest.json" || starts("step-") || starts(".step-") || starts("rank-");
}

void ReadRankShard(const CheckpointManifest& manifest, const ProgramImage& program, int rank,
                   const std::vector<StateTensor>& state, Backend& backend) {
  const std::string path = (fs::path(manifest.directory) / ShardName(rank)).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError("checkpoint shard `" + path + "` is missing");
  const std::string bytes = ReadAll(path);
  auto bad = [&](const std::string& what) {
    return CheckpointError("checkpoint shard `" + path + "`: " + what);
  };
  if (bytes.size() < 8 + 32 + 8 || std::memcmp(bytes.data(), kShardMagic, 8) != 0)
    throw bad("not a paraplan shard");
  uint64_t sum;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  if (sum != Fnv(bytes.substr(0, bytes.size() - 8)))
    throw bad("checksum mismatch (the file is damaged)");
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
  if (fp != program.fingerprint || r != rank || step != manifest.step)
    throw bad("belongs to another plan, rank or step");
  if (count != state.size())
    throw bad("holds " + std::to_string(count) + " tensors, the rank has " +
              std::to_string(state.size()));
  for (const auto& t : state) {
    uint32_t len;
    get(len);
    if (pos + len > bytes.size() - 8) throw bad("truncated");
    const std::string name = bytes.substr(pos, len);
    pos += len;
    int64_t elements;
    get(elements);
    if (name != t.name || elements != t.elements) {
      throw bad("tensor `" + name + "` (" + std::to_string(elements) + " elements) where `" +
                t.name + "` (" + std::to_string(t.elements) + ") was expected");
    }
    if (pos + static_cast<size_t>(elements) * 4 > bytes.size() - 8) throw bad("truncated");
    backend.CopyToDevice(t.data, bytes.data() + pos, elements * 4);
    pos += static_cast<size_t>(elements) * 4;
  }
}

}  // namespace paraplan::exec
