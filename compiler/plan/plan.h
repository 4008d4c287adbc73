// The checked plan: every field resolved, typed and in canonical units.
//
// Made by check/ from the AST (after imports, derivation, `--set`, `auto` and `require`);
// read by the rules in check/, by analyze/ (layout, partition, memory, time), by search/ and
// by lower/. Field names are DESIGN.md's canonical names ("parallel.tp", "cluster.gpu.memory"
// in origins, --set, JSON and search); in code a field is named by its handle,
// `fields::kParallelTp` (field_id.h, generated with the field table from fields.def).
//
// Invariants after a successful check: every size is >= 1 where a size makes sense (experts
// may be 0 = dense), etp is resolved (defaults to tp), dp is resolved (solved when `auto`).
// A field whose value failed to evaluate is listed in `poisoned` and must not be reported on
// again by later rules (no cascades).
#ifndef PARAPLAN_COMPILER_PLAN_PLAN_H_
#define PARAPLAN_COMPILER_PLAN_PLAN_H_

#include <climits>
#include <concepts>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "compiler/plan/field_id.h"
#include "compiler/source/source.h"

namespace paraplan {

enum class Precision : uint8_t { kBf16, kFp16, kFp32, kFp8 };
enum class Recompute : uint8_t { kNone, kSelective, kFull };
enum class Schedule : uint8_t { kGpipe, k1F1B, kInterleaved1F1B };
// kNanotron reproduces Nanotron's greedy cost split (to check a Nanotron run before launch).
enum class Balance : uint8_t { kEven, kCost, kNanotron };
enum class OptimizerType : uint8_t { kAdamW, kSgd };
enum class Offload : uint8_t { kNone, kCpu };
enum class Norm : uint8_t { kRmsNorm, kLayerNorm };
enum class Activation : uint8_t { kSwiGlu, kGelu, kSquaredRelu };
enum class Position : uint8_t { kRope, kLearned };
// The software that runs the plan. Rules and memory behaviour follow it where frameworks differ
// (ZeRO-3 with pipeline parallelism is refused only by DeepSpeed; torchtitan's FSDP2 keeps
// parameters unsharded across microbatches under pipeline parallelism; allocator and NCCL
// reserves differ). kMegatronCore also stands for NeMo and Megatron-Bridge; kMegatronLm2021 is
// the Megatron-LM of the 2021 papers (MT-NLG, the PTD-P runs), before the distributed optimizer.
enum class Framework : uint8_t {
  kParaplan,
  kMegatronCore,
  kTorchtitan,
  kDeepSpeed,
  kLlmFoundry,
  kMegatronLm2021,
};

// How numbers are stored: parameters, gradients, optimizer state (mixed_precision record).
enum class ElementType : uint8_t { kFp32, kBf16, kFp16, kFp8 };
// FP8 scaling recipes: Transformer Engine's (Megatron --fp8-recipe) per-tensor delayed or
// current scaling, 128-element blockwise (DeepSeek-V3) and MXFP8 (Blackwell, 32-element blocks);
// torchao's row-wise scaling (torchtitan `float8.recipe_name = "rowwise"`: one scale per row of
// the activations and per column of the weights).
enum class Fp8Recipe : uint8_t { kNone, kDelayed, kCurrent, kBlockwise, kMxfp8, kRowwise };
// Megatron --recompute-method under full recompute: uniform (every layer, checkpointing groups
// of `layers`) or block (only the first `layers` layers of each pipeline chunk).
enum class RecomputeMethod : uint8_t { kUniform, kBlock };
// Megatron --moe-token-dispatcher-type.
enum class Dispatcher : uint8_t { kAllToAll, kAllGather, kFlex };
// How an MoE router turns logits into scores (Megatron-Core --moe-router-score-function).
enum class RouterScore : uint8_t { kSoftmax, kSigmoid };
// Which routed pairs an expert past its capacity drops (Megatron-Core --moe-token-drop-policy).
enum class DropPolicy : uint8_t { kProbs, kPosition };

// Megatron's --recompute-modules, as bits of ActivationSpec::RecomputeModules().
enum RecomputeModule : uint32_t {
  kRecomputeCoreAttn = 1u << 0,
  kRecomputeMlp = 1u << 1,
  kRecomputeMoeAct = 1u << 2,
  kRecomputeLayernorm = 1u << 3,
  kRecomputeMlaUpProj = 1u << 4,
  kRecomputeMoe = 1u << 5,
  kRecomputeSharedExperts = 1u << 6,
};
// The module names in bit order: "core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj",
// "moe", "shared_experts".
const std::vector<std::string_view>& RecomputeModuleNames();
// Parses "core_attn, mlp" (names separated by commas or spaces) into bits; on an unknown name
// returns nullopt and sets *bad to it.
std::optional<uint32_t> ParseRecomputeModules(std::string_view text, std::string* bad = nullptr);

struct GpuSpec {
  std::string name;          // record name, e.g. "h100_sxm"
  int64_t memory = 0;        // bytes
  double peak_bf16 = 0;      // FLOP/s, dense
  double peak_fp16 = 0;      // FLOP/s, dense
  double peak_fp8 = 0;       // FLOP/s, dense
  double hbm_bandwidth = 0;  // bytes/s
};

struct ClusterSpec {
  std::string name;
  GpuSpec gpu;
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  double nvlink_bandwidth = 0;   // bytes/s per GPU, one direction
  double network_bandwidth = 0;  // bytes/s per GPU, one direction
};

struct ModelSpec {
  std::string name;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t ffn_hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // == heads without GQA
  int64_t head_dim = 0;  // hidden / heads unless given
  int64_t vocab = 0;
  int64_t seq_len = 0;
  Norm norm = Norm::kRmsNorm;
  Activation activation = Activation::kSwiGlu;
  Position position = Position::kRope;
  bool tied_embeddings = false;
  // Megatron --make-vocab-size-divisible-by: the embedding is padded to a multiple of this
  // times tp (128 is Megatron's default; 1 = no padding).
  int64_t vocab_divisor = 128;
  bool qk_norm = false;    // RMSNorm on queries and keys (per head)
  int64_t window = 0;      // sliding-window attention span in tokens (0 = full attention)
  int64_t mtp_layers = 0;  // multi-token-prediction modules after the last layer (DeepSeek-V3)
  // The weight of their mean loss beside the model's (Megatron-Core's mtp_loss_scaling_factor,
  // 0.1 by default; DeepSeek-V3 trained with 0.3, then 0.1).
  double mtp_loss_scale = 0.1;
  // MoE (experts == 0: dense).
  int64_t experts = 0;
  int64_t topk = 0;
  int64_t moe_ffn_hidden = 0;
  int64_t shared_experts = 0;
  int64_t dense_layers = 0;    // leading dense layers before the MoE layers
  int64_t moe_layer_freq = 1;  // after dense_layers, every n-th layer is MoE (1 = all of them)
  // The router: score function, whether the top-k weights are renormalised to sum to 1, the
  // load-balancing loss coefficient, and the aux-loss-free balancing bias's update rate (0: no
  // bias; DeepSeek-V3's expert bias).
  RouterScore router_score = RouterScore::kSoftmax;
  bool router_topk_norm = true;
  double router_aux_coeff = 0.01;
  double router_bias_rate = 0;
  // Group-limited routing (DeepSeek-V2/V3, Megatron-Core's --moe-router-num-groups): the experts
  // form router_groups equal groups; each token keeps the router_group_topk groups of highest
  // score (the sum of its topk / router_group_topk best routing scores) and picks its top k among
  // their experts. 1 group: no grouping. The top-k weights are multiplied by router_scale after
  // any renormalisation (DeepSeek's routed_scaling_factor).
  int64_t router_groups = 1;
  int64_t router_group_topk = 1;
  double router_scale = 1;
  // MLA (DeepSeek); 0 when the model uses ordinary attention.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  bool IsMoe() const { return experts > 0; }
  // Each routed expert's FFN width: moe_ffn_hidden, or ffn_hidden when it is not set (as
  // Megatron-Core defaults --moe-ffn-hidden-size).
  int64_t ExpertFfn() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_hidden; }
  bool IsMla() const { return kv_lora_rank > 0; }
};

