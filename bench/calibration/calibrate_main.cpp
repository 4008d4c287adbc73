// Predicted vs published training throughput for the shared calibration runs
// (../shared/reference/calibration_runs.json; bench/calibration/README.md).
//
// Every run becomes a plan: its model, cluster, layout, precision and recompute, and the
// framework profile of the software stack that produced it (cost_framework.h), exactly what a
// plan file with `framework = <stack>` prices; the time model then predicts tokens/s per GPU.
// Fields a run leaves unstated (micro batch, interleaving, recompute, sequence parallelism) are
// chosen by the model itself: the fastest setting that fits in memory, as the authors tuned
// theirs. Reported: the error per run, per profile and per source; leave-one-source-out (the
// fitted profile numbers refit without the source, then that source predicted); rank
// correlation within groups (one model on one GPU type); predicted vs measured peak memory.
//
// Usage: paraplan_calibrate [runs.json] [--csv] [--verbose] [--fit]
// Without the file (no ../shared beside the repository) it says so and exits 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bench/calibration/error_stats.h"
#include "bench/calibration/memory_points.h"
#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/cost_params.h"
#include "compiler/analyze/cost_shape.h"
#include "compiler/analyze/memory.h"
#include "compiler/analyze/time.h"
#include "compiler/interop/draft.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

namespace {

using namespace paraplan;
using llvm::json::Object;

constexpr int64_t kGiB = int64_t{1} << 30;

double D(int64_t v) { return static_cast<double>(v); }

// A setting "fits" when the memory model puts its peak within this factor of the capacity.
constexpr double kFitMargin = 1.10;

// The sources of the file, by id prefix (longest first where they nest).
const std::vector<std::string>& Sources() {
  static const std::vector<std::string> kSources = {
      "narayanan21", "korthikanti22", "megascale24", "mtnlg22", "megatron-readme24",
      "nemo2407",    "nemo-longseq",  "mbridge",     "llama3",  "torchtitan",
      "mosaic"};
  return kSources;
}

std::string SourceOf(const std::string& id) {
  for (const std::string& s : Sources())
    if (id.rfind(s, 0) == 0) return s;
  return id.substr(0, id.find('-'));
}

bool Has(const std::string& text, const char* needle) {
  return text.find(needle) != std::string::npos;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int64_t Int(const Object* o, llvm::StringRef key, int64_t fallback = 0) {
  if (!o) return fallback;
  if (auto v = o->getInteger(key)) return *v;
  if (auto v = o->getNumber(key)) return static_cast<int64_t>(*v);
  return fallback;
}
double Num(const Object* o, llvm::StringRef key, double fallback = 0) {
  if (!o) return fallback;
  if (auto v = o->getNumber(key)) return *v;
  return fallback;
}
std::string Str(const Object* o, llvm::StringRef key) {
  if (!o) return "";
  if (auto v = o->getString(key)) return v->str();
  return "";
}

// One published run as the model sees it.
struct Case {
  std::string id, source, title, where, locator, notes, group, stack, why_unscored;
  // What the row states beyond the plan: its precision and recompute text, token dropping.
  std::string as_published;
  // Whose memory behaviour prices the run: its stack's, except Llama 3 (Meta's own stack, priced
  // with torchtitan's time profile), whose tensor parallelism keeps the 1/t shards Megatron
  // keeps rather than DTensor's gathered inputs: its 405B run at 8K without recompute ran.
  Framework memory_framework = Framework::kParaplan;
  Plan plan;
  CostOptions options;
  double measured = 0;  // tokens/s per GPU
  std::string measured_how;
  double measured_mem_gib = 0;
  // Candidates for unstated fields.
  std::vector<int64_t> micros, vpps;
  std::vector<Recompute> recomputes;
  std::vector<bool> sps;
  std::vector<Balance> balances = {Balance::kEven};
  std::vector<Dispatcher> dispatchers = {Dispatcher::kAllToAll};
  // Chosen (by the fastest-that-fits rule) and predicted.
  Plan chosen;
  MemoryEstimate memory;
  double predicted = 0, loso = 0;
  bool fits = true;
  bool readable = true;  // false: the reader could not make a plan of it (why_unscored says why)
  std::string breakdown;
  bool Scored() const { return why_unscored.empty() && measured > 0; }
};

// An H100 SXM held at 500 W instead of its 700 W: the tensor cores' sustained clock, and so
// their rate, at 500/700 of the nominal (stdlib/gpus.plan, h100_96gb_500w, says why).
constexpr double kPowerCappedClock = 500.0 / 700.0;

// The GPU of a run's `hardware.gpu` text, with the datasheet numbers of stdlib/gpus.plan (dense
// tensor-core peaks). Blackwell Ultra (B300, GB300) raises the FP4 rate; its BF16 and FP8 rates
// are those of B200 and GB200, with 288 GB of HBM3e.
GpuSpec GpuFor(const std::string& text) {
  const std::string t = Lower(text);
  constexpr double kGB = 1e9;
  GpuSpec g;
  if (Has(t, "a100") || Has(t, "a800")) {
    const bool small = Has(t, "40gb") || Has(t, "40 gb");
    g = {small ? "a100_sxm4_40gb" : "a100_sxm4_80gb",
         (small ? 40 : 80) * kGiB,
         312e12,
         312e12,
         0,
         small ? 1.555e12 : 2.039e12};
  } else if (Has(t, "gb300")) {
    g = {"gb300", static_cast<int64_t>(288 * kGB), 2500e12, 2500e12, 5000e12, 8e12};
  } else if (Has(t, "gb200")) {
    g = {"gb200", static_cast<int64_t>(186 * kGB), 2500e12, 2500e12, 5000e12, 8e12};
  } else if (Has(t, "b300")) {
    g = {"b300", static_cast<int64_t>(288 * kGB), 2250e12, 2250e12, 4500e12, 8e12};
  } else if (Has(t, "b200")) {
    g = {"b200", static_cast<int64_t>(180 * kGB), 2250e12, 2250e12, 4500e12, 8e12};
  } else if (Has(t, "h200")) {
    g = {"h200", static_cast<int64_t>(141 * kGB), 989e12, 989e12, 1979e12, 4.8e12};
  } else if (Has(t, "96gb") || Has(t, "96 gb")) {
    // torchtitan's hosts run it at a 500 W limit: the sustained tensor-core rate is 5/7 of the
    // nominal peaks (stdlib/gpus.plan, h100_96gb_500w).
    const double clock = Has(t, "500 w") || Has(t, "500w") ? kPowerCappedClock : 1.0;
    g = {"h100_96gb_hbm2e", 96 * kGiB, clock * 989e12, clock * 989e12, clock * 1979e12, 2.4e12};
  } else if (Has(t, "h800")) {
    g = {"h800_80gb", 80 * kGiB, 989e12, 989e12, 1979e12, 3.35e12};
  } else {
    g = {"h100_sxm5_80gb", 80 * kGiB, 989e12, 989e12, 1979e12, 3.35e12};
  }
  return g;
}

// The captions of torchtitan's December 2024 H100 benchmark (llama3_h100_202412_torchtitan.md):
// "Table 5 3D parallelism (FSDP + TP + PP) + torch.compile + Float8 + AsyncTP" and "Table 6 4D
// parallelism (FSDP + TP + PP + CP) + torch.compile + Float8 + AsyncTP + 1F1B" state for every
// row what the rows' own notes may leave out.
bool TorchtitanTableStatesCompileAndAsyncTp(const Case& c) {
  if (c.source != "torchtitan") return false;
  const std::string where = Lower(c.where);
  const bool december_2024 =
      Has(Lower(c.title), "202412") || Has(Lower(c.locator), "202412") || Has(c.id, "-2412-");
  return december_2024 && (Has(where, "table 5") || Has(where, "table 6"));
}

std::string StackFor(const Case& c) {
  const std::string &id = c.id, &source = c.source, &title = c.title;
  if (source == "narayanan21") return Has(id, "zero3") ? "deepspeed" : "megatron_lm_2021";
  if (source == "korthikanti22" || source == "mtnlg22") return "megatron_lm_2021";
  // MegaScale's Megatron-LM baseline is commit 285068c8 of January 2023 ("Integrate
  // FlashAttention into Megatron-LM"): before Megatron-Core and its overlap of the DP, TP and
  // pipeline traffic.
  if (Has(id, "megascale24-t2-megatron")) return "megatron_lm_2021";
  if (source == "megascale24" || source == "megatron-readme24" || source == "nemo2407" ||
      source == "nemo-longseq" || source == "mbridge")
    return "megatron_core";
  if (source == "llama3" || source == "torchtitan") return "torchtitan";
  if (source == "mosaic") return "llm_foundry";
  // A source outside the file's list: the software its title names.
  const std::string t = Lower(title);
  if (Has(t, "megatron-bridge") || Has(t, "megatron bridge") || Has(t, "nemo") ||
      Has(t, "megatron-core") || Has(t, "megatron core"))
    return "megatron_core";
  if (Has(t, "torchtitan") || Has(t, "llama 3")) return "torchtitan";
  if (Has(t, "llm-foundry") || Has(t, "llm foundry") || Has(t, "mosaicml")) return "llm_foundry";
  if (Has(t, "deepspeed") || Has(t, "zero-3") || Has(t, "zero3")) return "deepspeed";
  return "paraplan";
}

// Model FLOPs per token under a source's stated convention (to turn a published TFLOP/s or MFU
// into tokens/s); 0 when the convention is not one of these.
double ConventionFlopsPerToken(const std::string& convention, const ModelSpec& m) {
  const double h = D(m.hidden), s = D(m.seq_len), layers = D(m.layers), vocab = D(m.vocab);
  const std::string c = Lower(convention);
  if (Has(c, "eq.(3)")) return 96 * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h));
  if (Has(c, "eq.(7)") || Has(c, "narayanan/korthikanti model flops"))
    return 72 * layers * h * h * (1 + s / (6 * h) + vocab / (12 * h * layers));
  if (Has(c, "palm")) return 6 * D(TotalParams(m)) + 12 * layers * h * s;
  if (Has(c, "full s^2") || Has(c, "full, not causal") || Has(c, "pre-2025"))
    return ModelFlopsPerToken(m, false);
  if (Has(c, "half of s^2")) return ModelFlopsPerToken(m, true);
  return 0;
}

