// Token data for training: loading token streams from files, and cutting them into the
// per-step, per-data-parallel-rank, per-microbatch sequences the interpreter feeds the model.
//
// Sources (chosen by LoadTokens from the path):
//  - Megatron indexed dataset: PATH is the prefix, or PATH.bin / PATH.idx is named; both files
//    must exist. The .idx is checked completely (magic, version, dtype, counts, lengths and
//    pointers inside the .bin) before any token is read; every sequence is concatenated in order.
//  - Raw token files: `*.u16` / `*.uint16` (little-endian uint16) and `*.u32` / `*.uint32`.
//  - Text (`*.txt`): bytes through the byte-level tokenizer (byte_tokenizer.h).
// Token files are memory-mapped, not read: a stream of any size costs only what the steps touch.
// Every token is checked against the model's vocabulary: at load for streams of up to 64M tokens,
// else as it is read (DataError naming the position).
//
// Sampling: the stream is cut into samples of seq_len + 1 tokens that overlap by one (inputs are
// tokens [i·L, i·L + L), targets are shifted by one). Epoch e visits the samples in a permutation
// that depends only on (seed, e): a Fisher-Yates shuffle held in memory up to 2^20 samples, a
// Feistel permutation computed per sequence beyond (no memory per sample). Step s uses global
// sequences s·B … s·B + B − 1 of that order;
// data-parallel rank d takes sequences [d·B/dp, (d+1)·B/dp) of the step, microbatch m of them
// [m·micro, (m+1)·micro). So every data-parallel layout of one global batch sees the same
// sequences as the one-rank run.
//
// Made by: planrun. Read by: the interpreter (runtime/exec). Errors: DataError with a clear
// message.
#ifndef PARAPLAN_RUNTIME_DATA_TOKEN_DATA_H_
#define PARAPLAN_RUNTIME_DATA_TOKEN_DATA_H_

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace paraplan::data {

class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& what) : std::runtime_error(what) {}
};

// Where a mapped stream's tokens are: its memory maps and its contiguous runs of tokens.
struct MappedTokens;
class FileMap;

// A token stream: in memory (`tokens`, text and tests) or memory-mapped from files (`mapped`).
// Copies share the mapping. Read by Sampler (and tests through ToVector).
struct TokenStream {
  std::vector<int32_t> tokens;                 // in-memory tokens (when `mapped` is null)
  std::shared_ptr<const MappedTokens> mapped;  // memory-mapped tokens
  std::string description;  // "Megatron indexed dataset `corpus` (3 sequences, 1234 tokens)"
  std::string path;
  int64_t vocab = 0;  // > 0: tokens are checked against it as they are read

  int64_t Size() const;
  // tokens [offset, offset + n) -> out; DataError for a token outside the vocabulary.
  void Read(int64_t offset, int64_t n, int32_t* out) const;
  std::vector<int32_t> ToVector() const;

 private:
  [[noreturn]] void ThrowOutOfVocabulary(int64_t token, int64_t position) const;
};

// The files LoadTokens reads for `path`: the path itself and, for a Megatron indexed dataset (a
// prefix, or its .bin or .idx named), both of its files. Empty for an empty path.
std::vector<std::string> DataFiles(const std::string& path);

// Loads the tokens of `path` (see above) and checks each is < vocab.
TokenStream LoadTokens(const std::string& path, int64_t vocab);

// Megatron indexed dataset (.bin + .idx) reading and writing (writing is for tests and tools).
TokenStream ReadIndexedDataset(const std::string& prefix);
// Writes prefix.bin / prefix.idx with dtype uint16 (code 8) when every token < 65536 and
// uint16 is requested, else int32 (code 4); one document per sequence.
void WriteIndexedDataset(const std::string& prefix,
                         const std::vector<std::vector<int32_t>>& sequences, bool uint16_tokens);

struct BatchShape {
  int64_t seq_len = 0;        // tokens per sequence (model input length)
  int64_t global_batch = 0;   // sequences per step, over all data-parallel ranks
  int64_t micro_batch = 0;    // sequences per microbatch
  int64_t data_parallel = 1;  // data-parallel ranks
};

class Sampler {
 public:
  // Throws DataError when the stream holds fewer samples than one global batch, or the shape
  // does not divide (global % (micro · dp) != 0).
  Sampler(const TokenStream& stream, BatchShape shape, uint64_t seed);

  // Up to this many samples an epoch's order is shuffled and held (Fisher-Yates); beyond it each
  // sequence's place is computed (a Feistel permutation).
  static constexpr int64_t kShuffledInMemory = int64_t{1} << 20;

  int64_t Samples() const { return samples_; }
  int64_t MicrobatchesPerRank() const {
    return shape_.global_batch / (shape_.micro_batch * shape_.data_parallel);
  }

  // Fills inputs and targets (micro_batch × seq_len each, sequence b at [b·seq_len, ...)) for
  // `step` (from 0), data-parallel rank `dp_rank`, microbatch `micro` (DataError when out of
  // range).
  void Microbatch(int64_t step, int64_t dp_rank, int64_t micro, int32_t* inputs,
                  int32_t* targets) const;

 private:
  int64_t SampleOf(int64_t global_sequence) const;

  const TokenStream& stream_;
  BatchShape shape_;
  uint64_t seed_;
  int64_t samples_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> order_;
  mutable std::vector<int32_t> window_;
};

// SplitMix64: the counter-based hash used for shuffling and parameter initialisation.
uint64_t SplitMix64(uint64_t x);

}  // namespace paraplan::data

#endif  // PARAPLAN_RUNTIME_DATA_TOKEN_DATA_H_
