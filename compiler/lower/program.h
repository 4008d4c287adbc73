// The lowered program in memory: the compiler's mirror of runtime/format/program.fbs.
//
// lower/ builds it (Lower), verifies the whole world on it (VerifyWorld), writes it with
// ToFlatBuffer; `planc dump` reads a file back with FromFlatBuffer and prints it. The fields
// mean exactly what runtime/format/README.md says of their FlatBuffers counterparts.
//
// Invariants after Lower: every index (buffer, body, chunk, communicator, role) is in range;
// ranks.size() == world_size; Rank::comms has prog::kCommKinds entries. FromFlatBuffer checks
// these for files from outside and refuses a file that breaks them.
#ifndef PARAPLAN_COMPILER_LOWER_PROGRAM_H_
#define PARAPLAN_COMPILER_LOWER_PROGRAM_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/program.h"

namespace paraplan::lower {

using prog::BufferKind;
using prog::CommKind;
using prog::DType;
using prog::OpKind;

struct Op {
  OpKind kind = OpKind::Forward;
  std::vector<int32_t> inputs;
  std::vector<int32_t> outputs;
  CommKind comm = CommKind::None;
  std::vector<int64_t> ints;
  std::vector<double> floats;

  // Accessors for schedule ops ([microbatch, chunk, slot, peer, group]); -1 when absent.
  int64_t Int(size_t i) const { return i < ints.size() ? ints[i] : -1; }
};

struct Body {
  std::string name;
  std::vector<Op> ops;
};

struct Buffer {
  std::string name;
  BufferKind kind = BufferKind::Scratch;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t offset = 0, bytes = 0;
  int32_t slots = 1;
  int64_t slot_stride = 0;
  int64_t fp32_offset = 0, fp32_bytes = 0, fp32_slot_stride = 0;
  int32_t view_of = -1;
  int64_t view_offset = 0;
  int32_t chunk = -1;  // compiler only: the chunk whose slots a Stash buffer follows

  int64_t Elements() const;
};

struct Param {
  std::string name;
  int64_t key = 0;
  std::vector<int64_t> global_shape;
  int32_t split_dim = -1;
  CommKind split_comm = CommKind::None;
  prog::InitKind init = prog::InitKind::Normal;
  double init_std = 0.02;
  int32_t buffer = -1, grad = -1, chunk = 0;
  bool decay = true, tp_replicated = false, counts_in_norm = true, grad_sync_tp = false;
};

struct Bucket {
  int32_t chunk = 0;
  int32_t params = -1, grads = -1;
  int64_t elements = 0, shard_elements = 0;
  int32_t master = -1, exp_avg = -1, exp_avg_sq = -1, param_shard = -1;
  int32_t grad_shard = -1;
};

struct Chunk {
  int32_t index = 0, stage = 0, first_layer = 0, layers = 0;
  bool has_embedding = false, has_loss = false;
  int32_t forward = -1, backward = -1;
  int32_t input = -1, output = -1, grad = -1;
  int32_t slots = 1;
};

struct Role {
  std::string name;
  int32_t pipeline_rank = 0;
  std::vector<Buffer> buffers;
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  std::vector<Chunk> chunks;
  std::vector<Body> bodies;
  std::vector<Op> schedule;
  int64_t arena_bytes = 0, fp32_arena_bytes = 0, peak_bytes = 0;
};

struct Coordinates {
  int32_t tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
};

struct Rank {
  int32_t role = 0;
  Coordinates coords;
  std::array<int32_t, prog::kCommKinds> comms;
  Rank() { comms.fill(-1); }
};

struct Communicator {
  CommKind kind = CommKind::None;
  std::vector<int32_t> members;
};

struct ModelConfig {
  std::string name;
  int32_t layers = 0;
  int64_t hidden = 0, ffn_hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t vocab = 0, vocab_padded = 0, seq_len = 0, micro_batch = 1;
  prog::NormKind norm = prog::NormKind::RmsNorm;
  prog::ActivationKind activation = prog::ActivationKind::SwiGlu;
  prog::PositionKind position = prog::PositionKind::Rope;
  bool tied_embeddings = false;
  double norm_eps = 1e-5, rope_theta = 10000;
  bool bias = false;
};

struct ParallelConfig {
  int32_t tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, dp = 1;
  bool sp = false;
  int32_t zero = 0;
  prog::ScheduleKind schedule = prog::ScheduleKind::OneFOneB;
  std::string order = "tp-cp-ep-dp-pp";
};

struct TrainConfig {
  int64_t steps = 0, seed = 0, global_batch = 0, microbatches = 0;
  prog::Precision precision = prog::Precision::Bf16;
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0;
  double weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, clip_grad = 0;
  std::string optimizer = "adamw";
  std::string data;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

struct Program {
  uint32_t format_version = prog::kFormatVersion;
  std::string producer;
  std::string plan_name;
  int32_t world_size = 0;
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  std::vector<Communicator> communicators;
  std::vector<Rank> ranks;
  std::vector<Role> roles;

  // Position of `rank` in its communicator of `kind`; -1 when it has none.
  int32_t IndexIn(int32_t rank, CommKind kind) const;
  // The global rank at position `index` of `rank`'s communicator of `kind`; -1 when none.
  int32_t MemberOf(int32_t rank, CommKind kind, int64_t index) const;
};

// Structural checks (indices in range, sizes consistent). Empty when fine.
std::vector<std::string> VerifyStructure(const Program& program);

// Serialisation. ToFlatBuffer never fails; FromFlatBuffer runs the FlatBuffers verifier and
// VerifyStructure and returns nullopt with *error set when the bytes are not a valid program.
std::vector<uint8_t> ToFlatBuffer(const Program& program);
std::optional<Program> FromFlatBuffer(const uint8_t* data, size_t size, std::string* error);

// Names used in dumps and messages: "forward", "send_activation", "all_reduce", "tp".
std::string_view OpName(OpKind kind);
std::string_view CommName(CommKind kind);
bool IsP2p(OpKind kind);
bool IsCollective(OpKind kind);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_PROGRAM_H_
