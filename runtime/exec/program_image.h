// ProgramImage: a program file decoded into plain structs the interpreter indexes directly,
// after checking everything the interpreter relies on so that a bad file is refused with a
// clear message instead of crashing a rank: the FlatBuffers structure, the format version, every
// index (buffer, body, chunk, communicator, role), buffer placements inside the f32 arena, views
// inside their targets, and each body op's operand counts.
//
// Made by: LoadProgramImage (from a file) or DecodeProgramImage (from bytes). Read by: the
// interpreter, checkpoints (fingerprint), planrun. Immutable after decoding.
#ifndef PARAPLAN_RUNTIME_EXEC_PROGRAM_IMAGE_H_
#define PARAPLAN_RUNTIME_EXEC_PROGRAM_IMAGE_H_

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/format/program.h"

namespace paraplan::exec {

using prog::BufferKind;
using prog::CommKind;
using prog::DType;
using prog::OpKind;

class ProgramError : public std::runtime_error {
 public:
  explicit ProgramError(const std::string& what) : std::runtime_error(what) {}
};

struct OpImage {
  OpKind kind = OpKind::Forward;
  std::vector<int32_t> inputs, outputs;
  CommKind comm = CommKind::None;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  int64_t Int(size_t i, int64_t fallback = 0) const { return i < ints.size() ? ints[i] : fallback; }
  double Float(size_t i, double fallback = 0) const { return i < floats.size() ? floats[i] : fallback; }
};

struct BodyImage {
  std::string name;
  std::vector<OpImage> ops;
};

struct BufferImage {
  std::string name;
  BufferKind kind = BufferKind::Scratch;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t elements = 0;
  int32_t slots = 1;
  int64_t fp32_offset = 0, fp32_bytes = 0, fp32_slot_stride = 0;
  int32_t view_of = -1;
  int64_t view_offset = 0;
};

struct ParamImage {
  std::string name;
  int64_t key = 0;
  std::vector<int64_t> global_shape;
  int32_t split_dim = -1;
  CommKind split_comm = CommKind::None;
  prog::InitKind init = prog::InitKind::Normal;
  double init_std = 0;
  int32_t buffer = -1, grad = -1, chunk = 0;
  bool decay = false, tp_replicated = false, counts_in_norm = true, grad_sync_tp = false;
};

struct BucketImage {
  int32_t chunk = 0, params = -1, grads = -1;
  int64_t elements = 0, shard_elements = 0;
  int32_t master = -1, exp_avg = -1, exp_avg_sq = -1, param_shard = -1;
  int32_t grad_shard = -1;  // ZeRO-2/3 (dp > 1): the persistent grad shard; `grads` is then transient
};

struct ChunkImage {
  int32_t index = 0, stage = 0, first_layer = 0, layers = 0;
  bool has_embedding = false, has_loss = false;
  int32_t forward = -1, backward = -1, input = -1, output = -1, grad = -1, slots = 1;
};

struct RoleImage {
  std::string name;
  int32_t pipeline_rank = 0;
  std::vector<BufferImage> buffers;
  std::vector<ParamImage> params;
  std::vector<BucketImage> buckets;
  std::vector<ChunkImage> chunks;
  std::vector<BodyImage> bodies;
  std::vector<OpImage> schedule;
  int64_t fp32_arena_bytes = 0, peak_bytes = 0;
};

struct RankImage {
  int32_t role = 0;
  prog::Coordinates coords{};
  std::array<int32_t, prog::kCommKinds> comms{};
};

struct CommunicatorImage {
  CommKind kind = CommKind::None;
  std::vector<int32_t> members;
};

struct ModelImage {
  std::string name;
  int32_t layers = 0;
  int64_t hidden = 0, ffn_hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t vocab = 0, vocab_padded = 0, seq_len = 0, micro_batch = 1;
  prog::NormKind norm = prog::NormKind::RmsNorm;
  prog::ActivationKind activation = prog::ActivationKind::SwiGlu;
  prog::PositionKind position = prog::PositionKind::Rope;
  bool tied_embeddings = false, bias = false;
  double norm_eps = 1e-5, rope_theta = 10000;
};

struct ParallelImage {
  int32_t tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, dp = 1, zero = 0;
  bool sp = false;
  prog::ScheduleKind schedule = prog::ScheduleKind::OneFOneB;
  std::string order;
};

struct TrainImage {
  int64_t steps = 0, seed = 0, global_batch = 0, microbatches = 0, warmup_steps = 0;
  double lr = 0, min_lr = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, clip_grad = 0;
  std::string optimizer = "adamw", data;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

struct ProgramImage {
  uint32_t format_version = 0;
  std::string producer, plan_name;
  int32_t world_size = 0;
  ModelImage model;
  ParallelImage parallel;
  TrainImage train;
  std::vector<CommunicatorImage> communicators;
  std::vector<RankImage> ranks;
  std::vector<RoleImage> roles;
  // FNV-1a of the things a checkpoint depends on: world, model, parallel layout, seed, every
  // role's parameters and buckets. Not steps, learning rate or data.
  uint64_t fingerprint = 0;
};

ProgramImage DecodeProgramImage(const uint8_t* data, size_t size, const std::string& origin);
ProgramImage LoadProgramImage(const std::string& path);

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_PROGRAM_IMAGE_H_
