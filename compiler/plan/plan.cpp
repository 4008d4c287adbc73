#include "compiler/plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <deque>
#include <unordered_map>

#include "compiler/base/checked.h"

namespace paraplan {
namespace {

// How one field is stored in a Plan. Exactly one accessor is set, matching FieldInfo::type.
struct FieldAccess {
  int64_t* (*int_ref)(Plan&) = nullptr;
  std::optional<int64_t>* (*opt_int_ref)(Plan&) = nullptr;
  double* (*real_ref)(Plan&) = nullptr;
  bool* (*bool_ref)(Plan&) = nullptr;
  std::string* (*string_ref)(Plan&) = nullptr;
  std::vector<int64_t>* (*list_ref)(Plan&) = nullptr;
  // Enums: read and write the spelling's index in FieldInfo::enum_values.
  int (*enum_get)(const Plan&) = nullptr;
  void (*enum_set)(Plan&, int) = nullptr;
};

struct FieldTable {
  std::vector<FieldInfo> infos;
  std::vector<FieldAccess> access;
  std::unordered_map<std::string_view, uint16_t> by_path;
};

FieldInfo RealRange(FieldInfo f, double lo, bool lo_open, double hi, bool hi_open) {
  f.real_min = lo;
  f.real_min_open = lo_open;
  f.real_max = hi;
  f.real_max_open = hi_open;
  return f;
}
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr int64_t kMin = INT64_MIN;
constexpr int64_t kMax = INT64_MAX;

#define PP_INT(PATH, MEMBER, LO, HI, DOC)       \
  add({PATH, FieldType::kInt, {}, DOC, LO, HI}, \
      {.int_ref = [](Plan& p) -> int64_t* { return &p.MEMBER; }})
#define PP_BYTES(PATH, MEMBER, LO, DOC)             \
  add({PATH, FieldType::kBytes, {}, DOC, LO, kMax}, \
      {.int_ref = [](Plan& p) -> int64_t* { return &p.MEMBER; }})
#define PP_OPT_INT(PATH, MEMBER, LO, DOC)               \
  add({PATH, FieldType::kInt, {}, DOC, LO, kMax, true}, \
      {.opt_int_ref = [](Plan& p) -> std::optional<int64_t>* { return &p.MEMBER; }})
#define PP_REAL(PATH, TYPE, MEMBER, DOC) \
  add({PATH, TYPE, {}, DOC}, {.real_ref = [](Plan& p) -> double* { return &p.MEMBER; }})
#define PP_REAL_IN(PATH, TYPE, MEMBER, LO, LO_OPEN, HI, HI_OPEN, DOC) \
  add(RealRange({PATH, TYPE, {}, DOC}, LO, LO_OPEN, HI, HI_OPEN),     \
      {.real_ref = [](Plan& p) -> double* { return &p.MEMBER; }})
#define PP_BOOL(PATH, MEMBER, DOC) \
  add({PATH, FieldType::kBool, {}, DOC}, {.bool_ref = [](Plan& p) -> bool* { return &p.MEMBER; }})
#define PP_STRING(PATH, MEMBER, DOC)       \
  add({PATH, FieldType::kString, {}, DOC}, \
      {.string_ref = [](Plan& p) -> std::string* { return &p.MEMBER; }})
#define PP_LIST(PATH, MEMBER, LO, DOC)                \
  add({PATH, FieldType::kIntList, {}, DOC, LO, kMax}, \
      {.list_ref = [](Plan& p) -> std::vector<int64_t>* { return &p.MEMBER; }})
#define PP_ENUM(PATH, ENUM, MEMBER, VALUES, DOC)                             \
  add({PATH, FieldType::kEnum, VALUES, DOC},                                 \
      {.enum_get = [](const Plan& p) { return static_cast<int>(p.MEMBER); }, \
       .enum_set = [](Plan& p, int v) { p.MEMBER = static_cast<ENUM>(v); }})

FieldTable BuildTable() {
  FieldTable t;
  auto add = [&t](FieldInfo info, FieldAccess access) {
    info.index = static_cast<uint16_t>(t.infos.size());
    t.infos.push_back(std::move(info));
    t.access.push_back(access);
  };
  // model
  // At most 100,000 layers (published models have a few hundred): the partition and the
  // programs hold per-layer data, and 10^9 layers would take minutes and gigabytes to refuse.
  PP_INT("model.layers", model.layers, 1, 100000, "transformer layers");
  PP_INT("model.hidden", model.hidden, 1, kMax, "hidden size");
  PP_INT("model.ffn_hidden", model.ffn_hidden, 1, kMax, "dense MLP intermediate size");
  PP_INT("model.heads", model.heads, 1, kMax, "attention (query) heads");
  PP_INT("model.kv_heads", model.kv_heads, 1, kMax, "key/value heads (== heads without GQA)");
  PP_INT("model.head_dim", model.head_dim, 1, kMax,
         "size of one head (hidden / heads unless given)");
  PP_INT("model.vocab", model.vocab, 1, kMax, "vocabulary size");
  PP_INT("model.seq_len", model.seq_len, 1, kMax, "sequence length in tokens");
  PP_ENUM("model.norm", Norm, model.norm, (std::vector<std::string_view>{"rmsnorm", "layernorm"}),
          "normalisation layer");
  PP_ENUM("model.activation", Activation, model.activation,
          (std::vector<std::string_view>{"swiglu", "gelu", "squared_relu"}), "MLP activation");
  PP_ENUM("model.position", Position, model.position,
          (std::vector<std::string_view>{"rope", "learned"}), "position encoding");
  PP_BOOL("model.tied_embeddings", model.tied_embeddings, "input and output embeddings shared");
  PP_INT("model.vocab_divisor", model.vocab_divisor, 1, kMax,
         "the vocabulary is padded to a multiple of this times tp (1 = no padding)");
  PP_BOOL("model.qk_norm", model.qk_norm, "RMSNorm on queries and keys");
  PP_INT("model.window", model.window, 0, kMax,
         "sliding-window attention span (0 = full attention)");
  PP_INT("model.mtp_layers", model.mtp_layers, 0, kMax, "multi-token-prediction modules");
  PP_INT("model.experts", model.experts, 0, kMax, "routed experts per MoE layer (0 = dense)");
  PP_INT("model.topk", model.topk, 0, kMax, "experts each token is routed to");
  PP_INT("model.moe_ffn_hidden", model.moe_ffn_hidden, 0, kMax, "intermediate size of one expert");
  PP_INT("model.shared_experts", model.shared_experts, 0, kMax, "always-active shared experts");
  PP_INT("model.dense_layers", model.dense_layers, 0, kMax,
         "leading dense layers before MoE layers");
  PP_INT("model.moe_layer_freq", model.moe_layer_freq, 1, kMax,
         "after the dense layers, every n-th layer is MoE (1 = all)");
  PP_INT("model.q_lora_rank", model.q_lora_rank, 0, kMax, "MLA query compression rank (0 = none)");
  PP_INT("model.kv_lora_rank", model.kv_lora_rank, 0, kMax,
         "MLA key/value compression rank (0 = no MLA)");
  PP_INT("model.qk_nope_head_dim", model.qk_nope_head_dim, 0, kMax,
         "MLA per-head q/k size without RoPE");
  PP_INT("model.qk_rope_head_dim", model.qk_rope_head_dim, 0, kMax,
         "MLA per-head q/k size with RoPE");
  PP_INT("model.v_head_dim", model.v_head_dim, 0, kMax, "MLA per-head value size");
  // cluster
  PP_BYTES("cluster.gpu.memory", cluster.gpu.memory, 1, "device memory in bytes");
  PP_REAL_IN("cluster.gpu.peak_bf16", FieldType::kFlops, cluster.gpu.peak_bf16, 0, true, kInf,
             false, "dense bf16 peak, FLOP/s");
  PP_REAL_IN("cluster.gpu.peak_fp16", FieldType::kFlops, cluster.gpu.peak_fp16, 0, true, kInf,
             false, "dense fp16 peak, FLOP/s");
  PP_REAL_IN("cluster.gpu.peak_fp8", FieldType::kFlops, cluster.gpu.peak_fp8, 0, false, kInf, false,
             "dense fp8 peak, FLOP/s (0 = no fp8)");
  PP_REAL_IN("cluster.gpu.hbm_bandwidth", FieldType::kBandwidth, cluster.gpu.hbm_bandwidth, 0, true,
             kInf, false, "device memory bandwidth, bytes/s");
  PP_INT("cluster.nodes", cluster.nodes, 1, kMax, "nodes");
  PP_INT("cluster.gpus_per_node", cluster.gpus_per_node, 1, kMax,
         "GPUs per node (the NVLink domain)");
  PP_REAL_IN("cluster.nvlink_bandwidth", FieldType::kBandwidth, cluster.nvlink_bandwidth, 0, true,
             kInf, false, "NVLink bandwidth per GPU, one direction, bytes/s");
  PP_REAL_IN("cluster.network_bandwidth", FieldType::kBandwidth, cluster.network_bandwidth, 0, true,
             kInf, false, "network bandwidth per GPU, one direction, bytes/s");
  // plan
  PP_ENUM("precision", Precision, precision,
          (std::vector<std::string_view>{"bf16", "fp16", "fp32", "fp8"}), "training precision");
  PP_ENUM("recompute", Recompute, recompute,
          (std::vector<std::string_view>{"none", "selective", "full"}), "activation recomputation");
  PP_ENUM("framework", Framework, framework,
          (std::vector<std::string_view>{"paraplan", "megatron_core", "torchtitan", "deepspeed",
                                         "llm_foundry", "megatron_lm_2021"}),
          "the software that runs the plan");
  // mixed_precision
  PP_ENUM("mixed_precision.params", ElementType, mixed_precision.params,
          (std::vector<std::string_view>{"fp32", "bf16", "fp16"}), "weights the GEMMs read");
  PP_ENUM("mixed_precision.grads", ElementType, mixed_precision.grads,
          (std::vector<std::string_view>{"fp32", "bf16", "fp16"}),
          "main gradients and their reduction");
  PP_BOOL("mixed_precision.main_params", mixed_precision.main_params,
          "fp32 master weights in the optimizer");
  PP_ENUM("mixed_precision.optimizer_state", ElementType, mixed_precision.optimizer_state,
          (std::vector<std::string_view>{"fp32", "bf16", "fp16", "fp8"}), "Adam moments");
  PP_ENUM("mixed_precision.fp8", Fp8Recipe, mixed_precision.fp8,
          (std::vector<std::string_view>{"none", "delayed", "current", "blockwise", "mxfp8"}),
          "FP8 scaling recipe of the GEMMs (none = no FP8)");
  PP_BOOL("mixed_precision.fp8_params", mixed_precision.fp8_params, "weights kept only in FP8");
  // activations
  PP_ENUM("activations.recompute_method", RecomputeMethod, activations.recompute_method,
          (std::vector<std::string_view>{"uniform", "block"}),
          "which layers full recompute covers");
  PP_INT("activations.recompute_layers", activations.recompute_layers, 0, kMax,
         "layers per recompute group (uniform) or recomputed per chunk (block); 0 = all");
  PP_STRING("activations.recompute_modules", activations.recompute_modules,
            "modules selective recompute covers (\"core_attn, mlp\"; empty = core_attn)");
  PP_INT("activations.offload_layers", activations.offload_layers, 0, kMax,
         "layers per stage whose activations are offloaded to host memory");
  // fsdp
  PP_INT("fsdp.shard", fsdp.shard, 0, kMax,
         "ranks that shard model states (0 = dp·cp / replicate)");
  PP_INT("fsdp.replicate", fsdp.replicate, 1, kMax, "replicas of each shard group (HSDP when > 1)");
  PP_BOOL("fsdp.reshard_after_forward", fsdp.reshard_after_forward,
          "ZeRO-3: free gathered weights after each forward");
  // moe
  PP_ENUM("moe.dispatcher", Dispatcher, moe.dispatcher,
          (std::vector<std::string_view>{"alltoall", "allgather", "flex"}), "token dispatcher");
  PP_REAL_IN("moe.capacity_factor", FieldType::kReal, moe.capacity_factor, 0, false, kInf, false,
             "expert capacity over the balanced load (0 = no token dropping)");
  PP_REAL_IN("moe.imbalance", FieldType::kReal, moe.imbalance, 1, false, kInf, false,
             "worst-rank routed tokens over the average");
  // parallel
  PP_INT("parallel.tp", parallel.tp, 1, kMax, "tensor parallel size");
  PP_INT("parallel.pp", parallel.pp, 1, kMax, "pipeline parallel size");
  PP_INT("parallel.vpp", parallel.vpp, 1, kMax, "virtual pipeline chunks per pipeline rank");
  PP_INT("parallel.cp", parallel.cp, 1, kMax, "context parallel size");
  PP_INT("parallel.ep", parallel.ep, 1, kMax, "expert parallel size");
  PP_INT("parallel.etp", parallel.etp, 1, kMax, "expert tensor parallel size (defaults to tp)");
  PP_INT("parallel.dp", parallel.dp, 1, kMax, "data parallel size (world / (tp·pp·cp))");
  PP_BOOL("parallel.sp", parallel.sp, "sequence parallel (needs tp > 1)");
  PP_BOOL("parallel.tp_comm_overlap", parallel.tp_comm_overlap,
          "overlap the tensor-parallel collectives with the GEMMs (needs tp > 1 and sp)");
  PP_STRING("parallel.order", parallel.order, "rank order of the mesh axes, innermost first");
  // pipeline
  PP_ENUM("pipeline.schedule", Schedule, pipeline.schedule,
          (std::vector<std::string_view>{"gpipe", "1f1b", "interleaved_1f1b"}),
          "pipeline schedule");
  PP_BOOL("pipeline.account_for_embedding", pipeline.account_for_embedding,
          "count the embedding as a layer of the first stage");
  PP_BOOL("pipeline.account_for_loss", pipeline.account_for_loss,
          "count the loss as a layer of the last stage");
  PP_OPT_INT("pipeline.first_stage_layers", pipeline.first_stage_layers, 0,
             "layers on the first pipeline stage");
  PP_OPT_INT("pipeline.last_stage_layers", pipeline.last_stage_layers, 0,
             "layers on the last pipeline stage");
  PP_LIST("pipeline.stage_layers", pipeline.stage_layers, 0, "explicit layers per stage");
  PP_ENUM("pipeline.balance", Balance, pipeline.balance,
          (std::vector<std::string_view>{"even", "cost", "nanotron"}),
          "how layers are split over stages");
  // optimizer
  PP_ENUM("optimizer.type", OptimizerType, optimizer.type,
          (std::vector<std::string_view>{"adamw", "sgd"}), "optimizer");
  PP_INT("optimizer.zero", optimizer.zero, 0, 3, "ZeRO stage (1 = distributed optimizer)");
  PP_ENUM("optimizer.offload", Offload, optimizer.offload,
          (std::vector<std::string_view>{"none", "cpu"}), "optimizer state offload");
  PP_REAL_IN("optimizer.offload_fraction", FieldType::kReal, optimizer.offload_fraction, 0, false,
             1, false, "share of the optimizer state on the host when offload = cpu");
  PP_REAL_IN("optimizer.lr", FieldType::kReal, optimizer.lr, 0, false, kInf, false,
             "peak learning rate");
  PP_REAL_IN("optimizer.min_lr", FieldType::kReal, optimizer.min_lr, 0, false, kInf, false,
             "floor of the cosine decay");
  PP_INT("optimizer.warmup_steps", optimizer.warmup_steps, 0, kMax, "linear warmup steps");
  PP_REAL_IN("optimizer.weight_decay", FieldType::kReal, optimizer.weight_decay, 0, false, kInf,
             false, "decoupled weight decay");
  PP_REAL_IN("optimizer.beta1", FieldType::kReal, optimizer.beta1, 0, false, 1, true, "Adam beta1");
  PP_REAL_IN("optimizer.beta2", FieldType::kReal, optimizer.beta2, 0, false, 1, true, "Adam beta2");
  PP_REAL_IN("optimizer.eps", FieldType::kReal, optimizer.eps, 0, true, kInf, false,
             "Adam epsilon");
  PP_REAL_IN("optimizer.clip_grad", FieldType::kReal, optimizer.clip_grad, 0, false, kInf, false,
             "global-norm clipping (0 = off)");
  // batch
  PP_INT("batch.global", batch.global, 1, kMax, "sequences per step");
  PP_INT("batch.micro", batch.micro, 1, kMax, "sequences per microbatch");
  // train
  PP_INT("train.steps", train.steps, 0, kMax, "optimizer steps");
  PP_INT("train.seed", train.seed, 0, kMax, "random seed");
  PP_STRING("train.data", train.data, "token data path (empty = bundled text)");
  PP_STRING("train.checkpoint_dir", train.checkpoint_dir, "checkpoint directory (empty = none)");
  PP_INT("train.checkpoint_every", train.checkpoint_every, 0, kMax,
         "steps between checkpoints (0 = never)");
  for (const FieldInfo& f : t.infos) t.by_path.emplace(f.path, f.index);
  return t;
}

#undef PP_INT
#undef PP_BYTES
#undef PP_OPT_INT
#undef PP_REAL
#undef PP_REAL_IN
#undef PP_BOOL
#undef PP_STRING
#undef PP_LIST
#undef PP_ENUM

const FieldTable& Table() {
  static const FieldTable table = BuildTable();
  return table;
}

const FieldAccess& AccessOf(const FieldInfo& f) { return Table().access[f.index]; }

std::string_view TypeWord(FieldType t) {
  switch (t) {
    case FieldType::kInt:
      return "an integer";
    case FieldType::kReal:
      return "a number";
    case FieldType::kBool:
      return "a boolean";
    case FieldType::kString:
      return "a string";
    case FieldType::kEnum:
      return "one of its names";
    case FieldType::kIntList:
      return "a list of integers";
    case FieldType::kBytes:
      return "a size in bytes";
    case FieldType::kBandwidth:
      return "a bandwidth";
    case FieldType::kFlops:
      return "a compute rate";
  }
  return "a value";
}

std::string_view ValueWord(const FieldValue& v) {
  switch (v.index()) {
    case 0:
      return "an integer";
    case 1:
      return "a real number";
    case 2:
      return "a boolean";
    default:
      return "a string";
  }
}

std::string EnumChoices(const FieldInfo& f) {
  std::string out;
  for (size_t i = 0; i < f.enum_values.size(); ++i) {
    if (i) out += i + 1 == f.enum_values.size() ? " or " : ", ";
    out += fmt::format("`{}`", f.enum_values[i]);
  }
  return out;
}

std::string CheckRange(const FieldInfo& f, int64_t v) {
  if (v < f.min) return fmt::format("must be at least {}, got {}", f.min, v);
  if (v > f.max) return fmt::format("must be at most {}, got {}", f.max, v);
  return {};
}

std::string FormatReal(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e18) {
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{}", v);
}

std::string FormatList(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += fmt::format("{}", v[i]);
  }
  return out + "]";
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<double> ParseReal(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

// "80 GiB", "80GiB", "4": the number and the unit (empty when none).
void SplitUnit(std::string_view text, std::string_view* number, std::string_view* unit) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == '+' || text[i] == '-' ||
                             ((text[i] == 'e' || text[i] == 'E') && i > 0 && i + 1 < text.size() &&
                              (std::isdigit(static_cast<unsigned char>(text[i + 1])) ||
                               text[i + 1] == '-' || text[i + 1] == '+')))) {
    ++i;
  }
  *number = Trim(text.substr(0, i));
  *unit = Trim(text.substr(i));
}

