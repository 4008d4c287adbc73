#include "compiler/driver/import_args.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace paraplan {
namespace {

constexpr int64_t kMaxCount = 1'000'000;

// A count as written on a command line: decimal digits without a sign, blank or leading zero
// (`08`, `+8`, ` 8` and `0x8` are refused rather than read some other way); nullopt otherwise or
// past kMaxCount.
std::optional<int64_t> ParseCount(std::string_view text) {
  if (text.empty() || text[0] < '1' || text[0] > '9') return std::nullopt;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v > kMaxCount) return std::nullopt;
  return v;
}

}  // namespace

int TakeImportArg(const std::vector<std::string>& args, size_t& i, ImportArgs* out,
                  std::string* error) {
  const std::string& a = args[i];
  for (const char* name : {"--from", "--nodes", "--gpus-per-node", "--gpu"}) {
    const std::string n = name;
    std::string value;
    if (a == n) {
      if (i + 1 >= args.size()) {
        *error = n + " needs a value";
        return -1;
      }
      value = args[++i];
    } else if (a.rfind(n + "=", 0) == 0) {
      value = a.substr(n.size() + 1);
    } else {
      continue;
    }
    if (n == "--from") {
      out->kind = ParseConfigKind(value);
      if (!out->kind) {
        *error = "--from takes megatron, torchtitan, deepspeed or nemo, got '" + value + "'";
        return -1;
      }
    } else if (n == "--gpu") {
      // Any case (`H100` as nvidia-smi writes it), otherwise exactly a name of the list.
      std::string lower = value;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      const std::span<const std::string_view> names = ImportGpuNames();
      if (std::find(names.begin(), names.end(), lower) == names.end()) {
        *error = "--gpu takes " + ImportGpuNamesText() + ", got '" + value + "'";
        return -1;
      }
      out->options.gpu = lower;
    } else {
      auto v = ParseCount(value);
      if (!v) {
        *error = n + " takes a count from 1 to " + std::to_string(kMaxCount) +
                 " in decimal digits, got '" + value + "'";
        return -1;
      }
      (n == "--nodes" ? out->options.nodes : out->options.gpus_per_node) = *v;
    }
    return 1;
  }
  return 0;
}

}  // namespace paraplan