// An fp8 peak below this (FLOP/s) counts as no fp8 tensor cores (cluster.gpu.peak_fp8).
inline constexpr double kMinFp8Peak = 1e9;

// The precision record: how each kind of number is stored. Fields not written follow the
// `precision` shorthand (EffectiveMixedPrecision).
struct MixedPrecisionSpec {
  ElementType params = ElementType::kBf16;           // weights the GEMMs read
  ElementType grads = ElementType::kFp32;            // main gradients and their DP reduction
  bool main_params = true;                           // fp32 master weights in the optimizer
  ElementType optimizer_state = ElementType::kFp32;  // Adam moments
  Fp8Recipe fp8 = Fp8Recipe::kNone;
  bool fp8_params = false;  // weights kept only in FP8
};

// Recompute and activation offload beyond the `recompute` shorthand (which is Megatron's
// --recompute-granularity): method and layer count under `full`, modules under `selective`.
struct ActivationSpec {
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;
  int64_t recompute_layers = 0;   // 0 = every layer (uniform) / all layers of a chunk (block)
  std::string recompute_modules;  // "core_attn, mlp"; empty = core_attn under selective
  int64_t offload_layers = 0;     // layers per stage whose stored activations go to host memory
};

// Sharding of model states (what `optimizer.zero` shards) over a group of `shard` ranks,
// replicated `replicate` times: dp·cp = shard · replicate. HSDP when replicate > 1.
struct FsdpSpec {
  int64_t shard = 0;  // 0 = dp·cp / replicate
  int64_t replicate = 1;
  bool reshard_after_forward = true;  // ZeRO-3: free gathered weights after each forward
  // DeepSpeed ZeRO-3's stage3_max_live_parameters: gathered parameters it keeps resident before
  // it stops prefetching (0: its default, 1e9).
  int64_t max_live_params = 0;
};