// The number written after `key` in `text` ("kv_lora_rank 512", "kv_lora_rank=512"); 0 if none.
int64_t NumberAfter(const std::string& text, std::string_view key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return 0;
  size_t i = at + key.size();
  while (i < text.size() && (text[i] == ' ' || text[i] == '=' || text[i] == ':')) ++i;
  int64_t v = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && v < (1 << 30); ++i)
    v = v * 10 + (text[i] - '0');
  return v;
}

// Megatron's --moe-layer-freq as a run states it: an integer k (every k-th layer is MoE), or
// the list / pattern forms whose leading zeros are the dense layers ("[0]*3+[1]*58",
// "[0,0,0,1,...]"). Other patterns leave the leading dense count (first_k_dense) as stated.
void ReadMoeLayerFreq(const Object* moe, ModelSpec& m) {
  if (auto k = moe->getInteger("moe_layer_freq"); k && *k >= 1) {
    m.moe_layer_freq = *k;
    return;
  }
  const std::string text = Str(moe, "moe_layer_freq");
  if (text.empty()) return;
  if (auto dense = interop::MoeListDenseLayers(text)) {
    m.dense_layers = std::max(m.dense_layers, *dense);
  } else if (auto k = interop::MoePatternDenseLayers(text)) {
    const int64_t v = std::atoll(k->c_str());
    if (v >= 0 && v < m.layers) m.dense_layers = std::max(m.dense_layers, v);
  }
}

// The attention variant's text: GQA's head size ("head_dim 128"), DeepSeek's multi-head latent
// attention ("MLA", with its ranks where stated, else DeepSeek-V3's: q_lora_rank 1536,
// kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128), and a sliding
// window used by every layer ("sliding window 4096"; a window on some layers only is not
// modelled, and those layers are priced with full attention).
void ReadAttentionVariant(const std::string& text, ModelSpec& m) {
  if (int64_t hd = NumberAfter(text, "head_dim"); hd > 0 && !Has(text, "v_head_dim"))
    m.head_dim = hd;
  if (Has(text, "mla") || Has(text, "latent attention")) {
    auto stated = [&](std::string_view key, int64_t fallback) {
      const int64_t v = NumberAfter(text, key);
      return v > 0 ? v : fallback;
    };
    m.q_lora_rank = Has(text, "q_lora_rank") ? NumberAfter(text, "q_lora_rank") : 1536;
    m.kv_lora_rank = stated("kv_lora_rank", 512);
    m.qk_nope_head_dim = stated("qk_nope_head_dim", 128);
    m.qk_rope_head_dim = stated("qk_rope_head_dim", 64);
    m.v_head_dim = stated("v_head_dim", 128);
    m.kv_heads = m.heads;
  }
  if (const int64_t w = NumberAfter(text, "sliding window");
      w > 0 && !Has(text, "alternating") && !Has(text, "interleaved") && !Has(text, "every other"))
    m.window = w;
}

// Reads one run; returns false (with `error`) on a malformed entry.
// The model of a run ("model" and seq_len). False, with `error`, when its dimensions are unusable.
bool ReadModel(const Object& run, const Object* model, Case& c, std::string& error) {
  ModelSpec& m = c.plan.model;
  m.name = Str(model, "name");
  m.layers = Int(model, "num_layers");
  m.hidden = Int(model, "hidden_size");
  m.heads = Int(model, "num_attention_heads");
  m.kv_heads = Int(model, "num_kv_heads", m.heads);
  m.head_dim = m.heads ? m.hidden / m.heads : 0;
  const std::string variant = Str(model, "attention_variant");
  const bool gated = model->getBoolean("gated_mlp").getValueOr(false);
  m.activation = gated ? Activation::kSwiGlu : Activation::kGelu;
  m.norm = gated ? Norm::kRmsNorm : Norm::kLayerNorm;
  m.position = gated ? Position::kRope : Position::kLearned;
  m.tied_embeddings = !gated;
  m.ffn_hidden =
      Int(model, "ffn_hidden_size", gated ? (8 * m.hidden / 3 + 255) / 256 * 256 : 4 * m.hidden);
  m.vocab = Int(model, "vocab_size", 51200);
  m.seq_len = Int(&run, "seq_len");
  if (const Object* moe = model->getObject("moe")) {
    m.experts = Int(moe, "num_experts");
    m.topk = Int(moe, "top_k");
    m.moe_ffn_hidden = Int(moe, "moe_ffn_hidden_size");
    m.shared_experts = Int(moe, "shared_experts");
    m.dense_layers = Int(moe, "first_k_dense");
    ReadMoeLayerFreq(moe, m);
    // Group-limited routing where stated (moe_router_num_groups / n_group, topk_group), else
    // DeepSeek's published configurations (stdlib/models/deepseek.plan): V2 (160 experts) keeps
    // a token's experts in 3 of 8 groups, V3 (256) in 4 of 8; V2-Lite (64) has no groups.
    const std::string name = Lower(m.name);
    m.router_groups = Int(moe, "router_groups", Int(moe, "n_group", 1));
    m.router_group_topk = Int(moe, "router_group_topk", Int(moe, "topk_group", 1));
    if (m.router_groups <= 1 && Has(name, "deepseek") && m.experts >= 160) {
      m.router_groups = 8;
      m.router_group_topk = Has(name, "v3") ? 4 : 3;
    }
    if (m.router_groups < 1 || m.router_group_topk < 1 || m.router_group_topk > m.router_groups ||
        m.experts % m.router_groups != 0) {
      m.router_groups = 1;
      m.router_group_topk = 1;
    }
    if (m.experts < 1 || m.topk < 1 || m.topk > m.experts || m.moe_ffn_hidden < 1) {
      error = "run " + c.id + " has a MoE without usable experts, top_k and moe_ffn_hidden_size";
      return false;
    }
  }
  ReadAttentionVariant(Lower(variant), m);
  m.mtp_layers = std::max<int64_t>(0, Int(model, "mtp_num_layers", Int(model, "mtp_layers")));
  const std::string described =
      Lower(Str(model, "dims_source") + " " + Str(model, "notes") + " " + variant);
  if (!gated && (Has(described, "squared relu") || Has(described, "squared_relu") ||
                 Has(described, "relu^2") || Has(described, "relu2")))
    m.activation = Activation::kSquaredRelu;
  if (m.layers < 1 || m.hidden < 1 || m.heads < 1 || m.seq_len < 1) {
    error = "run " + c.id + " has no usable model dimensions";
    return false;
  }
  return true;
}