UnitDimension DimensionOf(FieldType t) {
  switch (t) {
    case FieldType::kBandwidth:
      return UnitDimension::kBandwidth;
    case FieldType::kFlops:
      return UnitDimension::kFlops;
    default:
      return UnitDimension::kBytes;
  }
}

}  // namespace

// --- Units -----------------------------------------------------------------------------------

const std::vector<UnitInfo>& AllUnits() {
  static const std::vector<UnitInfo> units = [] {
    std::vector<UnitInfo> u;
    using D = UnitDimension;
    const std::pair<std::string_view, double> decimal[] = {{"", 1},    {"K", 1e3},  {"M", 1e6},
                                                           {"G", 1e9}, {"T", 1e12}, {"P", 1e15}};
    const std::pair<std::string_view, double> binary[] = {{"Ki", 1024.0},
                                                          {"Mi", 1048576.0},
                                                          {"Gi", 1073741824.0},
                                                          {"Ti", 1099511627776.0},
                                                          {"Pi", 1125899906842624.0}};
    static std::deque<std::string> names;  // owns the spellings; a deque never moves them
    auto add = [&](std::string name, D d, double scale) {
      names.push_back(std::move(name));
      u.push_back({names.back(), d, scale});
    };
    for (auto [p, s] : decimal) add(fmt::format("{}B", p), D::kBytes, s);
    for (auto [p, s] : binary) add(fmt::format("{}B", p), D::kBytes, s);
    for (auto [p, s] : decimal) add(fmt::format("{}B/s", p), D::kBandwidth, s);
    for (auto [p, s] : binary) add(fmt::format("{}B/s", p), D::kBandwidth, s);
    for (auto [p, s] : decimal) {
      if (!p.empty()) add(fmt::format("{}b/s", p), D::kBandwidth, s / 8);
    }
    for (auto [p, s] : decimal) add(fmt::format("{}FLOPS", p), D::kFlops, s);
    add("s", D::kTime, 1);
    add("ms", D::kTime, 1e-3);
    add("us", D::kTime, 1e-6);
    add("ns", D::kTime, 1e-9);
    return u;
  }();
  return units;
}