struct MoeSpec {
  Dispatcher dispatcher = Dispatcher::kAllToAll;
  double capacity_factor = 0;  // 0 = no token dropping (no capacity limit)
  DropPolicy drop_policy = DropPolicy::kProbs;
  double imbalance = 1.0;  // stated worst-rank routed tokens over the average
};

struct ParallelSpec {
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t vpp = 1;  // virtual pipeline chunks per pipeline rank; 1 = not interleaved
  int64_t cp = 1;
  int64_t ep = 1;
  int64_t etp = 1;  // defaults to tp
  int64_t dp = 1;   // world / (tp·pp·cp), solved when `auto`
  bool sp = false;
  bool tp_comm_overlap =
      false;  // TP collectives overlapped with the GEMMs (--tp-comm-overlap, async TP)
  std::string order = "tp-cp-ep-dp-pp";
};

struct PipelineSpec {
  Schedule schedule = Schedule::k1F1B;
  bool account_for_embedding = false;
  bool account_for_loss = false;
  std::optional<int64_t> first_stage_layers;
  std::optional<int64_t> last_stage_layers;
  std::vector<int64_t> stage_layers;  // explicit split, one entry per stage (or per pp·vpp chunk)
  Balance balance = Balance::kEven;
};

struct OptimizerSpec {
  OptimizerType type = OptimizerType::kAdamW;
  int64_t zero = 0;  // 0 none, 1 optimizer states, 2 + gradients, 3 + parameters
  Offload offload = Offload::kNone;
  double offload_fraction = 1.0;  // share of the optimizer state on the host when offload = cpu
  double lr = 3e-4;
  double min_lr = 3e-5;      // floor of the cosine decay
  int64_t warmup_steps = 0;  // linear warmup, then cosine decay to min_lr over train.steps
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double clip_grad = 1.0;  // global-norm clipping; 0 = off
};

struct BatchSpec {
  int64_t global = 1;  // sequences per step
  int64_t micro = 1;   // sequences per microbatch
};

struct TrainSpec {
  int64_t steps = 10;
  int64_t seed = 1234;
  std::string data;            // path to token data; empty = the bundled text
  std::string checkpoint_dir;  // empty = no checkpoints
  int64_t checkpoint_every = 0;
};

// How a field got its value, for labels in diagnostics and for `explain`.
enum class OriginKind : uint8_t {
  kDefault,      // the built-in default of the record kind
  kFile,         // written in a plan file
  kStdlib,       // written in a stdlib module
  kCommandLine,  // --set PATH=VALUE
  kAuto,         // solved by the compiler from `auto`
  kDerived,      // defaulted from another field (etp from tp, head_dim from hidden/heads)
};

struct FieldOrigin {
  OriginKind kind = OriginKind::kDefault;
  SourceRange range;  // the value's expression (or `auto`) where it was written
  // For kAuto / kDerived: the paths it was computed from, e.g. {"cluster.nodes", "parallel.tp"}.
  std::vector<std::string> derived_from;
  // For kAuto: the derivation in words, e.g. "dp = world / (tp·pp·cp) = 128 / (4·4·1) = 8".
  std::string derivation;
};