// The cluster ("hardware"), the parallel layout ("parallelism") and the framework of a run.
// False, with `error`, when the layout does not fit the GPUs.
bool ReadLayout(const Object* par, const Object* hw, Case& c, std::string& error) {
  Plan& plan = c.plan;
  const ModelSpec& m = plan.model;
  // Cluster.
  const int64_t gpus = Int(hw, "num_gpus");
  const int64_t per_node = std::max<int64_t>(1, Int(hw, "gpus_per_node", 8));
  ClusterSpec& cl = plan.cluster;
  cl.gpu = GpuFor(Str(hw, "gpu"));
  const std::string& gpu = cl.gpu.name;
  const bool ampere = gpu.rfind("a100", 0) == 0;
  const bool blackwell = gpu == "b200" || gpu == "b300" || gpu == "gb200" || gpu == "gb300";
  // NVLink per direction: NVLink3 300 GB/s (A100), NVLink4 450 GB/s (H100; H800's 200 GB/s),
  // NVLink5 900 GB/s (Blackwell). Network per GPU: HDR 200 Gb/s on DGX A100, NDR 400 Gb/s on
  // DGX H100, B200 and GB200, ConnectX-8 800 Gb/s on B300 and GB300.
  cl.name = ampere ? "dgx_a100" : blackwell ? "dgx_" + gpu : "dgx_h100";
  cl.nvlink_bandwidth = ampere                      ? 300e9
                        : blackwell                 ? 900e9
                        : gpu.rfind("h800", 0) == 0 ? 200e9
                                                    : 450e9;
  cl.network_bandwidth = ampere ? 25e9 : gpu == "b300" || gpu == "gb300" ? 100e9 : 50e9;
  int64_t domain = per_node;
  if (gpu == "gb200" || gpu == "gb300") {
    // NVL72 racks: one NVLink domain of up to 72 GPUs, whatever the hosts' 4 GPUs a tray. A job
    // takes whole power-of-two blocks of a rack (64 of its 72 GPUs at most).
    domain = 1;
    while (domain * 2 <= std::min<int64_t>(gpus, 64) && gpus % (domain * 2) == 0) domain *= 2;
  }
  cl.gpus_per_node = gpus % domain == 0 ? domain : gpus;
  cl.nodes = gpus / cl.gpus_per_node;
  // Layout.
  ParallelSpec& p = plan.parallel;
  p.tp = Int(par, "tp", 1);
  p.pp = Int(par, "pp", 1);
  p.cp = Int(par, "cp", 1);
  p.ep = Int(par, "ep", 1);
  p.etp = Int(par, "etp", m.IsMoe() ? 1 : p.tp);
  if (gpus < 1 || p.tp < 1 || p.pp < 1 || p.cp < 1 || p.ep < 1 || p.etp < 1 ||
      gpus % (p.tp * p.pp * p.cp) != 0) {
    error = "run " + c.id +
            ": no GPUs, a parallel size below 1, or tp x pp x cp does not divide the GPU count";
    return false;
  }
  p.dp = gpus / (p.tp * p.pp * p.cp);
  if (m.layers % p.pp != 0) {
    plan.pipeline.account_for_embedding = true;
    plan.pipeline.account_for_loss = true;
  }
  c.stack = StackFor(c);
  for (Framework f : {Framework::kParaplan, Framework::kMegatronCore, Framework::kTorchtitan,
                      Framework::kDeepSpeed, Framework::kLlmFoundry, Framework::kMegatronLm2021})
    if (ToString(f) == c.stack) plan.framework = f;
  c.memory_framework = c.source == "llama3" ? Framework::kMegatronCore : plan.framework;
  // torchtitan's tables say which runs were compiled and which ran async TP: in the run's id
  // or notes, or for every row of a table in its caption.
  const bool whole_table = TorchtitanTableStatesCompileAndAsyncTp(c);
  if (Has(c.id, "asynctp") || Has(Lower(c.notes), "asynctp") || whole_table)
    p.tp_comm_overlap = true;
  if (c.stack == "torchtitan" && c.source != "llama3" &&
      (Has(Lower(c.id), "compile") || Has(Lower(c.notes), "compile") || whole_table))
    plan.compile = true;
  return true;
}

// The precision and the data-parallel sharding (ZeRO stage) of a run.
void ReadPrecisionAndSharding(const Object& run, const Object* par, Case& c) {
  Plan& plan = c.plan;
  // Precision.
  const std::string prec = Lower(Str(&run, "precision"));
  c.as_published = prec + " | " + Lower(Str(&run, "recompute"));
  if (Has(Lower(c.id), "tokendrop") || Has(Lower(c.notes), "token-drop"))
    c.as_published += " | token drop";
  plan.precision =
      Has(prec, "fp8") ? Precision::kFp8
      : Has(prec, "fp16") || (Has(prec, "mixed_16bit") && c.stack == "megatron_lm_2021")
          ? Precision::kFp16
          : Precision::kBf16;
  if (c.stack == "megatron_lm_2021" || c.stack == "deepspeed") plan.precision = Precision::kFp16;
  // torchao's row-wise scaling, where a run names it (torchtitan's tables do).
  if (plan.precision == Precision::kFp8 && (Has(prec, "rowwise") || Has(prec, "row-wise"))) {
    plan.mixed_precision.fp8 = Fp8Recipe::kRowwise;
    plan.origins[fields::kMixedPrecisionFp8].kind = OriginKind::kFile;
  }
  // NVIDIA's performance configurations reduce gradients in bf16: every Megatron-Bridge
  // performance recipe sets `ddp.grad_reduce_in_fp32 = False` (scripts/performance, releases
  // 25.11 to 26.06), and NeMo's 24.x performance configurations run the distributed fused Adam
  // with `optim.grad_sync_dtype: bf16`, so the main gradients are bf16 buffers.
  const std::string title = Lower(c.title);
  if (c.source == "mbridge" || c.source == "nemo2407" || c.source == "nemo-longseq" ||
      Has(title, "megatron-bridge") || Has(title, "nemo")) {
    plan.mixed_precision.grads = ElementType::kBf16;
    plan.origins[fields::kMixedPrecisionGrads].kind = OriginKind::kFile;
  }
  // Sharding.
  const std::string shard = Lower(Str(par, "dp_sharding"));
  int64_t zero = c.stack == "megatron_core" ? 1 : 0;
  if (Has(shard, "zero3") || Has(shard, "full shard") || Has(shard, "full_shard") ||
      Has(shard, "zero-3"))
    zero = 3;
  else if (Has(shard, "shard_grad_op") || Has(shard, "zero-2"))
    zero = 2;
  else if (Has(shard, "distributed optimizer") || Has(shard, "zero-1") || Has(shard, "zero1"))
    zero = 1;
  else if (Has(shard, "none"))
    zero = 0;
  plan.optimizer.zero = zero;
  // FSDP's HYBRID_SHARD (HSDP): sharded inside a node, replicated across nodes
  // ("_HYBRID_SHARD_ZERO2": the same with ZeRO 2).
  if (Has(shard, "hybrid")) {
    plan.optimizer.zero = Has(shard, "zero2") ? 2 : 3;
    const int64_t group = plan.parallel.dp * plan.parallel.cp;
    const int64_t shard_size = std::min(group, plan.cluster.gpus_per_node);
    if (shard_size > 0 && group % shard_size == 0 && group > shard_size) {
      plan.fsdp.shard = shard_size;
      plan.fsdp.replicate = group / shard_size;
    }
  }
  // torchtitan's FSDP2 with data_parallel_shard_degree below the DP size: HSDP, the shards over
  // dp_shard x cp ranks, replicated dp / dp_shard times.
  if (const int64_t n = NumberAfter(shard, "dp_shard");
      zero >= 2 && n > 0 && n < plan.parallel.dp && plan.parallel.dp % n == 0) {
    plan.fsdp.shard = n * plan.parallel.cp;
    plan.fsdp.replicate = plan.parallel.dp / n;
  }
}

