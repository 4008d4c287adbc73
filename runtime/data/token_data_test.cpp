#include "runtime/data/token_data.h"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "runtime/data/byte_tokenizer.h"

using namespace paraplan::data;
namespace fs = std::filesystem;

namespace {

std::string TempPath(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("paraplan_data_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("Megatron indexed dataset round trip, uint16 and int32") {
  for (bool u16 : {true, false}) {
    const auto prefix = TempPath(u16 ? "ds16" : "ds32");
    WriteIndexedDataset(prefix, {{1, 2, 3}, {}, {40000, 5}}, u16);
    auto s = ReadIndexedDataset(prefix);
    CHECK(s.ToVector() == std::vector<int32_t>{1, 2, 3, 40000, 5});
    CHECK(s.description.find("3 sequences") != std::string::npos);
    // Named by .bin or .idx, or by prefix.
    CHECK(LoadTokens(prefix + ".bin", 50000).Size() == 5);
    CHECK(LoadTokens(prefix, 50000).Size() == 5);
  }
}

TEST_CASE("malformed, missing and out-of-vocabulary data is refused clearly") {
  const auto prefix = TempPath("bad");
  WriteIndexedDataset(prefix, {{1, 2, 3, 4}}, true);
  CHECK_THROWS_WITH_AS(LoadTokens(prefix, 3),
                       doctest::Contains("outside the model's vocabulary of 3"), DataError);
  // Truncated .bin: the sequence points past its end.
  WriteBytes(prefix + ".bin", std::string(3, '\0'));
  CHECK_THROWS_WITH_AS(ReadIndexedDataset(prefix), doctest::Contains("lies outside"), DataError);
  // Bad magic.
  WriteBytes(prefix + ".idx", "NOTANIDX-------------------");
  CHECK_THROWS_WITH_AS(ReadIndexedDataset(prefix), doctest::Contains("does not start with MMIDIDX"),
                       DataError);
  // Truncated .idx.
  WriteBytes(prefix + ".idx", std::string("MMIDIDX\0\0", 9) + std::string(3, '\1'));
  CHECK_THROWS_WITH_AS(ReadIndexedDataset(prefix), doctest::Contains("truncated"), DataError);
  // Missing half.
  fs::remove(prefix + ".bin");
  CHECK_THROWS_WITH_AS(ReadIndexedDataset(prefix), doctest::Contains(".bin is missing"), DataError);
  CHECK_THROWS_WITH_AS(LoadTokens(TempPath("nope.u16"), 10), doctest::Contains("does not exist"),
                       DataError);
  CHECK_THROWS_WITH_AS(LoadTokens(TempPath("what.xyz"), 10),
                       doctest::Contains("cannot tell the format"), DataError);
  WriteBytes(TempPath("odd.u16"), "abc");
  CHECK_THROWS_WITH_AS(LoadTokens(TempPath("odd.u16"), 1000),
                       doctest::Contains("not a multiple of 2"), DataError);
}

TEST_CASE("raw token files and text") {
  const auto p16 = TempPath("t.u16"), p32 = TempPath("t.u32"), txt = TempPath("t.txt");
  WriteBytes(p16, std::string("\x01\x00\x02\x01", 4));
  CHECK(LoadTokens(p16, 1000).ToVector() == std::vector<int32_t>{1, 258});
  WriteBytes(p32, std::string("\x07\x00\x00\x00", 4));
  CHECK(LoadTokens(p32, 1000).ToVector() == std::vector<int32_t>{7});
  WriteBytes(txt, "Hi!");
  CHECK(LoadTokens(txt, kByteVocab).ToVector() == std::vector<int32_t>{'H', 'i', '!'});
  CHECK(DecodeBytes({'o', 'k', kEosToken}) == "ok<eos>");
}

TEST_CASE("sampler: data-parallel slices of a step are the one-rank step's sequences") {
  TokenStream s;
  for (int i = 0; i < 1000; ++i) s.tokens.push_back(i % 97);
  const int64_t seq = 8, batch = 8;
  Sampler one(s, {seq, batch, 2, 1}, 42);
  Sampler two(s, {seq, batch, 2, 2}, 42);
  Sampler four(s, {seq, batch, 1, 4}, 42);
  CHECK(one.MicrobatchesPerRank() == 4);
  CHECK(two.MicrobatchesPerRank() == 2);
  for (int64_t step : {0, 5, 200}) {  // 200 steps wraps into later epochs
    std::vector<int32_t> a_in(batch * seq), a_tg(batch * seq), b_in(batch * seq), b_tg(batch * seq),
        c_in(batch * seq), c_tg(batch * seq);
    for (int m = 0; m < 4; ++m)
      one.Microbatch(step, 0, m, a_in.data() + int64_t{m} * 2 * seq,
                     a_tg.data() + int64_t{m} * 2 * seq);
    for (int d = 0; d < 2; ++d)
      for (int m = 0; m < 2; ++m)
        two.Microbatch(step, d, m, b_in.data() + (d * 4 + m * 2) * seq,
                       b_tg.data() + (d * 4 + m * 2) * seq);
    for (int d = 0; d < 4; ++d)
      for (int m = 0; m < 2; ++m)
        four.Microbatch(step, d, m, c_in.data() + (d * 2 + m) * seq,
                        c_tg.data() + (d * 2 + m) * seq);
    CHECK(a_in == b_in);
    CHECK(a_tg == b_tg);
    CHECK(a_in == c_in);
    for (int i = 0; i < batch * seq; ++i) CHECK(a_tg[i] == (a_in[i] + 1) % 97);
  }
  // Shuffled: the first step does not start at the start of the stream, and a different seed
  // gives a different order.
  std::vector<int32_t> x(2 * seq), y(2 * seq), x2(2 * seq);
  Sampler other(s, {seq, batch, 2, 1}, 7);
  one.Microbatch(0, 0, 0, x.data(), y.data());
  other.Microbatch(0, 0, 0, x2.data(), y.data());
  CHECK(x != x2);
}

TEST_CASE("sampler refuses short data and batch shapes that do not divide") {
  TokenStream s;
  s.tokens.assign(20, 1);
  CHECK_THROWS_WITH_AS(Sampler(s, {8, 4, 1, 1}, 1),
                       doctest::Contains("fewer than one global batch of 4"), DataError);
  CHECK_THROWS_WITH_AS(Sampler(s, {2, 6, 4, 1}, 1), doctest::Contains("not a multiple of micro"),
                       DataError);
}

TEST_CASE("mapped streams: non-contiguous sequences, reads across runs, lazy vocabulary checks") {
  const auto prefix = TempPath("runs");
  WriteIndexedDataset(prefix, {{1, 2}, {3}, {4, 5, 6}}, false);
  // Reverse the order of the sequences in the index (pointers no longer increase).
  {
    std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    const int64_t header = 9 + 8 + 1 + 8 + 8;
    int32_t lengths[3] = {3, 1, 2};
    int64_t pointers[3] = {12, 8, 0};
    idx.seekp(header);
    idx.write(reinterpret_cast<const char*>(lengths), sizeof lengths);
    idx.write(reinterpret_cast<const char*>(pointers), sizeof pointers);
  }
  const auto s = LoadTokens(prefix, 10);
  CHECK(s.ToVector() == std::vector<int32_t>{4, 5, 6, 3, 1, 2});
  int32_t window[4];
  s.Read(2, 4, window);
  CHECK(std::vector<int32_t>(window, window + 4) == std::vector<int32_t>{6, 3, 1, 2});
  CHECK_THROWS_WITH_AS(s.Read(4, 3, window), doctest::Contains("past the end"), DataError);
  // A token outside the vocabulary is reported when it is read (as large streams are checked).
  TokenStream lazy = s;
  lazy.vocab = 5;
  CHECK_NOTHROW(lazy.Read(3, 3, window));
  CHECK_THROWS_WITH_AS(lazy.Read(0, 2, window), doctest::Contains("token 5 at position 1"),
                       DataError);
}

TEST_CASE("a crafted index whose pointer lies near 2^63 is refused, not followed") {
  const auto prefix = TempPath("crafted");
  WriteIndexedDataset(prefix, {{1, 2, 3}}, false);
  for (int64_t pointer : {INT64_MAX - 4, INT64_MAX - 11, int64_t{1} << 62, INT64_MIN}) {
    std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    const int64_t header = 9 + 8 + 1 + 8 + 8;
    idx.seekp(header + 4);  // one int32 length, then the pointer
    idx.write(reinterpret_cast<const char*>(&pointer), sizeof pointer);
    idx.close();
    CHECK_THROWS_WITH_AS(LoadTokens(prefix, 10), doctest::Contains("lies outside"), DataError);
  }
}

TEST_CASE("FIFOs, devices and directories are refused as data without blocking or reading") {
  const auto fifo = TempPath("fifo.u16");
  fs::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(LoadTokens(fifo, 10), doctest::Contains("a FIFO"), DataError);
  const auto text_fifo = TempPath("fifo.txt");
  fs::remove(text_fifo);
  REQUIRE(mkfifo(text_fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(LoadTokens(text_fifo, 300), doctest::Contains("a FIFO"), DataError);
  // A Megatron prefix whose .idx is a FIFO and whose .bin is /dev/zero.
  const auto prefix = TempPath("special");
  fs::remove(prefix + ".idx");
  fs::remove(prefix + ".bin");
  REQUIRE(mkfifo((prefix + ".idx").c_str(), 0600) == 0);
  fs::create_symlink("/dev/zero", prefix + ".bin");
  CHECK_THROWS_WITH_AS(LoadTokens(prefix, 10), doctest::Contains("a FIFO"), DataError);
  fs::remove(prefix + ".idx");
  WriteIndexedDataset(TempPath("plain"), {{1, 2}}, true);
  fs::copy_file(TempPath("plain") + ".idx", prefix + ".idx");
  CHECK_THROWS_WITH_AS(LoadTokens(prefix, 10), doctest::Contains("a character device"), DataError);
  if (fs::exists("/dev/zero")) {
    fs::remove(TempPath("zero.u16"));
    fs::create_symlink("/dev/zero", TempPath("zero.u16"));
    CHECK_THROWS_WITH_AS(LoadTokens(TempPath("zero.u16"), 10),
                         doctest::Contains("a character device"), DataError);
  }
}

TEST_CASE("sampler: past 2^20 samples the epoch order is computed, still a permutation") {
  TokenStream s;
  const int64_t samples = Sampler::kShuffledInMemory + 3;  // seq_len 1: one token per sample
  s.tokens.resize(static_cast<size_t>(samples + 1));
  for (size_t i = 0; i < s.tokens.size(); ++i) s.tokens[i] = static_cast<int32_t>(i);
  Sampler sampler(s, {1, 1, 1, 1}, 42);
  REQUIRE(sampler.Samples() == samples);
  std::vector<char> seen(static_cast<size_t>(samples), 0);
  int64_t in_place = 0, outside = 0;
  std::vector<int32_t> first_epoch(64);
  for (int64_t step = 0; step < samples; ++step) {
    int32_t input = -1, target = -1;
    sampler.Microbatch(step, 0, 0, &input, &target);
    if (input < 0 || input >= samples || target != input + 1) {
      ++outside;
      continue;
    }
    seen[static_cast<size_t>(input)] += 1;
    in_place += input == step;
    if (step < 64) first_epoch[static_cast<size_t>(step)] = input;
  }
  CHECK(outside == 0);
  CHECK(std::count(seen.begin(), seen.end(), 1) == samples);  // every sample once
  CHECK(in_place < 16);                                       // shuffled, not the identity
  // The next epoch has another order; the same seed gives the same one.
  int differs = 0;
  Sampler again(s, {1, 1, 1, 1}, 42);
  for (int64_t i = 0; i < 64; ++i) {
    int32_t input = -1, target = -1, replay = -1;
    sampler.Microbatch(samples + i, 0, 0, &input, &target);
    differs += input != first_epoch[static_cast<size_t>(i)];
    again.Microbatch(i, 0, 0, &replay, &target);
    CHECK(replay == first_epoch[static_cast<size_t>(i)]);
  }
  CHECK(differs > 48);
}

TEST_CASE("sampler: a step whose sequence number passes 2^63 is refused, not wrapped") {
  TokenStream s;
  s.tokens.assign(100, 1);
  Sampler sampler(s, {4, 8, 2, 1}, 1);
  std::vector<int32_t> in(8), tg(8);
  CHECK_THROWS_WITH_AS(sampler.Microbatch(int64_t{1} << 62, 0, 0, in.data(), tg.data()),
                       doctest::Contains("is out of range: its sequences"), DataError);
  CHECK_NOTHROW(sampler.Microbatch((int64_t{1} << 59) - 1, 0, 0, in.data(), tg.data()));
}