// A field that `planc search` enumerates: `tp = [1, 2, 4, 8]` or `tp = auto` in search mode.
struct Sweep {
  std::string path;                 // "parallel.tp"
  std::vector<std::string> values;  // each a value as --set would take it: "4", "true", "selective"
  SourceRange range;
  int64_t repeats = 0;  // values written more than once (`[2, 2, 4]`): each is searched once
};

// Where each canonical path of a plan got its value: one slot per path (by FieldId::index),
// sized on the first write so that recording the origins of a plan allocates once.
class PlanOrigins {
 public:
  // The origin of `field`, recorded from now on (like std::map::operator[]).
  FieldOrigin& operator[](FieldId field);
  FieldOrigin& operator[](const FieldInfo& field);
  // A path from outside: its origin, recorded from now on; nullptr (nothing recorded) when
  // `path` is not a canonical path.
  FieldOrigin* Mutable(std::string_view path);
  // The recorded origin; nullptr when none was recorded (or `path` is not a canonical path).
  const FieldOrigin* Find(FieldId field) const;
  const FieldOrigin* FindPath(std::string_view path) const;
  size_t count(FieldId field) const { return Find(field) ? 1 : 0; }
  // How many paths have a recorded origin.
  size_t size() const;

 private:
  std::vector<FieldOrigin> slots_;  // fields::kPathCount, sized on the first write
  std::vector<bool> recorded_;
};

struct Plan {
  std::string name;
  ModelSpec model;
  ClusterSpec cluster;
  Precision precision = Precision::kBf16;
  Recompute recompute = Recompute::kNone;
  Framework framework = Framework::kParaplan;
  // The framework compiles the model's graph (torch.compile): its elementwise kernels fused.
  bool compile = false;
  MixedPrecisionSpec mixed_precision;
  ActivationSpec activations;
  FsdpSpec fsdp;
  MoeSpec moe;
  ParallelSpec parallel;
  PipelineSpec pipeline;
  OptimizerSpec optimizer;
  BatchSpec batch;
  TrainSpec train;

  PlanOrigins origins;
  FieldSet poisoned;
  std::vector<Sweep> sweeps;
  SourceRange declaration;  // the `plan NAME` header

  int64_t World() const { return cluster.nodes * cluster.gpus_per_node; }
  // Expert data parallel: world / (etp·ep·pp).
  int64_t Edp() const;
  // global / (micro · dp); 0 when it does not divide.
  int64_t Microbatches() const;

  // The origin of a canonical path; a default origin (no range) when none was recorded.
  const FieldOrigin& Origin(FieldId field) const;
  SourceRange Range(FieldId field) const { return Origin(field).range; }
  // A path known only at run time (a literal converts to FieldId and is checked while
  // compiling): no range when it is not a canonical path.
  template <typename S>
  requires std::same_as<S, std::string_view> SourceRange Range(S path)
  const {
    const FieldOrigin* o = origins.FindPath(path);
    return o ? o->range : SourceRange{};
  }
  bool IsPoisoned(FieldId field) const { return poisoned.count(field) > 0; }
};

// A field's handle with its accessor: `fields::kParallelTp.Get(plan)` is `plan.parallel.tp`.
template <typename T>
struct TypedField : FieldId {
  T& (*ref)(Plan&);
  const T& (*cref)(const Plan&);

  T& Get(Plan& plan) const { return ref(plan); }
  const T& Get(const Plan& plan) const { return cref(plan); }
};