const UnitInfo* FindUnit(std::string_view name) {
  for (const UnitInfo& u : AllUnits()) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

std::string_view ToString(UnitDimension d) {
  switch (d) {
    case UnitDimension::kBytes:
      return "bytes";
    case UnitDimension::kBandwidth:
      return "bandwidth";
    case UnitDimension::kFlops:
      return "compute";
    case UnitDimension::kTime:
      return "time";
  }
  return "?";
}

std::string_view ToString(OriginKind k) {
  switch (k) {
    case OriginKind::kDefault:
      return "default";
    case OriginKind::kFile:
      return "file";
    case OriginKind::kStdlib:
      return "stdlib";
    case OriginKind::kCommandLine:
      return "command line";
    case OriginKind::kAuto:
      return "auto";
    case OriginKind::kDerived:
      return "derived";
  }
  return "?";
}

// --- Plan ------------------------------------------------------------------------------------

int64_t Plan::Edp() const {
  auto denom = CheckedProduct({parallel.etp, parallel.ep, parallel.pp});
  int64_t world = 0;
  if (auto w = CheckedMul(cluster.nodes, cluster.gpus_per_node)) world = *w;
  if (!denom || *denom <= 0 || world <= 0 || world % *denom != 0) return 0;
  return world / *denom;
}

int64_t Plan::Microbatches() const {
  auto denom = CheckedMul(batch.micro, parallel.dp);
  if (!denom || *denom <= 0 || batch.global % *denom != 0) return 0;
  return batch.global / *denom;
}

const FieldOrigin& Plan::Origin(std::string_view path) const {
  static const FieldOrigin kNone;
  const FieldOrigin* o = origins.Find(path);
  return o ? *o : kNone;
}

// --- PlanOrigins -----------------------------------------------------------------------------

namespace {

constexpr std::string_view kRecordPaths[] = {"model", "cluster", "cluster.gpu"};

// The slot of a path: a field's index, then the record paths; -1 for anything else.
int OriginSlot(std::string_view path) {
  if (const FieldInfo* f = FindPlanField(path)) return f->index;
  for (size_t i = 0; i < std::size(kRecordPaths); ++i) {
    if (path == kRecordPaths[i]) return static_cast<int>(PlanFields().size() + i);
  }
  return -1;
}

}  // namespace

FieldOrigin& PlanOrigins::Slot(size_t index) {
  if (slots_.empty()) {
    slots_.resize(PlanFields().size() + std::size(kRecordPaths));
    recorded_.resize(slots_.size());
  }
  recorded_[index] = true;
  return slots_[index];
}

FieldOrigin& PlanOrigins::operator[](const FieldInfo& field) { return Slot(field.index); }

FieldOrigin& PlanOrigins::operator[](std::string_view path) {
  int slot = OriginSlot(path);
  if (slot < 0) {
    auto it = other_.find(path);
    if (it == other_.end()) it = other_.emplace(std::string(path), FieldOrigin{}).first;
    return it->second;
  }
  return Slot(static_cast<size_t>(slot));
}

const FieldOrigin* PlanOrigins::Find(std::string_view path) const {
  int slot = OriginSlot(path);
  if (slot < 0) {
    auto it = other_.find(path);
    return it == other_.end() ? nullptr : &it->second;
  }
  if (slots_.empty() || !recorded_[static_cast<size_t>(slot)]) return nullptr;
  return &slots_[static_cast<size_t>(slot)];
}

size_t PlanOrigins::size() const {
  size_t n = other_.size();
  for (bool r : recorded_) n += r;
  return n;
}

// --- Field access ----------------------------------------------------------------------------

const std::vector<FieldInfo>& PlanFields() { return Table().infos; }

const FieldInfo* FindPlanField(std::string_view path) {
  const FieldTable& t = Table();
  auto it = t.by_path.find(path);
  return it == t.by_path.end() ? nullptr : &t.infos[it->second];
}

bool IsRecordPath(std::string_view path) {
  return path == "model" || path == "cluster" || path == "cluster.gpu";
}

FieldValue GetFieldValue(const Plan& plan, const FieldInfo& f) {
  const FieldAccess& a = AccessOf(f);
  Plan& p = const_cast<Plan&>(plan);  // accessors only read here
  if (a.int_ref) return *a.int_ref(p);
  if (a.opt_int_ref) {
    const auto& v = *a.opt_int_ref(p);
    return v ? FieldValue(*v) : FieldValue(std::string("none"));
  }
  if (a.real_ref) return *a.real_ref(p);
  if (a.bool_ref) return *a.bool_ref(p);
  if (a.string_ref) return *a.string_ref(p);
  if (a.list_ref) return FormatList(*a.list_ref(p));
  int i = a.enum_get(plan);
  if (i < 0 || static_cast<size_t>(i) >= f.enum_values.size()) return std::string("?");
  return std::string(f.enum_values[i]);
}

std::string SetFieldValue(Plan& plan, const FieldInfo& f, const FieldValue& value) {
  const FieldAccess& a = AccessOf(f);
  if (a.int_ref || a.opt_int_ref) {
    int64_t v;
    if (const int64_t* i = std::get_if<int64_t>(&value)) {
      v = *i;
    } else if (const double* d = std::get_if<double>(&value);
               d && std::isfinite(*d) && *d == std::floor(*d) && std::fabs(*d) < 9.2e18) {
      v = static_cast<int64_t>(*d);
    } else if (const double* d = std::get_if<double>(&value)) {
      return fmt::format("expects {}, got {}",
                         f.type == FieldType::kBytes ? "a whole number of bytes" : "an integer",
                         FormatReal(*d));
    } else {
      return fmt::format("expects {}, got {}", TypeWord(f.type), ValueWord(value));
    }
    if (std::string e = CheckRange(f, v); !e.empty()) return e;
    if (a.int_ref) {
      *a.int_ref(plan) = v;
    } else {
      *a.opt_int_ref(plan) = v;
    }
    return {};
  }
  if (a.real_ref) {
    if (const double* d = std::get_if<double>(&value)) {
      *a.real_ref(plan) = *d;
    } else if (const int64_t* i = std::get_if<int64_t>(&value)) {
      *a.real_ref(plan) = static_cast<double>(*i);
    } else {
      return fmt::format("expects {}, got {}", TypeWord(f.type), ValueWord(value));
    }
    return {};
  }
  if (a.bool_ref) {
    const bool* b = std::get_if<bool>(&value);
    if (!b) return fmt::format("expects `true` or `false`, got {}", ValueWord(value));
    *a.bool_ref(plan) = *b;
    return {};
  }
  if (a.string_ref) {
    const std::string* s = std::get_if<std::string>(&value);
    if (!s) return fmt::format("expects a string, got {}", ValueWord(value));
    *a.string_ref(plan) = *s;
    return {};
  }
  if (a.list_ref) return fmt::format("expects a list of integers, got {}", ValueWord(value));
  const std::string* s = std::get_if<std::string>(&value);
  if (!s) return fmt::format("expects {}, got {}", EnumChoices(f), ValueWord(value));
  for (size_t i = 0; i < f.enum_values.size(); ++i) {
    if (f.enum_values[i] == *s) {
      a.enum_set(plan, static_cast<int>(i));
      return {};
    }
  }
  return fmt::format("expects {}, got `{}`", EnumChoices(f), *s);
}

std::string SetFieldList(Plan& plan, const FieldInfo& f, const std::vector<int64_t>& values) {
  const FieldAccess& a = AccessOf(f);
  if (!a.list_ref) return fmt::format("expects {}, got a list", TypeWord(f.type));
  for (int64_t v : values) {
    if (std::string e = CheckRange(f, v); !e.empty()) return "every element " + e;
  }
  *a.list_ref(plan) = values;
  return {};
}

bool ClearField(Plan& plan, const FieldInfo& f) {
  const FieldAccess& a = AccessOf(f);
  if (!a.opt_int_ref) return false;
  a.opt_int_ref(plan)->reset();
  return true;
}

std::optional<std::string> GetFieldText(const Plan& plan, std::string_view path) {
  if (path == "model") return plan.model.name;
  if (path == "cluster") return plan.cluster.name;
  if (path == "cluster.gpu") return plan.cluster.gpu.name;
  const FieldInfo* f = FindPlanField(path);
  if (!f) return std::nullopt;
  FieldValue v = GetFieldValue(plan, *f);
  if (const int64_t* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const double* d = std::get_if<double>(&v)) return FormatReal(*d);
  if (const bool* b = std::get_if<bool>(&v)) return std::string(*b ? "true" : "false");
  const std::string& s = std::get<std::string>(v);
  if (f->type == FieldType::kString) {
    // Quoted, so that SetFieldText (and --set) read it back as a string.
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  return s;
}

std::string SetFieldText(Plan& plan, std::string_view path, std::string_view raw) {
  const FieldInfo* f = FindPlanField(path);
  if (!f) {
    if (IsRecordPath(path)) {
      return fmt::format("`{}` names a record; set its fields (`{}.…`) or derive it in the plan",
                         path, path);
    }
    return fmt::format("`{}` is not a field of a plan", path);
  }
  std::string_view text = Trim(raw);
  if (text.empty()) return fmt::format("expects {}, got nothing", TypeWord(f->type));
  switch (f->type) {
    case FieldType::kInt: {
      if (f->nullable && text == "none") {
        ClearField(plan, *f);
        return {};
      }
      auto v = ParseInt(text);
      if (!v) return fmt::format("expects an integer, got `{}`", text);
      return SetFieldValue(plan, *f, *v);
    }
    case FieldType::kReal: {
      auto v = ParseReal(text);
      if (!v) return fmt::format("expects a number, got `{}`", text);
      return SetFieldValue(plan, *f, *v);
    }
    case FieldType::kBool:
      if (text == "true") return SetFieldValue(plan, *f, true);
      if (text == "false") return SetFieldValue(plan, *f, false);
      return fmt::format("expects `true` or `false`, got `{}`", text);
    case FieldType::kString:
    case FieldType::kEnum: {
      std::string s(text);
      if (s.size() >= 2 && s.front() == '"' && s.back() == '"') {
        std::string unquoted;
        for (size_t i = 1; i + 1 < s.size(); ++i) {
          if (s[i] == '\\' && i + 2 < s.size()) ++i;
          unquoted += s[i];
        }
        s = std::move(unquoted);
      }
      return SetFieldValue(plan, *f, std::move(s));
    }
    case FieldType::kIntList: {
      if (text.front() != '[' || text.back() != ']') {
        return fmt::format("expects a list of integers such as `[2, 3]`, got `{}`", text);
      }
      std::vector<int64_t> values;
      std::string_view body = Trim(text.substr(1, text.size() - 2));
      while (!body.empty()) {
        size_t comma = body.find(',');
        std::string_view item = Trim(body.substr(0, comma));
        auto v = ParseInt(item);
        if (!v) return fmt::format("expects a list of integers, got `{}` in it", item);
        values.push_back(*v);
        if (comma == std::string_view::npos) break;
        body = Trim(body.substr(comma + 1));
      }
      return SetFieldList(plan, *f, values);
    }
    case FieldType::kBytes:
    case FieldType::kBandwidth:
    case FieldType::kFlops: {
      std::string_view number, unit;
      SplitUnit(text, &number, &unit);
      auto v = ParseReal(number);
      if (!v) return fmt::format("expects {}, got `{}`", TypeWord(f->type), text);
      double scale = 1;
      if (!unit.empty()) {
        const UnitInfo* u = FindUnit(unit);
        if (!u) return fmt::format("`{}` is not a unit", unit);
        if (u->dimension != DimensionOf(f->type)) {
          return fmt::format("expects {}, got a {} (`{}`)", TypeWord(f->type),
                             ToString(u->dimension), unit);
        }
        scale = u->scale;
      }
      double value = *v * scale;
      if (f->type == FieldType::kBytes) {
        if (value != std::floor(value) || std::fabs(value) >= 9.2e18) {
          return fmt::format("expects a whole number of bytes, got `{}`", text);
        }
        return SetFieldValue(plan, *f, static_cast<int64_t>(value));
      }
      return SetFieldValue(plan, *f, value);
    }
  }
  return "unsupported field type";
}

// --- Enums -----------------------------------------------------------------------------------

std::string_view ToString(Precision v) {
  switch (v) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp8:
      return "fp8";
  }
  return "?";
}
std::string_view ToString(Recompute v) {
  switch (v) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}
std::string_view ToString(Schedule v) {
  switch (v) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved1F1B:
      return "interleaved_1f1b";
  }
  return "?";
}
std::string_view ToString(Balance v) {
  switch (v) {
    case Balance::kEven:
      return "even";
    case Balance::kCost:
      return "cost";
    case Balance::kNanotron:
      return "nanotron";
  }
  return "even";
}
std::string_view ToString(OptimizerType v) { return v == OptimizerType::kAdamW ? "adamw" : "sgd"; }
std::string_view ToString(Offload v) { return v == Offload::kNone ? "none" : "cpu"; }
std::string_view ToString(Norm v) { return v == Norm::kRmsNorm ? "rmsnorm" : "layernorm"; }
std::string_view ToString(Activation v) {
  switch (v) {
    case Activation::kSwiGlu:
      return "swiglu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kSquaredRelu:
      return "squared_relu";
  }
  return "?";
}
std::string_view ToString(ElementType v) {
  switch (v) {
    case ElementType::kFp32:
      return "fp32";
    case ElementType::kBf16:
      return "bf16";
    case ElementType::kFp16:
      return "fp16";
    case ElementType::kFp8:
      return "fp8";
  }
  return "?";
}
std::string_view ToString(Fp8Recipe v) {
  switch (v) {
    case Fp8Recipe::kNone:
      return "none";
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kCurrent:
      return "current";
    case Fp8Recipe::kBlockwise:
      return "blockwise";
    case Fp8Recipe::kMxfp8:
      return "mxfp8";
  }
  return "?";
}
std::string_view ToString(RecomputeMethod v) {
  return v == RecomputeMethod::kUniform ? "uniform" : "block";
}
std::string_view ToString(Dispatcher v) {
  switch (v) {
    case Dispatcher::kAllToAll:
      return "alltoall";
    case Dispatcher::kAllGather:
      return "allgather";
    case Dispatcher::kFlex:
      return "flex";
  }
  return "?";
}