// The batch and the settings a run states or leaves to be chosen: microbatch sizes, virtual
// stages, recomputation, sequence parallelism. False, with `error`, without a usable batch.
bool ReadBatchAndChoices(const Object& run, const Object* par, const Object* derived,
                         const std::set<std::string>& uncertain, Case& c, std::string& error) {
  Plan& plan = c.plan;
  const ModelSpec& m = plan.model;
  const ParallelSpec& p = plan.parallel;
  // Batch.
  int64_t global = Int(&run, "global_batch_size", 0);
  if (global <= 0) global = Int(derived, "local_batch_size_per_dp_rank", 1) * p.dp;
  if (global < 1) {
    error = "run " + c.id + " has no usable batch size";
    return false;
  }
  plan.batch.global = global;
  const bool source_is_torchtitan = c.source == "torchtitan";
  // Stated, torchtitan's whole local batch, or chosen (clang-tidy 14 takes the first two
  // assignments for clones).
  if (auto mb = run.getInteger("micro_batch_size"); mb && *mb >= 1)
    c.micros = {*mb};  // NOLINT(bugprone-branch-clone)
  else if (c.stack == "torchtitan" && p.pp == 1 && source_is_torchtitan)
    c.micros = {global / p.dp};  // torchtitan without pp runs its local batch in one step
  else if (c.stack == "torchtitan" && source_is_torchtitan && global % (p.dp * p.pp) == 0)
    // torchtitan splits the local batch into `pipeline_parallel_microbatches`, by default as
    // many as the pipeline degree (torchtitan 9dec370, parallelisms/pipelining_utils.py).
    c.micros = {global / (p.dp * p.pp)};
  else
    for (int64_t mb : {1, 2, 4, 8})
      if (global % (mb * p.dp) == 0) c.micros.push_back(mb);
  if (c.micros.empty()) c.micros = {1};
  // Interleaving: stated, or unknown (then chosen), or not used. Llama 3 states an interleaved
  // schedule with V stages per rank and a bubble of (pp - 1) / (V · m) but not V (Llama 3 paper,
  // Sec. 3.3.2, "Pipeline parallelism improvements"): its V is unknown, not 1. An uneven split
  // that counts the embedding and the loss as a layer each divides layers + 2 units.
  const bool interleaved_unstated = c.source == "llama3";
  const int64_t units = m.layers + (plan.pipeline.account_for_embedding ? 1 : 0) +
                        (plan.pipeline.account_for_loss ? 1 : 0);
  if (auto v = par->getInteger("vpp"))
    c.vpps = {*v};
  else if (source_is_torchtitan && uncertain.count("vpp") && p.pp > 1 && units % (p.pp * 2) == 0)
    // torchtitan's interleaved schedules default to two stages per rank when no split points
    // are given (torchtitan 9dec370, generate_split_points).
    c.vpps = {2};
  else if ((uncertain.count("vpp") || interleaved_unstated) && p.pp > 1) {
    for (int64_t v = 1; v <= 8; ++v)
      if (units % (p.pp * v) == 0) c.vpps.push_back(v);
  }
  if (c.vpps.empty()) c.vpps = {1};
  // Megatron-Bridge's performance recipes lay pipelines out by hand where Megatron's even split
  // leaves a stage heavy (pipeline_model_parallel_layout: "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL" for
  // Llama 3 70B on pp 8 x vpp 5, "Et|(tt|)*30mL" for DeepSeek-V3's 61 layers). The tables do not
  // print the layout, so the split of an interleaved run is chosen with the other unstated
  // fields: the even split or one balanced by the blocks' costs (`balance = cost`).
  const bool bridge = c.source == "mbridge" || Has(Lower(c.title), "megatron-bridge");
  if (p.pp > 1 && bridge) c.balances = {Balance::kEven, Balance::kCost};
  // Its MoE recipes dispatch with the all-to-all dispatcher or with HybridEP (the flex
  // dispatcher: DeepSeek-V3, Qwen3-30B-A3B over two nodes); the tables do not say which.
  if (m.IsMoe() && p.ep > 1 && bridge) c.dispatchers = {Dispatcher::kAllToAll, Dispatcher::kFlex};
  // Recompute and sequence parallelism: stated or chosen.
  const std::string rc = Lower(Str(&run, "recompute"));
  if (rc.rfind("none", 0) == 0)
    c.recomputes = {Recompute::kNone};
  else if (rc.rfind("full", 0) == 0)
    c.recomputes = {Recompute::kFull};
  else if (rc.rfind("selective", 0) == 0 || rc.rfind("partial", 0) == 0)
    c.recomputes = {Recompute::kSelective};
  else
    c.recomputes = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  c.sps = {false};  // no TP, or not stated and not on by default in the stack
  if (p.tp > 1) {
    if (auto sp = par->getBoolean("sequence_parallel"))
      c.sps = {*sp};
    else if (c.stack == "megatron_core" || c.stack == "torchtitan")
      c.sps = {true};
    else if (c.source == "megascale24")
      c.sps = {false, true};  // the 2023 code has SP (Korthikanti 2022); not on by default
  }
  return true;
}

// The measured throughput as tokens/s per GPU (from whichever quantity the source gives), the
// measured peak memory, and why a run is not scored.
void ReadMeasurement(const Object& run, const Object* measured, Case& c) {
  const ModelSpec& m = c.plan.model;
  const ClusterSpec& cl = c.plan.cluster;
  const int64_t gpus = cl.nodes * cl.gpus_per_node;
  const int64_t global = c.plan.batch.global;
  // The measurement as tokens/s per GPU.
  const double tokens_per_step = D(global) * D(m.seq_len);
  if (double v = Num(measured, "tokens_per_sec_per_gpu"); v > 0) {
    c.measured = v, c.measured_how = "tokens/s/GPU";
  } else if (double v = Num(measured, "tokens_per_sec_per_gpu_vanilla_tp"); v > 0) {
    c.measured = v, c.measured_how = "tokens/s/GPU";
  } else if (double v = Num(measured, "step_time_s");
             v > 0 && Int(&run, "global_batch_size", 0) > 0) {
    c.measured = tokens_per_step / v / D(gpus), c.measured_how = "step time";
  } else if (double v = Num(measured, "tokens_per_sec_total"); v > 0) {
    c.measured = v / D(gpus), c.measured_how = "tokens/s";
  } else {
    const double per_token = ConventionFlopsPerToken(Str(&run, "flops_convention"), m);
    double tflops = Num(measured, "tflops_per_gpu", Num(measured, "model_tflops_per_gpu"));
    if (tflops <= 0 && Num(measured, "mfu_pct") > 0) tflops = Num(measured, "mfu_pct") / 100 * 312;
    if (per_token > 0 && tflops > 0)
      c.measured = tflops * 1e12 / per_token, c.measured_how = "TFLOP/s by the source's FLOPs";
  }
  c.measured_mem_gib = Num(measured, "peak_memory_gib");
  c.group = m.name + " on " + cl.gpu.name;
  // What is not scored, and why.
  if (c.measured <= 0) c.why_unscored = "no throughput in a convention we can convert";
  if (Has(c.id, "megascale24-t2-megascale"))
    c.why_unscored =
        "MegaScale's own system: parallel block, sliding-window attention, LAMB (upper reference "
        "only)";
}

bool ReadCase(const Object& run, Case& c, std::string& error) {
  c.id = Str(&run, "id");
  c.source = SourceOf(c.id);
  if (const Object* source = run.getObject("source")) {
    c.title = Str(source, "title");
    c.where = Str(source, "where");
    c.locator = Str(source, "locator");
  }
  c.notes = Str(&run, "notes");
  const Object* model = run.getObject("model");
  const Object* par = run.getObject("parallelism");
  const Object* hw = run.getObject("hardware");
  const Object* measured = run.getObject("measured");
  const Object* derived = run.getObject("derived");
  if (c.id.empty() || !model || !par || !hw || !measured) {
    error = "run " + (c.id.empty() ? std::string("without id") : c.id) +
            " lacks model, parallelism, hardware or measured";
    return false;
  }
  std::set<std::string> uncertain;
  if (const llvm::json::Array* u = run.getArray("uncertain"))
    for (const llvm::json::Value& v : *u)
      if (auto s = v.getAsString()) uncertain.insert(s->str().substr(0, s->str().find(' ')));
  c.plan.name = c.id;
  if (!ReadModel(run, model, c, error) || !ReadLayout(par, hw, c, error)) return false;
  ReadPrecisionAndSharding(run, par, c);
  if (!ReadBatchAndChoices(run, par, derived, uncertain, c, error)) return false;
  ReadMeasurement(run, measured, c);
  return true;
}

struct Evaluation {
  double tokens = 0, step = 0;
  bool valid = false, fits = false;
  MemoryEstimate memory;
  std::string breakdown;
};

Evaluation Evaluate(const Plan& plan, const CostOptions& options,
                    const MemoryEstimate* memory = nullptr) {
  Evaluation e;
  e.memory = memory ? *memory : EstimateMemory(plan, options);
  const TimeEstimate t = EstimateTime(plan, options, e.memory);
  if (!e.memory.valid || !t.valid) return e;
  e.valid = true;
  // Within the memory model's own margin: choosing the unstated fields must not hinge on a
  // few GiB of estimate (the published runs did fit).
  e.fits =
      static_cast<double>(e.memory.peak) <= kFitMargin * static_cast<double>(e.memory.capacity);
  e.tokens = t.tokens_per_s_per_gpu;
  e.step = t.step_s;
  e.breakdown = PrintTime(t);
  return e;
}

// The fastest setting of a run's unstated fields that fits in memory (else the fastest), priced
// with `profile` (nullptr: the shipped profile of the run's stack).
struct Choice {
  Plan plan;
  Evaluation eval;
  bool found = false;
};

