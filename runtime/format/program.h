// The paraplan program format: the generated FlatBuffers types (program_generated.h, from
// program.fbs) plus the constants both sides agree on. Included by the compiler (lower/, the
// writer) and by the runtime (exec/, the reader); README.md beside it gives every op's meaning.
#ifndef PARAPLAN_RUNTIME_FORMAT_PROGRAM_H_
#define PARAPLAN_RUNTIME_FORMAT_PROGRAM_H_

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/format/program_generated.h"

namespace paraplan::prog {

// Bumped when a file written by a newer compiler would be misread by an older runtime.
// 2: ZeRO-2/3 grad shards (BucketInfo.grad_shard, ReduceScatter accumulate), per-layer buckets
//    and in-body ZeRO-3 gathers.
// 3: Role.steps, the schedule in compact form (ScheduleStep); planc writes it for every schedule
//    it can hold. A reader of version 3 reads version 2 files too (kOldestFormatVersion): the
//    addition changes nothing else.
// 4: Role.loops, repeated blocks of Role.steps (the steady state of a pipeline schedule in loop
//    form). planc writes version 4 only for a program with a loop; every other program is
//    written as version 3, byte for byte as before.
inline constexpr uint32_t kFormatVersion = 4;
inline constexpr uint32_t kLoopFormatVersion = 4;
inline constexpr uint32_t kOldestFormatVersion = 2;

// Whether a reader of this release reads files of format `version`.
inline constexpr bool IsReadableFormatVersion(uint32_t version) {
  return version >= kOldestFormatVersion && version <= kFormatVersion;
}

// Rank.comms has one entry per CommKind value (index 0, None, is always -1).
inline constexpr int kCommKinds = static_cast<int>(CommKind::MAX) + 1;

// Op.ints layout of the schedule's pipeline transfers (the positions ops.def gives; typed access:
// prog::attrs::SendActivation and its siblings in ops.h).
inline constexpr int kP2pMicrobatch = 0;
inline constexpr int kP2pChunk = 1;
inline constexpr int kP2pSlot = 2;
inline constexpr int kP2pPeer = 3;
inline constexpr int kP2pGroup = 4;

// Reduction operators of AllReduce / ReduceScatter (Op.ints[0]; typed: prog::ReduceOp in ops.h).
inline constexpr int64_t kReduceSum = 0;
inline constexpr int64_t kReduceMax = 1;
inline constexpr int64_t kReduceAvg = 2;

// Copies a vector of scalars out of a verified buffer. The FlatBuffers verifier checks the
// alignment of a vector's length but not of its elements, so a damaged file can place 8-byte
// values at a 4-byte boundary: the bytes are copied rather than loaded as misaligned values.
template <typename T>
std::vector<T> CopyScalars(const flatbuffers::Vector<T>* v) {
  static_assert(std::is_scalar_v<T>, "vectors of scalars only");
  if (!v) return {};
  std::vector<T> out(v->size());
#if FLATBUFFERS_LITTLEENDIAN
  if (!out.empty()) std::memcpy(out.data(), v->Data(), out.size() * sizeof(T));
#else
  for (uint32_t i = 0; i < v->size(); ++i) {
    T x;
    std::memcpy(&x, v->Data() + i * sizeof(T), sizeof(T));
    out[i] = flatbuffers::EndianScalar(x);
  }
#endif
  return out;
}

inline int64_t DTypeBytes(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::Bf16:
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
  }
  return 0;
}

}  // namespace paraplan::prog

#endif  // PARAPLAN_RUNTIME_FORMAT_PROGRAM_H_