// --- Records that follow shorthands ----------------------------------------------------------

const std::vector<std::string_view>& RecomputeModuleNames() {
  static const std::vector<std::string_view> names = {
      "core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "moe", "shared_experts"};
  return names;
}

std::optional<uint32_t> ParseRecomputeModules(std::string_view text, std::string* bad) {
  uint32_t bits = 0;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ',' || text[i] == ' ' || text[i] == '\t')) ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ',' && text[j] != ' ' && text[j] != '\t') ++j;
    if (j == i) break;
    std::string_view name = text.substr(i, j - i);
    const auto& names = RecomputeModuleNames();
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      if (bad) *bad = std::string(name);
      return std::nullopt;
    }
    bits |= 1u << (it - names.begin());
    i = j;
  }
  return bits;
}

namespace {

// A field keeps its stored value when the plan wrote it; otherwise it follows its shorthand.
bool Written(const Plan& plan, std::string_view path) {
  const OriginKind k = plan.Origin(path).kind;
  return k == OriginKind::kFile || k == OriginKind::kStdlib || k == OriginKind::kCommandLine;
}

}  // namespace

MixedPrecisionSpec EffectiveMixedPrecision(const Plan& plan) {
  MixedPrecisionSpec out = plan.mixed_precision;
  const Precision p = plan.precision;
  if (!Written(plan, "mixed_precision.params"))
    out.params = p == Precision::kFp32   ? ElementType::kFp32
                 : p == Precision::kFp16 ? ElementType::kFp16
                                         : ElementType::kBf16;
  if (!Written(plan, "mixed_precision.grads"))
    out.grads = p == Precision::kFp16 ? ElementType::kFp16 : ElementType::kFp32;
  if (!Written(plan, "mixed_precision.main_params")) out.main_params = p != Precision::kFp32;
  if (!Written(plan, "mixed_precision.fp8"))
    out.fp8 = p == Precision::kFp8 ? Fp8Recipe::kDelayed : Fp8Recipe::kNone;
  return out;
}

