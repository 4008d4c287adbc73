// The byte-level tokenizer: token = byte value (0-255), plus specials after the bytes.
// Vocabulary 256 + kSpecialTokens; models round it up to their padded vocabulary.
//
// Made and read by: the data loader (text files, the bundled corpus), planrun's sample output.
#ifndef PARAPLAN_RUNTIME_DATA_BYTE_TOKENIZER_H_
#define PARAPLAN_RUNTIME_DATA_BYTE_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace paraplan::data {

constexpr int32_t kBosToken = 256;
constexpr int32_t kEosToken = 257;
constexpr int32_t kPadToken = 258;
constexpr int32_t kSpecialTokens = 3;
constexpr int32_t kByteVocab = 256 + kSpecialTokens;

std::vector<int32_t> EncodeBytes(const std::string& text);
// Specials render as <bos>, <eos>, <pad>; other ids outside the vocabulary as <?>.
std::string DecodeBytes(const std::vector<int32_t>& tokens);

}  // namespace paraplan::data

#endif  // PARAPLAN_RUNTIME_DATA_BYTE_TOKENIZER_H_