Choice ChooseFastest(const Case& c, const FrameworkProfile* profile) {
  Choice best;
  CostOptions priced_options = c.options;
  priced_options.profile = profile;
  for (Balance balance : c.balances)
    for (Dispatcher dispatcher : c.dispatchers)
      for (int64_t micro : c.micros)
        for (int64_t v : c.vpps)
          for (Recompute rc : c.recomputes)
            for (bool sp : c.sps) {
              // The recipes that lay their pipelines out by hand are the interleaved ones (Llama 3
              // 70B, DeepSeek-V3, Qwen3-235B-A22B); GPT-OSS on pp 4 without interleaving keeps the
              // even split.
              if (balance == Balance::kCost && v == 1 && c.balances.size() > 1) continue;
              Plan plan = c.plan;
              plan.batch.micro = micro;
              plan.parallel.vpp = v;
              plan.parallel.sp = sp;
              plan.recompute = rc;
              plan.pipeline.schedule = v > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B;
              plan.pipeline.balance = balance;
              plan.moe.dispatcher = dispatcher;
              if (balance == Balance::kCost) {
                plan.pipeline.account_for_embedding = false;
                plan.pipeline.account_for_loss = false;
              }
              if (plan.batch.global % (micro * plan.parallel.dp) != 0) continue;
              // Memory as the run's stack lays it out; it does not depend on the time profile.
              Plan priced = plan;
              priced.framework = c.memory_framework;
              const MemoryEstimate memory = EstimateMemory(priced, c.options);
              const Evaluation e = Evaluate(plan, priced_options, &memory);
              if (!e.valid) continue;
              const bool better = !best.found || (e.fits && !best.eval.fits) ||
                                  (e.fits == best.eval.fits && e.tokens > best.eval.tokens);
              if (!better) continue;
              best.plan = plan;
              best.eval = e;
              best.found = true;
            }
  return best;
}

// Chooses the unstated fields with the shipped profiles and records the prediction.
void Choose(Case& c) {
  if (!c.readable) return;
  Choice best = ChooseFastest(c, nullptr);
  // A layout Megatron's even split cannot make (layers over pp x vpp chunks) is one the run's
  // authors split by hand: the split balanced by cost stands for it.
  if (!best.found && c.plan.parallel.pp > 1 &&
      std::find(c.balances.begin(), c.balances.end(), Balance::kCost) == c.balances.end()) {
    c.balances = {Balance::kCost};
    best = ChooseFastest(c, nullptr);
  }
  if (!best.found) {
    c.why_unscored = "the model cannot lay the plan out";
    return;
  }
  c.chosen = best.plan;
  c.memory = best.eval.memory;
  c.predicted = best.eval.tokens;
  c.fits = best.eval.fits;
  c.breakdown = best.eval.breakdown;
}

double Error(double predicted, double measured) {
  return measured > 0 ? predicted / measured - 1 : 0;
}

using calibration::Stats;
using calibration::Summarize;

// The fitted numbers of a profile.
struct Fitted {
  double compute_scale = 1, attention_scale = 1, layer_overhead_s = 0, fp8_gemm_speedup = 1.6,
         shard_comm_scale = 1, ep_overlap = 0, moe_layer_overhead_s = 0, shard_interference = 0;
  static Fitted Of(const FrameworkProfile& p) {
    return {p.compute_scale,    p.attention_scale, p.layer_overhead_s,     p.fp8_gemm_speedup,
            p.shard_comm_scale, p.ep_overlap,      p.moe_layer_overhead_s, p.shard_interference};
  }
  void ApplyTo(FrameworkProfile& p) const {
    p.compute_scale = compute_scale;
    if (!p.attention_documented) p.attention_scale = attention_scale;
    p.layer_overhead_s = layer_overhead_s;
    p.fp8_gemm_speedup = fp8_gemm_speedup;
    p.shard_comm_scale = shard_comm_scale;
    p.ep_overlap = ep_overlap;
    p.moe_layer_overhead_s = moe_layer_overhead_s;
    p.shard_interference = shard_interference;
  }
};

// The unfitted starting point of a profile (what leave-one-source-out falls back to when no
// other source prices the profile): behaviour kept, the fitted numbers at their defaults.
Fitted Defaults(const FrameworkProfile& p) {
  Fitted f;
  f.fp8_gemm_speedup = FrameworkProfile{}.fp8_gemm_speedup;
  (void)p;
  return f;
}

// Mean |log(predicted / measured)| of the given cases with the fitted numbers `fit` in `base`,
// or (base == nullptr, a pooled fit) in each case's own profile.
double Loss(const std::vector<Case*>& cases, const FrameworkProfile* base, const Fitted& fit) {
  double sum = 0;
  for (Case* c : cases) {
    FrameworkProfile prof = base ? *base : ProfileFor(c->stack, c->plan.cluster.gpu);
    fit.ApplyTo(prof);
    CostOptions o = c->options;
    o.profile = &prof;
    const Evaluation e = Evaluate(c->chosen, o, &c->memory);
    sum += e.valid && e.tokens > 0 ? std::fabs(std::log(e.tokens / c->measured)) : 5;
  }
  return cases.empty() ? 0 : sum / D(cases.size());
}

// Which fitted numbers a search may move.
enum class FitScope : uint8_t {
  kAll,      // every number of the profile
  kKernels,  // only those that describe the GPU's kernels (compute, attention, FP8 rates); a
             // stack's own communication and fixed costs (shard_comm_scale, ep_overlap,
             // layer_overhead_s) keep their defaults
};

// The attention core's share of a model's forward FLOPs per token (causal: half of s keys).
double AttentionShare(const ModelSpec& m) {
  ModelSpec no_context = m;
  no_context.seq_len = 1;
  const double all = ModelFlopsPerToken(m, /*causal_halved=*/true);
  return all > 0 ? 1 - ModelFlopsPerToken(no_context, /*causal_halved=*/true) / all : 0;
}
// A run determines the attention rate when the core is at least this share of its FLOPs
// (Llama 2 7B: 8% at 4K, 14% at 8K, 40% at 32K; Qwen3-30B-A3B at 4K: 23%).
constexpr double kAttentionBoundShare = 0.2;

// Coordinate search over the fitted numbers of one profile (or, base == nullptr, of all the
// cases' profiles at once) on `cases`, from the defaults.
Fitted FitProfile(const std::vector<Case*>& cases, const FrameworkProfile* base,
                  FitScope scope = FitScope::kAll) {
  Fitted best = Defaults(base ? *base : FrameworkProfile{});
  if (cases.empty()) return best;
  bool fp8 = false, sharded = false, moe = false;
  int attention_bound = 0;
  for (Case* c : cases) {
    moe |= c->chosen.model.IsMoe() && c->chosen.parallel.ep > 1;
    fp8 |= c->chosen.precision == Precision::kFp8;
    sharded |= c->chosen.optimizer.zero >= 2;
    // The attention scale is fitted only where some profile does not document it, and only
    // from runs it matters to (AttentionShare): elsewhere it moves every prediction by a few
    // percent and the search uses it as one more speed knob.
    const FrameworkProfile& own = base ? *base : ProfileFor(c->stack, c->plan.cluster.gpu);
    if (own.flash_attention && !own.attention_documented &&
        AttentionShare(c->chosen.model) >= kAttentionBoundShare)
      ++attention_bound;
  }
  const bool flash = attention_bound >= 3;
  double loss = Loss(cases, base, best);
  // At most one fitted number per three runs, in this order of importance.
  std::vector<std::pair<double Fitted::*, std::vector<double>>> params;
  const std::vector<double> scales = {0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9,
                                      0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3,  1.4};
  const bool own = scope == FitScope::kAll;
  if (sharded && own)
    params.push_back({&Fitted::shard_comm_scale, {1, 1.5, 2, 3, 4, 5, 5.5, 6, 8, 10, 12}});
  if (sharded && own && base && base->shard == ShardStyle::kFsdp)
    params.push_back({&Fitted::shard_interference, {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0}});
  params.push_back({&Fitted::compute_scale, scales});
  if (flash)
    params.push_back(
        {&Fitted::attention_scale, {0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4}});
  if (fp8)
    params.push_back(
        {&Fitted::fp8_gemm_speedup, {1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0}});
  if (moe && own) params.push_back({&Fitted::ep_overlap, {0.0, 0.25, 0.5, 0.75, 0.9}});
  if (moe && own)
    params.push_back({&Fitted::moe_layer_overhead_s,
                      {0.0, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3, 4e-3, 5e-3, 6e-3}});
  if (own)
    params.push_back({&Fitted::layer_overhead_s,
                      {0.0, 0.1e-3, 0.2e-3, 0.4e-3, 0.7e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3}});
  params.resize(std::min(params.size(), cases.size() / 3));
  for (int round = 0; round < 3; ++round)
    for (const auto& [field, values] : params)
      for (double x : values) {
        Fitted f = best;
        f.*field = x;
        if (double l = Loss(cases, base, f); l < loss - 1e-12) loss = l, best = f;
      }
  return best;
}

std::string ProfileKey(const Case& c) {
  return std::string(c.stack) + "/" + std::string(EfficiencyFor(c.plan.cluster.gpu).name);
}