namespace fields {
#define PLAN_TYPED_FIELD(NAME, PATH, TYPE, MEMBER)                                  \
  inline constexpr TypedField<TYPE> NAME{FieldId(NAME##Index, PATH),                \
                                         [](Plan& p) -> TYPE& { return p.MEMBER; }, \
                                         [](const Plan& p) -> const TYPE& { return p.MEMBER; }};
#define PLAN_INT(NAME, PATH, MEMBER, ...) PLAN_TYPED_FIELD(NAME, PATH, int64_t, MEMBER)
#define PLAN_BYTES(NAME, PATH, MEMBER, ...) PLAN_TYPED_FIELD(NAME, PATH, int64_t, MEMBER)
#define PLAN_OPT_INT(NAME, PATH, MEMBER, ...) \
  PLAN_TYPED_FIELD(NAME, PATH, std::optional<int64_t>, MEMBER)
#define PLAN_REAL_IN(NAME, PATH, TYPE, MEMBER, ...) PLAN_TYPED_FIELD(NAME, PATH, double, MEMBER)
#define PLAN_BOOL(NAME, PATH, MEMBER, ...) PLAN_TYPED_FIELD(NAME, PATH, bool, MEMBER)
#define PLAN_STRING(NAME, PATH, MEMBER, ...) PLAN_TYPED_FIELD(NAME, PATH, std::string, MEMBER)
#define PLAN_LIST(NAME, PATH, MEMBER, ...) \
  PLAN_TYPED_FIELD(NAME, PATH, std::vector<int64_t>, MEMBER)
#define PLAN_ENUM(NAME, PATH, ENUM, MEMBER, ...) PLAN_TYPED_FIELD(NAME, PATH, ENUM, MEMBER)
#include "compiler/plan/fields.def"
#undef PLAN_INT
#undef PLAN_BYTES
#undef PLAN_OPT_INT
#undef PLAN_REAL_IN
#undef PLAN_BOOL
#undef PLAN_STRING
#undef PLAN_LIST
#undef PLAN_ENUM
#undef PLAN_TYPED_FIELD

inline constexpr FieldId kModel{kModelIndex, "model"};
inline constexpr FieldId kCluster{kClusterIndex, "cluster"};
inline constexpr FieldId kClusterGpu{kClusterGpuIndex, "cluster.gpu"};
}  // namespace fields

// The precision record as it applies: each field written in the plan (file, stdlib, --set) is
// kept, each other follows `precision` (params bf16 for bf16/fp8, fp16, fp32; grads fp16 under
// fp16 else fp32; main params unless fp32; fp8 = delayed under `precision = fp8`).
MixedPrecisionSpec EffectiveMixedPrecision(const Plan& plan);
// The recompute modules that apply: the written ones, else core_attn under `selective`; 0 when
// recompute is not selective.
uint32_t EffectiveRecomputeModules(const Plan& plan);
// The modules planrun recomputes: EffectiveRecomputeModules with `moe` covering the experts'
// activation and the shared experts (moe_act and shared_experts cleared beside it).
uint32_t LoweredRecomputeModules(const Plan& plan);
// The routing imbalance the plan states (written in its file, a module it uses, or --set; at
// least 1), or 0 when moe.imbalance keeps its built-in default: what sizes planrun's
// expert-parallel receive buffers.
double StatedMoeImbalance(const Plan& plan);
// Size of the group that ZeRO shards over (fsdp.shard, or dp·cp / fsdp.replicate).
int64_t ShardGroup(const Plan& plan);
// True when the GEMMs run in FP8: precision = fp8 with a recipe other than none. A recipe under
// another precision has no effect (P0517), as in Megatron-LM, NeMo and torchtitan, where FP8
// is its own switch and the recipe only says how it scales.
bool UsesFp8(const Plan& plan);
// A recipe other than none under a precision other than fp8: written, and without effect.
bool IdleFp8Recipe(const Plan& plan);
// Layer i (0-based) of the model is an MoE layer (dense_layers and moe_layer_freq).
bool IsMoeLayer(const ModelSpec& model, int64_t index);
// The routed pairs each expert keeps from `rows` rows with top-k routing over `experts` experts
// at moe.capacity_factor `factor`: Megatron-Core's get_capacity, ceil(rows · topk / experts ·
// factor), at most `rows` (a token reaches an expert once); 0 without a capacity factor (factor
// <= 0).
int64_t ExpertCapacity(int64_t rows, int64_t topk, int64_t experts, double factor);

// --- Generic access by canonical path (used by --set, search, explain and tests) -----------

// A field's value as the language sees it.
using FieldValue = std::variant<int64_t, double, bool, std::string>;

enum class FieldType : uint8_t {
  kInt,
  kReal,
  kBool,
  kString,
  kEnum,
  kIntList,
  kBytes,
  kBandwidth,
  kFlops
};

struct FieldInfo {
  std::string_view path;  // "parallel.tp"
  FieldType type;
  std::vector<std::string_view> enum_values;  // for kEnum: the accepted spellings
  std::string_view doc;                       // one line
  // Integer-valued fields (kInt, kBytes, kIntList elements): the accepted range, inclusive.
  int64_t min = INT64_MIN;
  int64_t max = INT64_MAX;
  // An optional field (pipeline.first_stage_layers): unset reads as "none".
  bool nullable = false;
  // Position in PlanFields(); stable within one build.
  uint16_t index = 0;
  // Real-valued fields (kReal, kBandwidth, kFlops): the accepted range; an open end excludes its
  // bound (rates are > 0, Adam's betas in [0, 1)). Values must be finite.
  double real_min = -std::numeric_limits<double>::infinity();
  bool real_min_open = false;
  double real_max = std::numeric_limits<double>::infinity();
  bool real_max_open = false;

