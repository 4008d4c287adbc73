// The program in memory: plain structs mirroring program.fbs field for field, shared by the
// compiler (compiler/lower/ builds one, verifies it and writes it with EncodeProgram; `planc dump`
// reads a file back) and the runtime (runtime/exec/ decodes a file into one, validates it and
// indexes it while running). The fields mean exactly what README.md says of their FlatBuffers
// counterparts; nothing here is specific to either side.
//
// Made by: the compiler's Lower; DecodeProgram (the runtime's validating reader) or
// DecodeProgramModel (a plain copy of a verified FlatBuffers root, on which the compiler's
// `planc dump` runs its own structural checks) from a file. Read by:
// compiler/lower (printing, EncodeProgram), runtime/verify (the whole-world verifier, for the
// compiler and planrun) and runtime/exec (the interpreter).
// Invariants once a reader has validated it: every index (buffer, body, chunk, communicator,
// role) is in range; ranks.size() == world_size; Rank::comms has kCommKinds entries.
#ifndef PARAPLAN_RUNTIME_FORMAT_PROGRAM_MODEL_H_
#define PARAPLAN_RUNTIME_FORMAT_PROGRAM_MODEL_H_

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/format/program.h"

namespace paraplan::prog::mem {

struct Op {
  OpKind kind = OpKind::Forward;
  std::vector<int32_t> inputs;
  std::vector<int32_t> outputs;
  CommKind comm = CommKind::None;
  std::vector<int64_t> ints;
  std::vector<double> floats;

  // ints[i] / floats[i], or `fallback` when the op has fewer.
  int64_t Int(size_t i, int64_t fallback = -1) const {
    return i < ints.size() ? ints[i] : fallback;
  }
  double Float(size_t i, double fallback = 0) const {
    return i < floats.size() ? floats[i] : fallback;
  }
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

  // Product of the shape (unchecked: a decoded file's shapes are checked by its reader).
  int64_t Elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct Param {
  std::string name;
  int64_t key = 0;
  std::vector<int64_t> global_shape;
  int32_t split_dim = -1;
  CommKind split_comm = CommKind::None;
  InitKind init = InitKind::Normal;
  double init_std = 0.02;
  int32_t buffer = -1, grad = -1, chunk = 0;
  bool decay = true, tp_replicated = false, counts_in_norm = true, grad_sync_tp = false;
  int32_t split2_dim = -1;  // a second split dimension (experts: the Etp slice beside Ep)
  CommKind split2_comm = CommKind::None;
};

struct Bucket {
  int32_t chunk = 0;
  int32_t params = -1, grads = -1;
  int64_t elements = 0, shard_elements = 0;
  int32_t master = -1, exp_avg = -1, exp_avg_sq = -1, param_shard = -1;
  int32_t grad_shard =
      -1;  // ZeRO-2/3 (dp > 1): the persistent grad shard; `grads` is then transient
};

struct Chunk {
  int32_t index = 0, stage = 0, first_layer = 0, layers = 0;
  bool has_embedding = false, has_loss = false;
  int32_t forward = -1, backward = -1;
  int32_t input = -1, output = -1, grad = -1;
  int32_t slots = 1;
  int32_t pool = -1;  // chunks with the same pool >= 0 share their slots; -1: its own
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
  // The schedule in compact form (ScheduleStep, 24 bytes an op): a role holds its schedule in
  // `schedule` or in `steps`, never in both. Only the compiler's writing path holds `steps`
  // (a large world's schedules then take a fraction of the memory); DecodeProgram and
  // DecodeProgramModel give `schedule` (DecodeProgramModel keeps loops as steps on request).
  // Readers that take either form: VerifyWorld, VerifyStructure, EncodeProgram.
  std::vector<prog::ScheduleStep> steps;
  // Repeated blocks of `steps` (format 4, README.md section 3 "Loops"): in order, not
  // overlapping; empty when every step stands for one op. Only with `steps`.
  std::vector<prog::ScheduleLoop> loops;
};

struct Coordinates {
  int32_t tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;

