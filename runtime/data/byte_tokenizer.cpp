#include "runtime/data/byte_tokenizer.h"

namespace paraplan::data {

std::vector<int32_t> EncodeBytes(const std::string& text) {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(static_cast<int32_t>(c));
  return out;
}

std::string DecodeBytes(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256)
      out.push_back(static_cast<char>(t));
    else if (t == kBosToken)
      out += "<bos>";
    else if (t == kEosToken)
      out += "<eos>";
    else if (t == kPadToken)
      out += "<pad>";
    else
      out += "<?>";
  }
  return out;
}

}  // namespace paraplan::data