  FieldId id() const { return FieldId(index, path); }
};

// Every settable canonical path of a plan, in a stable order. The record-valued paths
// "model", "cluster" and "cluster.gpu" are not fields (they name records); GetFieldText reads
// them as the record's name.
const std::vector<FieldInfo>& PlanFields();
const FieldInfo* FindPlanField(std::string_view path);
// Canonical paths that name records rather than values: "model", "cluster", "cluster.gpu".
bool IsRecordPath(std::string_view path);

// Typed access for the checker and search (no text round trip). `SetFieldValue` takes an
// int64_t for kInt/kBytes (and a double with an integral value), a double or int64_t for
// kReal/kBandwidth/kFlops, a bool for kBool, a string for kString/kEnum (an enum spelling).
// Returns an empty string on success, otherwise what is wrong, phrased to follow
// "`parallel.tp` ..." (e.g. "must be at least 1, got 0", "expects an integer, got a string").
std::string SetFieldValue(Plan& plan, const FieldInfo& field, const FieldValue& value);
std::string SetFieldList(Plan& plan, const FieldInfo& field, const std::vector<int64_t>& values);
// A field's value; kIntList reads as its text ("[2, 3]"), a nullable unset field as "none".
FieldValue GetFieldValue(const Plan& plan, const FieldInfo& field);
// Clears a nullable field (pipeline.first_stage_layers = none); false for others.
bool ClearField(Plan& plan, const FieldInfo& field);

// Units of the language, shared by the checker and SetFieldText. Scales are to the canonical
// unit of the dimension: bytes, bytes/s, FLOP/s, seconds.
enum class UnitDimension : uint8_t { kBytes, kBandwidth, kFlops, kTime };
struct UnitInfo {
  std::string_view name;  // "GiB", "Gb/s", "TFLOPS", "ms"
  UnitDimension dimension;
  double scale;
};
const UnitInfo* FindUnit(std::string_view name);
const std::vector<UnitInfo>& AllUnits();
std::string_view ToString(UnitDimension d);  // "bytes", "bandwidth", "compute", "time"
std::string_view ToString(OriginKind k);     // "default", "file", "stdlib", "command line", ...

// Reads a field as text (as --set would take it back): "4", "true", "interleaved_1f1b", "80 GiB"
// is printed as the integer byte count. nullopt for an unknown path.
std::optional<std::string> GetFieldText(const Plan& plan, std::string_view path);

// Reads a scalar field's value from text as --set would write it ("4", "true", "selective",
// "\"1f1b\"", "80 GiB"), without setting it: SetFieldValue takes the result. Lists and
// "none" for an optional field are SetFieldText's only. Returns what is wrong, empty on success.
std::string ParseFieldText(const FieldInfo& field, std::string_view text, FieldValue* out);

// Sets a field from text as --set would write it ("4", "true", "selective", "[2, 3]").
// Returns an empty string on success, otherwise what is wrong ("expected an integer").
std::string SetFieldText(Plan& plan, std::string_view path, std::string_view text);

std::string_view ToString(Precision v);
std::string_view ToString(Recompute v);
std::string_view ToString(Schedule v);
std::string_view ToString(Balance v);
std::string_view ToString(OptimizerType v);
std::string_view ToString(Offload v);
std::string_view ToString(Norm v);
std::string_view ToString(Activation v);
std::string_view ToString(RouterScore v);
std::string_view ToString(DropPolicy v);
std::string_view ToString(Position v);
std::string_view ToString(Framework v);
std::string_view ToString(ElementType v);
std::string_view ToString(Fp8Recipe v);
std::string_view ToString(RecomputeMethod v);
std::string_view ToString(Dispatcher v);

// A stable, line-per-field text dump (`planc check --dump=plan`); tests compare it.
std::string PrintPlan(const Plan& plan);
// Structural invariants (sizes >= 1, etp/dp resolved); returns the violations, empty if none.
std::vector<std::string> VerifyPlan(const Plan& plan);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_PLAN_PLAN_H_