  // From the file's struct of the same name (a template so that `coords = {tp, cp, ep, dp, pp}`
  // stays the plain aggregate assignment).
  template <typename C>
  requires std::same_as<C, prog::Coordinates> Coordinates& operator=(const C& c) {
    *this = Coordinates{c.tp(), c.cp(), c.ep(), c.dp(), c.pp()};
    return *this;
  }
};

struct Rank {
  int32_t role = 0;
  Coordinates coords;
  std::array<int32_t, kCommKinds> comms;
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
  NormKind norm = NormKind::RmsNorm;
  ActivationKind activation = ActivationKind::SwiGlu;
  PositionKind position = PositionKind::Rope;
  bool tied_embeddings = false;
  double norm_eps = 1e-5, rope_theta = 10000;
  bool bias = false;
  // Multi-head latent attention (kv_lora_rank > 0); all zero for ordinary attention.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0,
          v_head_dim = 0;
  // Queries and keys normalised per head (the model's norm over head_dim) before RoPE.
  bool qk_norm = false;
  // Sliding-window attention span in keys (0 = full causal attention).
  int64_t window = 0;
  // Multi-token prediction modules after the last layer (0 = none) and the weight of their mean
  // loss.
  int32_t mtp_layers = 0;
  double mtp_loss_scale = 0.1;
};

struct ParallelConfig {
  int32_t tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, dp = 1;
  bool sp = false;
  int32_t zero = 0;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  std::string order = "tp-cp-ep-dp-pp";
  int32_t replicate = 1;  // hybrid sharding's replicas (ZeRO over the Shard group); 1 = none
};

struct TrainConfig {
  int64_t steps = 0, seed = 0, global_batch = 0, microbatches = 0;
  Precision precision = Precision::Bf16;
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0;
  double weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, clip_grad = 0;
  std::string optimizer = "adamw";
  std::string data;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

struct Program {
  // 3 for a program without loops (written as format 3, byte for byte as before loops existed);
  // the encoder writes kLoopFormatVersion when a role holds loops.
  uint32_t format_version = 3;
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
  int32_t IndexIn(int32_t rank, CommKind kind) const {
    const std::vector<int32_t>* m = Members(rank, kind);
    if (!m) return -1;
    auto it = std::find(m->begin(), m->end(), rank);
    return it == m->end() ? -1 : static_cast<int32_t>(it - m->begin());
  }
  // The global rank at position `index` of `rank`'s communicator of `kind`; -1 when none.
  int32_t MemberOf(int32_t rank, CommKind kind, int64_t index) const {
    const std::vector<int32_t>* m = Members(rank, kind);
    if (!m || index < 0 || index >= static_cast<int64_t>(m->size())) return -1;
    return (*m)[index];
  }