// Spearman rank correlation of two equally long series (ties get their mean rank).
double Spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& x) {
    std::vector<size_t> idx(x.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return x[i] < x[j]; });
    std::vector<double> r(x.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && x[idx[j + 1]] == x[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = (D(i) + D(j)) / 2;
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = D(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    cov += (ra[i] - ma) * (rb[i] - mb);
    va += (ra[i] - ma) * (ra[i] - ma);
    vb += (rb[i] - mb) * (rb[i] - mb);
  }
  return va > 0 && vb > 0 ? cov / std::sqrt(va * vb) : 1;
}

// The predicted peak as the run's framework reports it (torch's max_memory_reserved for the
// PyTorch stacks; planrun's arena), the largest over the stages; the device peak when the
// memory model gives no allocator figure.
double AllocatorPeakGiB(const Case& c) {
  Plan priced = c.chosen;
  priced.framework = c.memory_framework;
  const double peak = calibration::AllocatorPeakGiB(priced, c.options);
  return peak > 0 ? peak : D(c.memory.peak) / kGiB;
}

const char* RecomputeName(Recompute r) {
  return r == Recompute::kNone ? "none" : r == Recompute::kSelective ? "sel" : "full";
}

}  // namespace

// The scored cases of each profile ("stack/GPU generation").
using ProfileCases = std::map<std::string, std::vector<Case*>>;

// The shipped profile a profile key stands for.
const FrameworkProfile& BaseProfile(const ProfileCases& by_profile, const std::string& key) {
  const Case* c = by_profile.at(key).front();
  return ProfileFor(c->stack, c->plan.cluster.gpu);
}

// Reads the runs of `path` into `cases`. Returns an exit status when the program must stop (0:
// no reference file beside the repository, nothing to compare; 2: a malformed file).
std::optional<int> ReadRuns(const std::string& path, std::vector<Case>& cases) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) {
    std::fprintf(
        stderr,
        "paraplan_calibrate: no calibration runs at %s (the shared reference is not beside the "
        "repository); nothing to compare\n",
        path.c_str());
    return 0;
  }
  auto parsed = llvm::json::parse((*buffer)->getBuffer());
  if (!parsed) {
    std::fprintf(stderr, "paraplan_calibrate: %s: %s\n", path.c_str(),
                 llvm::toString(parsed.takeError()).c_str());
    return 2;
  }
  const llvm::json::Array* runs =
      parsed->getAsObject() ? parsed->getAsObject()->getArray("runs") : nullptr;
  if (!runs) {
    std::fprintf(stderr, "paraplan_calibrate: %s has no \"runs\" array\n", path.c_str());
    return 2;
  }
  // A run the model cannot read is reported and left unscored; the others are still priced.
  int unreadable = 0;
  for (const llvm::json::Value& value : *runs) {
    const Object* run = value.getAsObject();
    Case c;
    std::string error;
    if (!run || !ReadCase(*run, c, error)) {
      ++unreadable;
      std::fprintf(stderr, "paraplan_calibrate: %s: %s (not scored)\n", path.c_str(),
                   error.empty() ? "a run is not an object" : error.c_str());
      if (!run || c.id.empty()) continue;
      c.why_unscored = error;
      c.readable = false;
      cases.push_back(std::move(c));
      continue;
    }
    cases.push_back(std::move(c));
  }
  if (unreadable > 0)
    std::fprintf(stderr, "paraplan_calibrate: %d of %zu runs could not be read\n", unreadable,
                 runs->size());
  return std::nullopt;
}

// The Hopper set (cost_params.cpp) with its GEMM half-size fit without `left` (empty: on every
// run): for each candidate, every Hopper profile with three or more runs from the other sources
// is fit on them, and the candidate with the least summed |log error| over those runs is kept.
// None when no Hopper profile has the runs.
std::optional<GpuEfficiency> RefitHopperSet(const ProfileCases& by_profile,
                                            const std::string& left) {
  std::vector<std::pair<std::string, std::vector<Case*>>> hopper;
  for (const auto& [key, list] : by_profile) {
    if (key.substr(key.find('/') + 1) != "hopper") continue;
    std::vector<Case*> train;
    for (Case* c : list)
      if (c->source != left) train.push_back(c);
    if (train.size() >= 3) hopper.emplace_back(key, train);
  }
  if (hopper.empty()) return std::nullopt;
  GpuEfficiency set = EfficiencyFor(hopper.front().second.front()->plan.cluster.gpu);
  double best_half = set.gemm_half_flops, best = -1;
  for (double half : {4e9, 1e10, 2e10, 3e10, 5e10}) {
    set.gemm_half_flops = half;
    double sum = 0;
    for (auto& [key, train] : hopper) {
      for (Case* c : train) c->options.efficiency = &set;
      FrameworkProfile prof = BaseProfile(by_profile, key);
      sum += Loss(train, &prof, FitProfile(train, &prof)) * D(train.size());
      for (Case* c : train) c->options.efficiency = nullptr;
    }
    if (best < 0 || sum < best - 1e-12) best = sum, best_half = half;
  }
  set.gemm_half_flops = best_half;
  return set;
}

// --fit: each profile fitted on all of its runs.
void PrintInSampleFit(const ProfileCases& by_profile) {
  std::printf("in-sample fit per profile (mean |log error|):\n");
  for (auto& [key, list] : by_profile) {
    const FrameworkProfile& base = BaseProfile(by_profile, key);
    const Fitted f = FitProfile(list, &base);
    std::printf(
        "  %-26s %3zu runs  compute %.2f  attention %.2f  layer %.2f ms  fp8 %.1f  shard_comm "
        "%.1f  interference %.1f  ep_overlap %.2f  moe layer %.1f ms  (loss %.3f; "
        "shipped %.3f)\n",
        key.c_str(), list.size(), f.compute_scale,
        base.attention_documented ? base.attention_scale : f.attention_scale,
        1e3 * f.layer_overhead_s, f.fp8_gemm_speedup, f.shard_comm_scale, f.shard_interference,
        f.ep_overlap, 1e3 * f.moe_layer_overhead_s, Loss(list, &base, f),
        Loss(list, &base, Fitted::Of(base)));
  }
  if (const std::optional<GpuEfficiency> set = RefitHopperSet(by_profile, "")) {
    const GpuEfficiency& shipped = EfficiencyFor(GpuSpec{.name = "h100"});
    std::printf("  hopper set: GEMM half-size %.0e FLOP (shipped %.0e)\n", set->gemm_half_flops,
                shipped.gemm_half_flops);
  }
}

// The sources the Ampere efficiency set was fit on (cost_params.cpp): its large-GEMM fraction,
// GEMM half-size, elementwise passes and network bus fraction, and with them the 2021
// Megatron-LM profile's pipeline synchronisation.
bool AnchorsAmpereSet(const std::string& source) {
  return source == "narayanan21" || source == "korthikanti22";
}

// Refits the Ampere set's fitted numbers and the 2021 profile's p2p synchronisation on `rows`
// (the 2021 Megatron-LM rows of the sources left in), by coordinate search from the generic
// set's values and a 20 us exchange; the profile keeps its compute scale of 1.
GpuEfficiency RefitAmpereSet(const std::vector<Case*>& rows, FrameworkProfile& megatron2021) {
  GpuEfficiency set = EfficiencyFor(rows.front()->plan.cluster.gpu);
  const GpuEfficiency generic = EfficiencyFor(GpuSpec{});
  set.gemm_max_fraction = generic.gemm_max_fraction;
  set.gemm_half_flops = generic.gemm_half_flops;
  set.elementwise_passes = generic.elementwise_passes;
  set.network_bus_fraction = generic.network_bus_fraction;
  megatron2021.p2p_latency_s = FrameworkProfile{}.p2p_latency_s;
  auto loss = [&]() {
    double sum = 0;
    for (Case* c : rows) {
      CostOptions o = c->options;
      o.efficiency = &set;
      o.profile = &megatron2021;
      const Evaluation e = Evaluate(c->chosen, o, &c->memory);
      sum += e.valid && e.tokens > 0 ? std::fabs(std::log(e.tokens / c->measured)) : 5;
    }
    return sum / D(rows.size());
  };
  const std::vector<std::pair<double*, std::vector<double>>> params = {
      {&set.gemm_max_fraction, {0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9}},
      {&set.gemm_half_flops, {0.5e9, 1e9, 2e9, 4e9, 8e9}},
      {&set.elementwise_passes, {1, 1.5, 2, 2.5, 3, 4}},
      {&set.network_bus_fraction, {0.5, 0.6, 0.7, 0.8, 0.9}},
      {&megatron2021.p2p_latency_s, {20e-6, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3}},
  };
  double best = loss();
  for (int round = 0; round < 3; ++round)
    for (const auto& [field, values] : params) {
      double keep = *field;
      for (double x : values) {
        *field = x;
        if (const double l = loss(); l < best - 1e-12) best = l, keep = x;
      }
      *field = keep;
    }
  return set;
}