uint32_t EffectiveRecomputeModules(const Plan& plan) {
  if (plan.recompute != Recompute::kSelective) return 0;
  auto bits = ParseRecomputeModules(plan.activations.recompute_modules);
  if (!bits || *bits == 0) return kRecomputeCoreAttn;
  return *bits;
}

int64_t ShardGroup(const Plan& plan) {
  if (plan.fsdp.shard > 0) return plan.fsdp.shard;
  auto group =
      CheckedMul(std::max<int64_t>(1, plan.parallel.dp), std::max<int64_t>(1, plan.parallel.cp));
  if (!group) return 1;
  return std::max<int64_t>(1, *group / std::max<int64_t>(1, plan.fsdp.replicate));
}

bool UsesFp8(const Plan& plan) { return EffectiveMixedPrecision(plan).fp8 != Fp8Recipe::kNone; }

bool IsMoeLayer(const ModelSpec& m, int64_t index) {
  if (!m.IsMoe() || index < m.dense_layers) return false;
  return (index - m.dense_layers) % std::max<int64_t>(1, m.moe_layer_freq) == 0;
}
std::string_view ToString(Position v) { return v == Position::kRope ? "rope" : "learned"; }
std::string_view ToString(Framework v) {
  switch (v) {
    case Framework::kParaplan:
      return "paraplan";
    case Framework::kMegatronCore:
      return "megatron_core";
    case Framework::kTorchtitan:
      return "torchtitan";
    case Framework::kDeepSpeed:
      return "deepspeed";
    case Framework::kLlmFoundry:
      return "llm_foundry";
    case Framework::kMegatronLm2021:
      return "megatron_lm_2021";
  }
  return "?";
}

