#include "runtime/exec/program_image.h"

#include <filesystem>
#include <vector>

#include "runtime/format/read_program.h"

namespace paraplan::exec {
namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void Bytes(const void* p, size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  void Int(int64_t v) { Bytes(&v, sizeof v); }
  void Text(const std::string& s) {
    Int(static_cast<int64_t>(s.size()));
    Bytes(s.data(), s.size());
  }
};

}  // namespace

ProgramImage DecodeProgramImage(const uint8_t* data, size_t size, const std::string& origin) {
  ProgramImage img;
  // Schedules in loop form stay so: each rank expands its own role's (RankRunner).
  static_cast<prog::mem::Program&>(img) =
      prog::mem::DecodeProgram(data, size, origin, /*keep_loops=*/true);
  Fnv f;
  f.Int(img.world_size);
  const auto& md = img.model;
  for (int64_t v :
       {int64_t{md.layers}, md.hidden, md.ffn_hidden, md.heads, md.kv_heads, md.head_dim, md.vocab,
        md.vocab_padded, md.seq_len, static_cast<int64_t>(md.norm),
        static_cast<int64_t>(md.activation), static_cast<int64_t>(md.position),
        int64_t{md.tied_embeddings}, int64_t{md.bias}}) {
    f.Int(v);
  }
  const auto& pl = img.parallel;
  for (int64_t v : {pl.tp, pl.pp, pl.vpp, pl.cp, pl.ep, pl.dp, pl.zero}) f.Int(v);
  f.Int(pl.sp);
  f.Int(img.train.seed);
  for (const auto& role : img.roles) {
    for (const auto& q : role.params) {
      f.Text(q.name);
      f.Int(q.key);
      for (int64_t d : q.global_shape) f.Int(d);
      f.Int(q.split_dim);
      if (q.split2_dim >= 0) f.Int(q.split2_dim);
    }
    for (const auto& b : role.buckets) {
      f.Int(b.elements);
      f.Int(b.shard_elements);
    }
  }
  img.fingerprint = f.h;
  return img;
}

ProgramImage LoadProgramImage(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ProgramError("program `" + path + "` does not exist");
  if (std::filesystem::is_directory(path, ec))
    throw ProgramError("program `" + path + "` is a directory");
  // FlatBuffers reads need the buffer aligned; std::vector storage is.
  std::vector<uint8_t> bytes;
  std::string error;
  if (!prog::ReadProgramFile(path, &bytes, &error))
    throw ProgramError("cannot read program `" + path + "`: " + error);
  return DecodeProgramImage(bytes.data(), bytes.size(), path);
}

}  // namespace paraplan::exec