// Sets every scored case's `loso` prediction: the profiles refitted without its source.
void LeaveOneSourceOut(std::vector<Case>& cases, const ProfileCases& by_profile) {
  // Leave one source out: refit the profiles on the other sources, predict the source. A profile
  // with fewer than three rows from other sources is fit together with every other source's
  // rows on the same GPU generation (its own behaviour, the pooled numbers), but only in the
  // numbers that describe the GPU's kernels: another stack's gather code, expert overlap or
  // per-layer overhead says nothing about this one's, so those fall back to their defaults
  // (the NCCL ring time, no overlap, no overhead), and a behaviour the profile read off
  // its own rows (shard_prefetch_unfit) to what it would be without them.
  std::set<std::string> sources;
  for (const Case& c : cases)
    if (c.Scored()) sources.insert(c.source);
  // Without one of the Ampere set's own sources, the set's fitted numbers are refit first, on
  // the 2021 Megatron-LM rows left, and every Ampere profile of that round is fit and priced
  // on the refit set.
  const std::string ampere_2021 = "megatron_lm_2021/ampere";
  for (const std::string& left : sources) {
    std::optional<GpuEfficiency> ampere_set, hopper_set;
    FrameworkProfile megatron2021;
    if (AnchorsAmpereSet(left) && by_profile.count(ampere_2021)) {
      std::vector<Case*> rows;
      for (Case* c : by_profile.at(ampere_2021))
        if (c->source != left) rows.push_back(c);
      megatron2021 = BaseProfile(by_profile, ampere_2021);
      if (!rows.empty()) ampere_set = RefitAmpereSet(rows, megatron2021);
    }
    // Without a source of Hopper runs, the Hopper set's GEMM half-size is fit again on the rest.
    bool hopper_left = false;
    for (const Case& c : cases)
      hopper_left |=
          c.Scored() && c.source == left && EfficiencyFor(c.plan.cluster.gpu).name == "hopper";
    if (hopper_left) hopper_set = RefitHopperSet(by_profile, left);
    for (Case& c : cases) {
      const std::string_view gen = EfficiencyFor(c.plan.cluster.gpu).name;
      c.options.efficiency = ampere_set && gen == "ampere"   ? &*ampere_set
                             : hopper_set && gen == "hopper" ? &*hopper_set
                                                             : nullptr;
    }
    for (auto& [key, list] : by_profile) {
      std::vector<Case*> train, test;
      for (Case* c : list) (c->source == left ? test : train).push_back(c);
      if (test.empty()) continue;
      FrameworkProfile prof = BaseProfile(by_profile, key);
      if (ampere_set && key == ampere_2021) prof.p2p_latency_s = megatron2021.p2p_latency_s;
      if (train.size() >= 3) {
        FitProfile(train, &prof).ApplyTo(prof);
      } else {
        const std::string gen = key.substr(key.find('/') + 1);
        std::vector<Case*> pool = train;
        for (auto& [other, rows] : by_profile)
          if (other != key && other.substr(other.find('/') + 1) == gen)
            for (Case* c : rows)
              if (c->source != left) pool.push_back(c);
        FitProfile(pool, nullptr, FitScope::kKernels).ApplyTo(prof);
        // A behaviour read off the left-out rows themselves goes back to what it would be
        // without them (DeepSpeed's prefetch share).
        if (prof.shard_prefetch_unfit >= 0) prof.shard_prefetch = prof.shard_prefetch_unfit;
      }
      // The unstated fields are chosen again with the refitted numbers: the choice of the
      // fastest setting must not see the left-out source either.
      for (Case* c : test) c->loso = ChooseFastest(*c, &prof).eval.tokens;
    }
  }
  for (Case& c : cases) c.options.efficiency = nullptr;
}

// One line (or CSV row) per run.
// The settings a run's plan takes that the table's columns do not show, as plan text (what a
// plan written for the run states to get the same prediction).
std::string ChosenSettings(const Case& c) {
  std::string out;
  auto add = [&](const std::string& text) { out += (out.empty() ? "" : "  ") + text; };
  const Plan& p = c.chosen;
  if (p.pipeline.balance == Balance::kCost) add("pipeline.balance = cost");
  if (p.pipeline.account_for_embedding) add("pipeline.account_for_embedding = true");
  if (p.pipeline.account_for_loss) add("pipeline.account_for_loss = true");
  if (p.moe.dispatcher == Dispatcher::kFlex) add("moe.dispatcher = flex");
  if (p.compile) add("compile = true");
  if (p.fsdp.replicate > 1)
    add("fsdp { shard = " + std::to_string(p.fsdp.shard) +
        "  replicate = " + std::to_string(p.fsdp.replicate) + " }");
  if (p.model.router_groups > 1)
    add("model { router_groups = " + std::to_string(p.model.router_groups) +
        "  router_group_topk = " + std::to_string(p.model.router_group_topk) + " }");
  return out;
}

void PrintRuns(const std::vector<Case>& cases, bool csv, bool verbose) {
  // Per run.
  if (csv)
    std::printf(
        "id,source,profile,measured_tokens_per_gpu,predicted,error_pct,loso_predicted,loso_error_"
        "pct,micro,vpp,"
        "recompute,sp,scored,measured_peak_gib,predicted_peak_gib,fits\n");
  else
    std::printf("%-48s %-24s %10s %10s %8s %8s %4s %3s %4s %3s %13s\n", "run", "profile",
                "measured", "predicted", "error", "LOSO", "mb", "vpp", "rc", "sp", "peak GiB m/p");
  for (const Case& c : cases) {
    const double pk = AllocatorPeakGiB(c);
    const std::string key = ProfileKey(c);
    if (csv) {
      std::printf("%s,%s,%s,%.7g,%.7g,%.1f,%.7g,%.1f,%lld,%lld,%s,%d,%d,%.1f,%.1f,%d\n",
                  c.id.c_str(), c.source.c_str(), key.c_str(), c.measured, c.predicted,
                  100 * Error(c.predicted, c.measured), c.loso, 100 * Error(c.loso, c.measured),
                  (long long)c.chosen.batch.micro, (long long)c.chosen.parallel.vpp,
                  RecomputeName(c.chosen.recompute), c.chosen.parallel.sp ? 1 : 0,
                  c.Scored() ? 1 : 0, c.measured_mem_gib, pk, c.fits ? 1 : 0);
      continue;
    }
    char mem[32] = "";
    if (c.measured_mem_gib > 0)
      std::snprintf(mem, sizeof mem, "%.1f/%.1f", c.measured_mem_gib, pk);
    else
      std::snprintf(mem, sizeof mem, "-/%.1f", pk);
    if (c.Scored())
      std::printf("%-48s %-24s %10.4g %10.4g %+7.1f%% %+7.1f%% %4lld %3lld %4s %3s %13s%s\n",
                  c.id.c_str(), key.c_str(), c.measured, c.predicted,
                  100 * Error(c.predicted, c.measured), 100 * Error(c.loso, c.measured),
                  (long long)c.chosen.batch.micro, (long long)c.chosen.parallel.vpp,
                  RecomputeName(c.chosen.recompute), c.chosen.parallel.sp ? "on" : "off", mem,
                  c.fits ? "" : " (does not fit)");
    else
      std::printf("%-48s %-24s %10.4g %10.4g   (not scored: %s)\n", c.id.c_str(), key.c_str(),
                  c.measured, c.predicted, c.why_unscored.c_str());
    if (verbose) {
      std::printf("    %s", c.breakdown.c_str());
      if (const std::string chosen = ChosenSettings(c); !chosen.empty())
        std::printf("    chosen beside the columns: %s\n", chosen.c_str());
    }
  }
}

// Pairs of runs within a group: how many keep their measured order, and the measured gap of
// each pair that does not.
void PrintPairs(const std::map<std::string, std::vector<const Case*>>& groups) {
  int pairs = 0, kept = 0;
  std::vector<double> gaps;  // measured gap of each flipped pair, as a fraction of the slower
  for (const auto& [g, list] : groups)
    for (size_t i = 0; i < list.size(); ++i)
      for (size_t j = 0; j < list.size(); ++j) {
        const Case& a = *list[i];
        const Case& b = *list[j];
        if (!(a.measured < b.measured)) continue;
        ++pairs;
        if (a.predicted < b.predicted)
          ++kept;
        else
          gaps.push_back(b.measured / a.measured - 1);
      }
  if (pairs == 0) return;
  std::sort(gaps.begin(), gaps.end());
  int within3 = 0;
  for (double gap : gaps) within3 += gap <= 0.03 ? 1 : 0;
  std::printf("  pairs within a group in the measured order: %d of %d", kept, pairs);
  if (!gaps.empty())
    std::printf("; of the %zu flipped, %d measured within 3%% of each other (median gap %.1f%%)",
                gaps.size(), within3, 100 * gaps[gaps.size() / 2]);
  std::printf("\n");
}

