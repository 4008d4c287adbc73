// Checkpoints: sharded (one file per rank), atomic, with a manifest, in a locked directory.
//
// Layout of a checkpoint directory DIR:
//   DIR/.lock                       held (flock) by the run writing DIR: "pid P on host H since T"
//   DIR/step-000010/manifest.json   {"version":2, "plan", "fingerprint", "state_fingerprint",
//                                    "step", "world_size", "shards"}
//   DIR/step-000010/rank-00003.bin  one rank's persistent state (RankRunner::State), checksummed
//   DIR/latest                      the name of the newest checkpoint (for people and tools)
// "step" is the number of completed steps (the step a resumed run starts with). A checkpoint is
// written into DIR/.step-000010.tmp, every file fsync-ed, the manifest last, the directory
// fsync-ed, renamed into place and DIR fsync-ed; then `latest` is replaced by rename. A step
// directory exists only complete, and a resume takes the newest step directory (not `latest`),
// so a crash or a kill at any point resumes from the newest complete step.
// A checkpoint resumes only a program with the same fingerprint (ProgramImage::fingerprint: model,
// layout, seed) and state fingerprint (plan name, optimizer, schedule and every rank's state
// tensors) and world size; anything else is refused with a clear CheckpointError.
//
// Made by: the interpreter (--checkpoint-dir). Read by: the interpreter (--resume).
#ifndef PARAPLAN_RUNTIME_EXEC_CHECKPOINT_H_
#define PARAPLAN_RUNTIME_EXEC_CHECKPOINT_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/exec/program_image.h"
#include "runtime/exec/rank_runner.h"

namespace paraplan::exec {

class CheckpointError : public std::runtime_error {
 public:
  explicit CheckpointError(const std::string& what) : std::runtime_error(what) {}
};

struct CheckpointManifest {
  std::string plan;
  uint64_t fingerprint = 0;
  uint64_t state_fingerprint = 0;  // 0 in version-1 manifests (which did not record it)
  int64_t step = 0;
  int32_t world_size = 0;
  std::string directory;  // the step directory the manifest was read from
};

// What a checkpoint of `program` must match beyond ProgramImage::fingerprint: the plan name,
// optimizer, schedule and the names and sizes of every rank's state tensors.
uint64_t StateFingerprint(const ProgramImage& program);
// Bytes one checkpoint of `program` takes on disk (all ranks' shards and the manifest).
double CheckpointBytes(const ProgramImage& program);

// The exclusive lock of a checkpoint directory, held while a run may write it (flock on
// DIR/.lock, released when the object goes or the process ends, even by SIGKILL).
class CheckpointLock {
 public:
  CheckpointLock() = default;
  // Creates `dir` when missing and locks it. Throws CheckpointError naming the holder ("pid P on
  // host H since T") when another run holds it, or why the directory cannot be written.
  explicit CheckpointLock(const std::string& dir);
  ~CheckpointLock();
  CheckpointLock(CheckpointLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  CheckpointLock& operator=(CheckpointLock&& other) noexcept;
  bool Held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct PrepareOptions {
  // The step a run resumes from when it resumes from a checkpoint in this same directory; -1
  // when it starts fresh or resumes from another directory.
  int64_t resume_step = -1;
  // Remove the directory's checkpoints that this run would otherwise be refused for.
  bool overwrite = false;
  // Remove leftovers of interrupted writes (temporary step directories); only a process that
  // runs every rank may, since under a launcher other processes write their shards there.
  bool clean_leftovers = true;
};

// Before step 0 of a run that writes checkpoints into `dir`: locks it (the returned lock must
// live as long as the run), checks that it can be written and that the file system has room for
// one checkpoint, restores or removes leftovers of interrupted writes, and refuses a directory
// that holds checkpoints this run would mix with or replace: those of another program, those of
// this program when the run does not resume from them, and those after the step it resumes from
// (unless options.overwrite, which removes them).
CheckpointLock PrepareCheckpointDirectory(const std::string& dir, const ProgramImage& program,
                                          const PrepareOptions& options);

// The temporary directory ranks write into for `step`; every rank may call it (idempotent).
std::string BeginCheckpoint(const std::string& dir, int64_t step);
// Writes one rank's shard into `tmp_dir` (fsync-ed); `state` holds backend pointers.
void WriteRankShard(const std::string& tmp_dir, const ProgramImage& program, int rank, int64_t step,
                    const std::vector<StateTensor>& state, Backend& backend);
// Writes the manifest, fsyncs, renames tmp_dir into place and updates `latest`.
void CommitCheckpoint(const std::string& dir, const std::string& tmp_dir,
                      const ProgramImage& program, int64_t step);

// Finds the checkpoint to resume in `dir` (its newest complete step directory, or `dir` itself
// when it holds a manifest) and checks it belongs to `program`.
CheckpointManifest FindCheckpoint(const std::string& dir, const ProgramImage& program);
// After a failed run: removes the temporary directories of steps first..last (never a
// committed checkpoint), so a full disk is not left fuller.
void AbandonCheckpoints(const std::string& dir, int64_t first_step, int64_t last_step);
// Whether writing `file` would damage the checkpoints of `dir`: its lock, `latest`, anything in
// a step directory or its temporary (or in `dir` itself when it is one, as --resume may name).
// A file beside the step directories damages nothing.
bool WritingDamagesCheckpoints(const std::string& file, const std::string& dir);
// Reads one rank's shard into `state` (same names and sizes, else CheckpointError).
void ReadRankShard(const CheckpointManifest& manifest, const ProgramImage& program, int rank,
                   const std::vector<StateTensor>& state, Backend& backend);

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_CHECKPOINT_H_