 private:
  const std::vector<int32_t>* Members(int32_t rank, CommKind kind) const {
    if (rank < 0 || rank >= static_cast<int32_t>(ranks.size())) return nullptr;
    int32_t c = ranks[rank].comms[static_cast<int>(kind)];
    if (c < 0 || c >= static_cast<int32_t>(communicators.size())) return nullptr;
    return &communicators[c].members;
  }
};

// The compact form of a schedule op: false (and *step untouched) when `op` has none (a kind
// that is not a schedule op, ints not written in full, floats, operands other than the
// registry's, values outside the fields). FromScheduleStep(step) gives `op` back exactly.
bool ToScheduleStep(const Op& op, prog::ScheduleStep* step);
// The op a step stands for (its ints in full, the registry's operands).
Op FromScheduleStep(const prog::ScheduleStep& step);
// The schedule of `role` as ops, whichever form it is held in (loops expanded).
std::vector<Op> ScheduleOps(const Role& role);

// --- loops (format 4) ---
// The most ops a role's schedule may stand for once its loops are expanded: far above any
// schedule planc writes (2^16 microbatches of 8 chunks), low enough that expanding a damaged
// file's loops cannot exhaust memory.
inline constexpr int64_t kMaxScheduleOps = int64_t{1} << 25;

// Why `loops` over `steps` is malformed (README.md section 3, "Loops"), or empty:
// `chunk_slots[c]` is the slot count of chunk c. Checks bounds, order and overlap, counts and
// strides, the kinds a body may hold, transfer groups that would run across an iteration's
// boundary, and the expanded length (at most kMaxScheduleOps).
std::string CheckScheduleLoops(const std::vector<prog::ScheduleStep>& steps,
                               const std::vector<prog::ScheduleLoop>& loops,
                               const std::vector<int32_t>& chunk_slots);

// Step `s` of a loop body in iteration `i` (microbatch, slot modulo `slots`, non-zero group
// advanced by the loop's strides).
prog::ScheduleStep LoopStep(const prog::ScheduleStep& s, const prog::ScheduleLoop& loop, int64_t i,
                            int32_t slots);

// Calls fn(step) for every op the steps stand for, in order, loops expanded (the loops must have
// passed CheckScheduleLoops).
template <typename Fn>
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
void ForEachExpandedStep(const std::vector<prog::ScheduleStep>& steps,
                         const std::vector<prog::ScheduleLoop>& loops,
                         const std::vector<int32_t>& chunk_slots, Fn&& fn) {
  size_t at = 0;
  for (const prog::ScheduleLoop& l : loops) {
    for (; at < static_cast<size_t>(l.begin()); ++at) fn(steps[at]);
    for (int64_t i = 0; i < l.count(); ++i)
      for (int32_t k = 0; k < l.length(); ++k) {
        const prog::ScheduleStep& s =
            steps[static_cast<size_t>(l.begin()) + static_cast<size_t>(k)];
        fn(LoopStep(s, l, i, chunk_slots[static_cast<size_t>(s.chunk())]));
      }
    at = static_cast<size_t>(l.begin()) + static_cast<size_t>(l.length());
  }
  for (; at < steps.size(); ++at) fn(steps[at]);
}

// Why a file's role has malformed loops (CheckScheduleLoops, or loops without steps), prefixed
// with "role `NAME` ", or empty. Readers refuse such a file before decoding it.
std::string ScheduleLoopProblem(const prog::Role& role);

// The slot counts of a role's chunks (the modulus of each loop step's slot).
std::vector<int32_t> ChunkSlots(const Role& role);

// The chunk whose slots each Stash buffer of `role` follows (-1 for other buffers): the chunk
// whose input/output/grad it is, or whose bodies touch it (a Stash buffer is touched by its own
// chunk's bodies only).
std::vector<int32_t> StashChunks(const Role& role);
// --- end loops ---

// The FlatBuffers file of `program` (identifier "PPLN"); each role's schedule is written as
// steps when every op of it has a compact form, else as ops. Never fails.
std::vector<uint8_t> EncodeProgram(const Program& program);

// The same bytes, in the builder's own memory (no copy). The builder reserves an upper bound of
// the file's size up front, so it never grows by reallocation (which holds the old and the new
// buffer at once); the pages of the reserve that the file does not fill are never touched.
flatbuffers::DetachedBuffer EncodeProgramBuffer(const Program& program);

// EncodeProgramBuffer for a writer that is done with the schedules and bodies: each role's
// schedule and bodies are released as soon as they are encoded, so a large program's ops and
// its file are never in memory in full at the same time. Everything else in `program` stays.
flatbuffers::DetachedBuffer EncodeProgramReleasingOps(Program& program);

// Copies a verified FlatBuffers root (prog::VerifyProgramBuffer passed) into a Program. Checks
// nothing beyond what the copy needs: indices are taken as they are, Rank::comms keeps the
// first kCommKinds entries of the file's list (a reader that refuses longer lists checks
// `file.ranks()` itself). Absent sections keep their defaults.
// With `keep_loops`, a role whose schedule has loops keeps its steps and loops as listed
// (Role::steps, Role::loops) instead of expanding them into ops: the whole-world verifier reads
// that form without listing every microbatch.
Program DecodeProgramModel(const prog::Program& file, bool keep_loops = false);

// A program file a runtime must refuse; the message starts with "program `ORIGIN`: ".
// The largest world a program may describe: 2^20 ranks, far above any cluster trained on today,
// low enough that per-rank tables and membership checks stay bounded.
inline constexpr int32_t kMaxWorldSize = int32_t{1} << 20;

class ProgramError : public std::runtime_error {
 public:
  explicit ProgramError(const std::string& what) : std::runtime_error(what) {}
};

// The runtime's reader (program_decode.cpp): checks the file identifier, the FlatBuffers
// structure and the format version, decodes, and checks everything an interpreter relies on so
// that a bad file is refused with a clear message instead of crashing a rank: every index
// (buffer, body, chunk, communicator, role), rank membership of its communicators, buffer shapes
// and placements inside the f32 arena, views inside their targets, bucket and shard sizes, and
// every op against the op registry (ops.h CheckOp: operands, dtypes, attributes, chunk, slot
// and body references, communicator kind); also the format's limits
// (world size 1..kMaxWorldSize, dtypes F32/Bf16/F16/I32, arenas up to 1 TiB). A backend's own
// limits (the host backend runs at most exec::kMaxThreadRanks ranks as threads) are checked by
// that backend, so a program for a large cluster loads wherever it can run. Throws ProgramError.
// `origin` (a path or a name) prefixes every message. With `keep_loops` a schedule in loop form
// stays as its steps and loops (Role::steps, Role::loops; checked op by op as they expand): a
// runtime then expands only the roles it runs (ScheduleOps).
Program DecodeProgram(const uint8_t* data, size_t size, const std::string& origin,
                      bool keep_loops = false);

}  // namespace paraplan::prog::mem

#endif  // PARAPLAN_RUNTIME_FORMAT_PROGRAM_MODEL_H_