// --- Dump and verifier -----------------------------------------------------------------------

std::string PrintPlan(const Plan& plan) {
  std::string out = fmt::format("plan {}\n", plan.name);
  auto line = [&](std::string_view path, const std::string& value) {
    const FieldOrigin& o = plan.Origin(path);
    std::string origin(ToString(o.kind));
    if (!o.derivation.empty()) origin += ": " + o.derivation;
    out += fmt::format("  {:<34} = {:<24} # {}{}\n", path, value, origin,
                       plan.IsPoisoned(path) ? " (poisoned)" : "");
  };
  line("model", plan.model.name);
  line("cluster", plan.cluster.name);
  line("cluster.gpu", plan.cluster.gpu.name);
  for (const FieldInfo& f : PlanFields()) line(f.path, *GetFieldText(plan, f.path));
  out += fmt::format("  world = {}, edp = {}, microbatches = {}\n", plan.World(), plan.Edp(),
                     plan.Microbatches());
  for (const Sweep& s : plan.sweeps) {
    out += fmt::format("  sweep {} over [", s.path);
    for (size_t i = 0; i < s.values.size(); ++i) out += (i ? ", " : "") + s.values[i];
    out += "]\n";
  }
  return out;
}

std::vector<std::string> VerifyPlan(const Plan& plan) {
  std::vector<std::string> problems;
  for (const FieldInfo& f : PlanFields()) {
    if (plan.IsPoisoned(f.path)) continue;
    FieldValue v = GetFieldValue(plan, f);
    if (const int64_t* i = std::get_if<int64_t>(&v)) {
      if (std::string e = CheckRange(f, *i); !e.empty()) {
        problems.push_back(fmt::format("`{}` {}", f.path, e));
      }
    }
  }
  for (int64_t l : plan.pipeline.stage_layers) {
    if (l < 0) problems.push_back(fmt::format("`pipeline.stage_layers` holds {} < 0", l));
  }
  if (!CheckedMul(plan.cluster.nodes, plan.cluster.gpus_per_node)) {
    problems.push_back("world size overflows 64 bits");
  }
  if (plan.model.name.empty()) problems.push_back("the plan has no model");
  if (plan.cluster.name.empty()) problems.push_back("the plan has no cluster");
  if (plan.model.kv_heads > plan.model.heads && plan.model.heads > 0) {
    problems.push_back(fmt::format("`model.kv_heads` = {} > `model.heads` = {}",
                                   plan.model.kv_heads, plan.model.heads));
  }
  return problems;
}

}  // namespace paraplan
