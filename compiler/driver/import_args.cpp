#include "compiler/driver/import_args.h"

#include "compiler/interop/draft.h"

namespace paraplan {

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
      if (value.empty()) {
        *error = "--gpu needs a GPU name (h100, h200, h800, a100, a100_40gb)";
        return -1;
      }
      out->options.gpu = value;
    } else {
      auto v = interop::ParseInteger(value);
      if (!v || *v < 1 || *v > 1'000'000) {
        *error = n + " takes a count from 1 to 1000000, got '" + value + "'";
        return -1;
      }
      (n == "--nodes" ? out->options.nodes : out->options.gpus_per_node) = *v;
    }
    return 1;
  }
  return 0;
}

}  // namespace paraplan
