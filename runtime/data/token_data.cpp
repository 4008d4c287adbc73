#include "runtime/data/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "runtime/data/byte_tokenizer.h"
#include "runtime/format/checked_size.h"
#include "runtime/format/input_file.h"

namespace paraplan::data {
namespace {

namespace fs = std::filesystem;

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

std::string ReadFile(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError("data file `" + path + "` does not exist");
  if (fs::is_directory(path, ec))
    throw DataError("data path `" + path + "` is a directory, not a file");
  std::string bytes, why;  // a FIFO or a device (/dev/zero) is refused unread
  if (!ReadRegularFile(path, std::numeric_limits<uint64_t>::max(), &bytes, &why)) {
    throw DataError("cannot read data file `" + path + "`: " + why);
  }
  return bytes;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Little-endian reads with bounds checks against the .idx contents.
class IndexReader {
 public:
  IndexReader(const std::string& bytes, std::string path) : bytes_(bytes), path_(std::move(path)) {}
  template <typename T>
  T Read(const char* what) {
    if (pos_ + sizeof(T) > bytes_.size()) {
      throw DataError("index file `" + path_ + "` is truncated: it ends while reading " + what +
                      " at byte " + std::to_string(pos_));
    }
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  size_t Pos() const { return pos_; }

 private:
  const std::string& bytes_;
  std::string path_;
  size_t pos_ = 0;
};

// Raw .u32 files: unsigned 32-bit tokens. Not a Megatron dtype code (those are 1 to 8), so an
// index file declaring it is refused.
constexpr uint8_t kRawUint32 = 0xf4;

int64_t DTypeSize(uint8_t code) {
  switch (code) {
    case 1:
    case 2:
      return 1;  // uint8, int8
    case 3:
    case 8:
      return 2;  // int16, uint16
    case 4:
    case kRawUint32:
      return 4;  // int32, uint32 (raw files)
    case 5:
      return 8;  // int64
    default:
      return 0;  // floats (6, 7) and unknown codes are not token types
  }
}

int64_t TokenAt(const char* p, uint8_t code) {
  switch (code) {
    case 1:
      return static_cast<uint8_t>(*p);
    case 2:
      return static_cast<int8_t>(*p);
    case 3: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 8: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case kRawUint32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case 5: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
  return -1;
}

}  // namespace

// A read-only memory map of a whole file.
class FileMap {
 public:
  explicit FileMap(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw DataError("data file `" + path + "` does not exist");
    if (fs::is_directory(path, ec))
      throw DataError("data path `" + path + "` is a directory, not a file");
    std::string why;
    int64_t size = 0;
    const int fd = OpenRegularFile(path, &why, &size);  // a FIFO or a device is refused unread
    if (fd < 0) throw DataError("cannot open data file `" + path + "`: " + why);
    size_ = static_cast<size_t>(size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw DataError("cannot map data file `" + path + "`: " + std::strerror(errno));
      }
      data_ = static_cast<const char*>(p);
    }
    ::close(fd);
  }
  ~FileMap() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

namespace {
constexpr int64_t kEagerCheckTokens = int64_t{64} << 20;
}  // namespace

// Runs of tokens, each contiguous in one mapped file; `start` is the stream offset of a run.
struct MappedTokens {
  struct Run {
    int64_t start;
    const char* data;
    int64_t count;
    uint8_t code;  // Megatron dtype code of the stored integers
  };
  std::vector<std::shared_ptr<FileMap>> maps;
  std::vector<Run> runs;
  int64_t size = 0;
};

int64_t TokenStream::Size() const {
  return mapped ? mapped->size : static_cast<int64_t>(tokens.size());
}

void TokenStream::ThrowOutOfVocabulary(int64_t token, int64_t position) const {
  throw DataError("token " + std::to_string(token) + " at position " + std::to_string(position) +
                  " of `" + path + "` is outside the model's vocabulary of " +
                  std::to_string(vocab) + " tokens");
}

void TokenStream::Read(int64_t offset, int64_t n, int32_t* out) const {
  if (offset < 0 || n < 0 || offset + n > Size()) {
    throw DataError("read of tokens " + std::to_string(offset) + ".." + std::to_string(offset + n) +
                    " past the end of " + std::to_string(Size()) + " tokens");
  }
  if (!mapped) {
    std::copy(tokens.begin() + offset, tokens.begin() + offset + n, out);
  } else {
    const auto& runs = mapped->runs;
    auto it = std::upper_bound(runs.begin(), runs.end(), offset,
                               [](int64_t o, const MappedTokens::Run& r) { return o < r.start; });
    size_t run = static_cast<size_t>(it - runs.begin()) - 1;
    for (int64_t i = 0; i < n; ++i) {
      while (offset + i >= runs[run].start + runs[run].count) ++run;
      const auto& r = runs[run];
      const int64_t v = TokenAt(r.data + (offset + i - r.start) * DTypeSize(r.code), r.code);
      if (vocab > 0 && (v < 0 || v >= vocab)) ThrowOutOfVocabulary(v, offset + i);
      out[i] = v < 0 || v > INT32_MAX ? -1 : static_cast<int32_t>(v);
    }
    return;
  }
  if (vocab > 0) {
    for (int64_t i = 0; i < n; ++i) {
      if (out[i] < 0 || out[i] >= vocab) ThrowOutOfVocabulary(out[i], offset + i);
    }
  }
}

std::vector<int32_t> TokenStream::ToVector() const {
  std::vector<int32_t> out(static_cast<size_t>(Size()));
  TokenStream unchecked = *this;
  unchecked.vocab = 0;
  if (!out.empty()) unchecked.Read(0, Size(), out.data());
  return out;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static TokenStream ReadRaw(const std::string& path, int64_t width) {
  auto map = std::make_shared<FileMap>(path);
  if (map->size() % width != 0) {
    throw DataError("raw token file `" + path + "` has " + std::to_string(map->size()) +
                    " bytes, not a multiple of " + std::to_string(width) + " (uint" +
                    std::to_string(8 * width) + " tokens)");
  }
  auto mt = std::make_shared<MappedTokens>();
  mt->size = static_cast<int64_t>(map->size()) / width;
  // uint16 is Megatron's code 8; uint32 has none (kRawUint32).
  if (mt->size > 0)
    mt->runs.push_back({0, map->data(), mt->size, width == 2 ? uint8_t{8} : kRawUint32});
  mt->maps.push_back(std::move(map));
  TokenStream s;
  s.mapped = std::move(mt);
  s.description = "raw uint" + std::to_string(8 * width) + " tokens `" + path + "` (" +
                  std::to_string(s.Size()) + " tokens, memory-mapped)";
  return s;
}

TokenStream ReadIndexedDataset(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  std::error_code ec;
  if (!fs::exists(idx_path, ec) || !fs::exists(bin_path, ec)) {
    throw DataError("Megatron indexed dataset `" + prefix + "` needs both `" + idx_path +
                    "` and `" + bin_path + "`; " +
                    (fs::exists(idx_path, ec) ? bin_path : idx_path) + " is missing");
  }
  const std::string idx = ReadFile(idx_path);
  auto bin = std::make_shared<FileMap>(bin_path);
  const int64_t bin_size = static_cast<int64_t>(bin->size());
  IndexReader r(idx, idx_path);
  char magic[9];
  for (char& c : magic) c = r.Read<char>("the header");
  if (std::memcmp(magic, kIndexMagic, 9) != 0) {
    throw DataError("`" + idx_path +
                    "` is not a Megatron index file: it does not start with MMIDIDX");
  }
  const uint64_t version = r.Read<uint64_t>("the version");
  if (version != 1) {
    throw DataError("`" + idx_path + "` has index version " + std::to_string(version) +
                    "; only version 1 is supported");
  }
  const uint8_t code = r.Read<uint8_t>("the dtype code");
  const int64_t width = code == kRawUint32 ? 0 : DTypeSize(code);
  if (width == 0) {
    throw DataError("`" + idx_path + "` stores tokens with dtype code " + std::to_string(code) +
                    ", which is not an integer token type (codes 1-5 and 8)");
  }
  const uint64_t seq_count = r.Read<uint64_t>("the sequence count");
  const uint64_t doc_count = r.Read<uint64_t>("the document count");
  const uint64_t needed = seq_count * (4 + 8) + doc_count * 8;  // both counts <= idx.size()
  if (seq_count > idx.size() || doc_count > idx.size() || r.Pos() + needed > idx.size()) {
    throw DataError("`" + idx_path + "` is truncated: it declares " + std::to_string(seq_count) +
                    " sequences and " + std::to_string(doc_count) + " documents but has " +
                    std::to_string(idx.size()) + " bytes");
  }
  std::vector<int32_t> lengths(seq_count);
  std::vector<int64_t> pointers(seq_count);
  for (auto& l : lengths) l = r.Read<int32_t>("sequence lengths");
  for (auto& p : pointers) p = r.Read<int64_t>("sequence pointers");
  // Consecutive sequences that are also consecutive in the .bin (the usual layout) form one run.
  auto mt = std::make_shared<MappedTokens>();
  for (uint64_t i = 0; i < seq_count; ++i) {
    const int64_t begin = pointers[i], bytes = static_cast<int64_t>(lengths[i]) * width;
    const std::optional<int64_t> end = CheckedAdd(begin, bytes);  // a pointer near 2^63 wraps
    if (lengths[i] < 0 || begin < 0 || !end || *end > bin_size) {
      throw DataError("sequence " + std::to_string(i) + " of `" + idx_path + "` (" +
                      std::to_string(lengths[i]) + " tokens at byte " + std::to_string(begin) +
                      ") lies outside `" + bin_path + "` of " + std::to_string(bin_size) +
                      " bytes");
    }
    if (lengths[i] == 0) continue;
    const std::optional<int64_t> total =
        CheckedAdd(mt->size, lengths[i]);  // repeated pointers add up
    if (!total) {
      throw DataError("`" + idx_path + "` declares more than 2^63 tokens in all (sequence " +
                      std::to_string(i) + ")");
    }
    const char* data = bin->data() + begin;
    if (!mt->runs.empty()) {
      auto& last = mt->runs.back();
      if (last.data + last.count * width == data) {
        last.count += lengths[i];
        mt->size = *total;
        continue;
      }
    }
    mt->runs.push_back({mt->size, data, lengths[i], code});
    mt->size = *total;
  }
  mt->maps.push_back(std::move(bin));
  TokenStream s;
  s.mapped = std::move(mt);
  s.description = "Megatron indexed dataset `" + prefix + "` (" + std::to_string(seq_count) +
                  " sequences, " + std::to_string(s.Size()) + " tokens, memory-mapped)";
  return s;
}

void WriteIndexedDataset(const std::string& prefix,
                         const std::vector<std::vector<int32_t>>& sequences, bool uint16_tokens) {
  std::ofstream bin(prefix + ".bin", std::ios::binary), idx(prefix + ".idx", std::ios::binary);
  if (!bin || !idx) throw DataError("cannot write Megatron dataset `" + prefix + "`");
  const int64_t width = uint16_tokens ? 2 : 4;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  int64_t offset = 0;
  for (const auto& seq : sequences) {
    lengths.push_back(static_cast<int32_t>(seq.size()));
    pointers.push_back(offset);
    for (int32_t t : seq) {
      if (uint16_tokens) {
        uint16_t v = static_cast<uint16_t>(t);
        bin.write(reinterpret_cast<const char*>(&v), 2);
      } else {
        bin.write(reinterpret_cast<const char*>(&t), 4);
      }
    }
    offset += static_cast<int64_t>(seq.size()) * width;
  }
  auto put = [&](const auto& v) { idx.write(reinterpret_cast<const char*>(&v), sizeof v); };
  idx.write(kIndexMagic, 9);
  put(uint64_t{1});
  put(static_cast<uint8_t>(uint16_tokens ? 8 : 4));
  put(static_cast<uint64_t>(sequences.size()));
  put(static_cast<uint64_t>(sequences.size() + 1));
  for (int32_t l : lengths) put(l);
  for (int64_t p : pointers) put(p);
  for (uint64_t d = 0; d <= sequences.size(); ++d) put(static_cast<int64_t>(d));
}

std::vector<std::string> DataFiles(const std::string& path) {
  if (path.empty()) return {};
  std::vector<std::string> files = {path, path + ".bin", path + ".idx"};
  if (EndsWith(path, ".bin") || EndsWith(path, ".idx")) {
    const std::string prefix = path.substr(0, path.size() - 4);
    files.push_back(prefix + ".bin");
    files.push_back(prefix + ".idx");
  }
  return files;
}

TokenStream LoadTokens(const std::string& path, int64_t vocab) {
  if (path.empty()) throw DataError("no data path given");
  TokenStream s;
  std::error_code ec;
  if (EndsWith(path, ".bin") || EndsWith(path, ".idx")) {
    s = ReadIndexedDataset(path.substr(0, path.size() - 4));
  } else if (EndsWith(path, ".u16") || EndsWith(path, ".uint16")) {
    s = ReadRaw(path, 2);
  } else if (EndsWith(path, ".u32") || EndsWith(path, ".uint32")) {
    s = ReadRaw(path, 4);
  } else if (EndsWith(path, ".txt")) {
    s.tokens = EncodeBytes(ReadFile(path));
    s.description =
        "text `" + path + "` (" + std::to_string(s.tokens.size()) + " bytes, byte tokenizer)";
  } else if (fs::exists(path + ".idx", ec) || fs::exists(path + ".bin", ec)) {
    s = ReadIndexedDataset(path);
  } else {
    throw DataError("cannot tell the format of data `" + path +
                    "`: expected a Megatron prefix (PATH.bin + PATH.idx), a raw token file "
                    "(.u16, .u32) or a text file (.txt)");
  }
  s.path = path;
  s.vocab = vocab;
  if (s.Size() <= kEagerCheckTokens) {  // small enough to check every token now
    std::vector<int32_t> all(static_cast<size_t>(s.Size()));
    if (!all.empty()) s.Read(0, s.Size(), all.data());
    if (!s.mapped) s.vocab = 0;  // in-memory tokens are now known to be valid
  }
  return s;
}

Sampler::Sampler(const TokenStream& stream, BatchShape shape, uint64_t seed)
    : stream_(stream), shape_(shape), seed_(seed) {
  if (shape.seq_len <= 0 || shape.global_batch <= 0 || shape.micro_batch <= 0 ||
      shape.data_parallel <= 0) {
    throw DataError("batch shape needs positive sizes (seq_len " + std::to_string(shape.seq_len) +
                    ", global " + std::to_string(shape.global_batch) + ", micro " +
                    std::to_string(shape.micro_batch) + ", dp " +
                    std::to_string(shape.data_parallel) + ")");
  }
  int64_t per_step = 0, needed = 0;
  if (__builtin_mul_overflow(shape.micro_batch, shape.data_parallel, &per_step) ||
      __builtin_mul_overflow(shape.global_batch, shape.seq_len, &needed) || needed == INT64_MAX) {
    throw DataError("batch shape out of range (seq_len " + std::to_string(shape.seq_len) +
                    ", global " + std::to_string(shape.global_batch) + ", micro " +
                    std::to_string(shape.micro_batch) + ", dp " +
                    std::to_string(shape.data_parallel) +
                    "): a step would need more than 2^63 tokens");
  }
  if (shape.global_batch % per_step != 0) {
    throw DataError("global batch " + std::to_string(shape.global_batch) +
                    " is not a multiple of micro · dp = " + std::to_string(shape.micro_batch) +
                    " · " + std::to_string(shape.data_parallel));
  }
  const int64_t n = stream.Size();
  samples_ = n > 0 ? (n - 1) / shape.seq_len : 0;
  if (samples_ < shape.global_batch) {
    throw DataError("the data has " + std::to_string(n) + " tokens, " + std::to_string(samples_) +
                    " sequences of " + std::to_string(shape.seq_len) +
                    "+1 tokens: fewer than one "
                    "global batch of " +
                    std::to_string(shape.global_batch) + " sequences (needs at least " +
                    std::to_string(needed + 1) + " tokens)");
  }
}

namespace {

// A permutation of [0, n) that depends only on `key`, computed per index in O(1) memory: a
// four-round Feistel network on the smallest even-bit domain holding n, cycle-walked back into
// [0, n) (the domain is under 4n, so a walk takes under 4 rounds on average).
int64_t FeistelPermute(int64_t index, int64_t n, uint64_t key) {
  int half = 1;
  while ((int64_t{1} << (2 * half)) < n) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(index);
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = SplitMix64(key ^ (round << 56) ^ right) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = left << half | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

}  // namespace

int64_t Sampler::SampleOf(int64_t global_sequence) const {
  const int64_t epoch = global_sequence / samples_, index = global_sequence % samples_;
  // The epoch's permutation key, from the seed.
  const auto key = [&] {
    return SplitMix64(seed_ ^ SplitMix64(static_cast<uint64_t>(epoch) + 0x5eedull));
  };
  // Past 2^20 samples (8 MiB of order per rank) the order is computed per sequence instead of
  // held: a stream of any size then costs only what the steps read.
  if (samples_ > kShuffledInMemory) return FeistelPermute(index, samples_, key());
  if (epoch != cached_epoch_) {
    order_.resize(samples_);
    for (int64_t i = 0; i < samples_; ++i) order_[i] = i;
    uint64_t state = key();
    for (int64_t i = samples_ - 1; i > 0; --i) {  // Fisher-Yates with a defined generator
      state = SplitMix64(state);
      const int64_t j = static_cast<int64_t>(state % static_cast<uint64_t>(i + 1));
      std::swap(order_[i], order_[j]);
    }
    cached_epoch_ = epoch;
  }
  return order_[index];
}

void Sampler::Microbatch(int64_t step, int64_t dp_rank, int64_t micro, int32_t* inputs,
                         int32_t* targets) const {
  if (step < 0 || dp_rank < 0 || dp_rank >= shape_.data_parallel || micro < 0 ||
      micro >= MicrobatchesPerRank()) {
    throw DataError("no microbatch " + std::to_string(micro) + " of data-parallel rank " +
                    std::to_string(dp_rank) + " in step " + std::to_string(step) + ": a step has " +
                    std::to_string(MicrobatchesPerRank()) + " microbatches on each of " +
                    std::to_string(shape_.data_parallel) + " data-parallel ranks");
  }
  const int64_t per_rank = shape_.global_batch / shape_.data_parallel;
  int64_t first = 0;  // the step's first global sequence; the step's last one fits too
  if (__builtin_mul_overflow(step, shape_.global_batch, &first) ||
      first > INT64_MAX - shape_.global_batch) {
    throw DataError("step " + std::to_string(step) + " is out of range: its sequences (step · " +
                    std::to_string(shape_.global_batch) + " global batch) pass 2^63");
  }
  for (int64_t b = 0; b < shape_.micro_batch; ++b) {
    const int64_t g = first + dp_rank * per_rank + micro * shape_.micro_batch + b;
    const int64_t start = SampleOf(g) * shape_.seq_len;
    window_.resize(static_cast<size_t>(shape_.seq_len + 1));
    stream_.Read(start, shape_.seq_len + 1, window_.data());
    std::copy(window_.begin(), window_.end() - 1, inputs + b * shape_.seq_len);
    std::copy(window_.begin() + 1, window_.end(), targets + b * shape_.seq_len);
  }
}

}  // namespace paraplan::data
