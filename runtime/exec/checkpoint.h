// Checkpoints: sharded (one file per rank), atomic, with a manifest.
//
// Layout of a checkpoint directory DIR:
//   DIR/step-000010/manifest.json   {"version":1, "plan", "fingerprint", "step", "world_size", "shards"}
//   DIR/step-000010/rank-00003.bin  one rank's persistent state (RankRunner::State), checksummed
//   DIR/latest                      the name of the newest complete checkpoint
// "step" is the number of completed steps (the step a resumed run starts with). A checkpoint is
// written into DIR/.step-000010.tmp, every file fsync-ed, then renamed into place, then `latest`
// is replaced by rename: a crash at any point leaves the previous checkpoint intact.
// A checkpoint resumes only a program with the same fingerprint (ProgramImage::fingerprint) and
// world size; anything else is refused with a clear CheckpointError.
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
  int64_t step = 0;
  int32_t world_size = 0;
  std::string directory;  // the step directory the manifest was read from
};

// The temporary directory ranks write into for `step`; every rank may call it (idempotent).
std::string BeginCheckpoint(const std::string& dir, int64_t step);
// Writes one rank's shard into `tmp_dir` (fsync-ed); `state` holds backend pointers.
void WriteRankShard(const std::string& tmp_dir, const ProgramImage& program, int rank, int64_t step,
                    const std::vector<StateTensor>& state, Backend& backend);
// Writes the manifest, fsyncs, renames tmp_dir into place and updates `latest`.
void CommitCheckpoint(const std::string& dir, const std::string& tmp_dir, const ProgramImage& program,
                      int64_t step);

// Finds the checkpoint to resume in `dir` (DIR/latest, or `dir` itself when it holds a
// manifest) and checks it belongs to `program`.
CheckpointManifest FindCheckpoint(const std::string& dir, const ProgramImage& program);
// Before a run writes into `dir`: refuses a file, and a directory that holds a checkpoint of
// another program (a new run would replace it); a checkpoint of this program is fine.
void CheckCheckpointDirectory(const std::string& dir, const ProgramImage& program);
// After a failed run: removes the temporary directories of steps first..last (never a
// committed checkpoint), so a full disk is not left fuller.
void AbandonCheckpoints(const std::string& dir, int64_t first_step, int64_t last_step);
// Reads one rank's shard into `state` (same names and sizes, else CheckpointError).
void ReadRankShard(const CheckpointManifest& manifest, const ProgramImage& program, int rank,
                   const std::vector<StateTensor>& state, Backend& backend);

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_CHECKPOINT_H_