// The same layout measured more than once (the same plan as read, in several software releases
// or tables): how far apart its measurements are. No model of the layout can order runs closer
// than this.
void PrintRepeats(const std::vector<Case>& cases) {
  std::map<std::string, std::vector<const Case*>> same;
  for (const Case& c : cases) {
    if (!c.Scored()) continue;
    Plan key = c.plan;
    key.name.clear();
    std::string text = PrintPlan(key) + c.as_published;
    // The candidates of the unstated fields are part of the layout as read.
    for (int64_t v : c.micros) text += " micro " + std::to_string(v);
    for (int64_t v : c.vpps) text += " vpp " + std::to_string(v);
    for (Recompute r : c.recomputes) text += std::string(" ") + RecomputeName(r);
    for (bool sp : c.sps) text += sp ? " sp" : " no-sp";
    same[text].push_back(&c);
  }
  std::vector<double> spreads;
  bool header = false;
  for (const auto& [key, list] : same) {
    if (list.size() < 2) continue;
    double lo = list.front()->measured, hi = lo;
    for (const Case* c : list) lo = std::min(lo, c->measured), hi = std::max(hi, c->measured);
    spreads.push_back(hi / lo - 1);
    if (!header)
      std::printf("\nrepeat measurements (one layout, as read, measured more than once):\n");
    header = true;
    std::printf("  %-36s %zu runs  %.4g to %.4g tokens/s per GPU  spread %.1f%%\n",
                list.front()->group.c_str(), list.size(), lo, hi, 100 * spreads.back());
  }
  if (spreads.empty()) return;
  std::sort(spreads.begin(), spreads.end());
  std::printf("  %zu layout%s measured more than once; median spread %.1f%%, largest %.1f%%\n",
              spreads.size(), spreads.size() == 1 ? "" : "s", 100 * spreads[spreads.size() / 2],
              100 * spreads.back());
}

// The accuracy each profile ships (FrameworkProfile::checked, which `planc explain` prints)
// against the leave-one-source-out errors of its runs here: a line for each that differs.
void CheckShippedAccuracy(const std::map<std::string, std::pair<const Case*, Stats>>& loso) {
  for (const auto& [key, entry] : loso) {
    const auto& [c, st] = entry;
    const FrameworkProfile& p = ProfileFor(c->stack, c->plan.cluster.gpu);
    const double median = std::round(1000 * st.median) / 10, p90 = std::round(1000 * st.p90) / 10;
    if (p.checked.runs == static_cast<int>(st.n) &&
        std::fabs(p.checked.median_pct - median) < 0.05 &&
        std::fabs(p.checked.p90_pct - p90) < 0.05)
      continue;
    std::printf(
        "  shipped accuracy of %s is stale: cost_framework.cpp says %d runs, median %.1f%%, p90 "
        "%.1f%%; here %zu runs, median %.1f%%, p90 %.1f%%\n",
        key.c_str(), p.checked.runs, p.checked.median_pct, p.checked.p90_pct, st.n, median, p90);
  }
}

// Errors per source, per profile and overall; the order within groups; peak memory. With
// `shipped`, the file is the one the profiles' shipped accuracy comes from.
void PrintSummaries(const std::vector<Case>& cases, bool shipped) {
  // Summaries.
  auto line = [](const char* label, const Stats& in, const Stats& lo) {
    std::printf(
        "  %-26s %4zu  median %5.1f%%  p90 %6.1f%%  within 25%% %3.0f   | LOSO median %5.1f%%  p90 "
        "%6.1f%%\n",
        label, in.n, 100 * in.median, 100 * in.p90, in.within25, 100 * lo.median, 100 * lo.p90);
  };
  std::vector<double> all_in, all_lo;
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> per_source,
      per_profile;
  std::map<std::string, const Case*> first_of;
  for (const Case& c : cases) {
    if (!c.Scored()) continue;
    const double ei = Error(c.predicted, c.measured), el = Error(c.loso, c.measured);
    all_in.push_back(ei), all_lo.push_back(el);
    per_source[c.source].first.push_back(ei), per_source[c.source].second.push_back(el);
    per_profile[ProfileKey(c)].first.push_back(ei), per_profile[ProfileKey(c)].second.push_back(el);
    first_of.emplace(ProfileKey(c), &c);
  }
  std::printf("\nper source (in-sample | leave-one-source-out):\n");
  for (const auto& [s, e] : per_source) line(s.c_str(), Summarize(e.first), Summarize(e.second));
  std::printf("per profile:\n");
  for (const auto& [s, e] : per_profile) line(s.c_str(), Summarize(e.first), Summarize(e.second));
  if (shipped) {
    std::map<std::string, std::pair<const Case*, Stats>> loso;
    for (const auto& [s, e] : per_profile) loso[s] = {first_of.at(s), Summarize(e.second)};
    CheckShippedAccuracy(loso);
  }
  line("all scored runs", Summarize(all_in), Summarize(all_lo));
  int signed_fast = 0;
  for (double e : all_in) signed_fast += e > 0 ? 1 : 0;
  std::printf("  %d of %zu predicted faster than measured\n", signed_fast, all_in.size());

  // Within-group order: runs of one model on one GPU type.
  std::map<std::string, std::vector<const Case*>> groups;
  for (const Case& c : cases)
    if (c.Scored()) groups[c.group].push_back(&c);
  std::printf(
      "\nwithin-group order (runs of one model on one GPU type, by tokens/s per GPU; in-sample | "
      "leave-one-source-out):\n");
  struct Order {
    int same = 0;
    double rho_sum = 0;
  };
  Order in_order, loso_order;
  int total = 0;
  // Spearman and whether every measured inequality holds among the predictions.
  auto rank = [](const std::vector<double>& meas, const std::vector<double>& pred, Order& acc) {
    const double rho = Spearman(meas, pred);
    bool order = true;
    for (size_t i = 0; i < meas.size(); ++i)
      for (size_t j = 0; j < meas.size(); ++j)
        if (meas[i] < meas[j] && !(pred[i] < pred[j])) order = false;
    acc.same += order ? 1 : 0;
    acc.rho_sum += rho;
    return std::make_pair(rho, order);
  };
  for (const auto& [g, list] : groups) {
    if (list.size() < 2) continue;
    std::vector<double> meas, pred, loso;
    for (const Case* c : list)
      meas.push_back(c->measured), pred.push_back(c->predicted), loso.push_back(c->loso);
    ++total;
    const auto [rho, order] = rank(meas, pred, in_order);
    const auto [rho_loso, order_loso] = rank(meas, loso, loso_order);
    std::printf("  %-36s %2zu runs  Spearman %+.2f  %-13s | LOSO %+.2f  %s\n", g.c_str(),
                list.size(), rho, order ? "same order" : "order differs", rho_loso,
                order_loso ? "same order" : "order differs");
  }
  if (total > 0) {
    std::printf("  %d of %d groups in the measured order; mean Spearman %.2f\n", in_order.same,
                total, in_order.rho_sum / total);
    std::printf(
        "  leave-one-source-out: %d of %d groups in the measured order; mean Spearman %.2f\n",
        loso_order.same, total, loso_order.rho_sum / total);
  }
  PrintPairs(groups);
  PrintRepeats(cases);
}

// The memory section (memory_points.h): the runs with a measured peak as chosen above, and the
// file's memory references.
bool PrintMemory(const std::string& path, const std::vector<Case>& cases) {
  std::vector<calibration::MeasuredPeak> peaks;
  for (const Case& c : cases) {
    if (c.measured_mem_gib <= 0 || !c.memory.valid) continue;
    calibration::MeasuredPeak run{c.id, c.source, c.chosen, c.options, c.measured_mem_gib};
    run.plan.framework = c.memory_framework;
    peaks.push_back(std::move(run));
  }
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) return false;
  auto parsed = llvm::json::parse((*buffer)->getBuffer());
  if (!parsed) {
    llvm::consumeError(parsed.takeError());
    return false;
  }
  const Object* root = parsed->getAsObject();
  return root && calibration::PrintMemoryReport(*root, peaks, PARAPLAN_MEMORY_PLANS);
}

int main(int argc, char** argv) {
  std::string path = PARAPLAN_CALIBRATION_RUNS;
  bool csv = false, verbose = false, fit = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--csv")
      csv = true;
    else if (a == "--verbose")
      verbose = true;
    else if (a == "--fit")
      fit = true;
    else if (a == "-h" || a == "--help") {
      std::printf("usage: paraplan_calibrate [runs.json] [--csv] [--verbose] [--fit]\n");
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "paraplan_calibrate: unknown option %s\n", a.c_str());
      return 2;
    } else {
      path = a;
    }
  }
  std::vector<Case> cases;
  if (const std::optional<int> rc = ReadRuns(path, cases)) return *rc;
  for (Case& c : cases) Choose(c);
  // Profiles and the cases each one prices.
  ProfileCases by_profile;
  for (Case& c : cases)
    if (c.Scored()) by_profile[ProfileKey(c)].push_back(&c);
  if (fit) {
    PrintInSampleFit(by_profile);
    return 0;
  }
  LeaveOneSourceOut(cases, by_profile);
  PrintRuns(cases, csv, verbose);
  if (csv) return 0;
  PrintSummaries(cases, path == PARAPLAN_CALIBRATION_RUNS);
  return PrintMemory(path, cases) ? 0 : 2;
}
