// Every parallel layout equals the one-rank run. Each case lowers a tiny plan with the real
// compiler (compiler/lower: schedules, bodies with the TP/SP collectives, ZeRO steps, memory
// plan, whole-world verification), writes and reloads the program file, trains it for 5 steps
// with the real interpreter on the bundled text, and compares with the same plan on one rank
// (same model, seed, global batch and data): the loss of every step and every final weight must
// agree within 1e-5 relative. Weights are compared per tensor two ways, both within 1e-5:
// ||got - want|| / ||want|| (Frobenius, as Megatron's layout-equivalence tests measure it) and
// the largest element difference over the tensor's largest magnitude.
//
// Sharded runs are not bitwise equal to the one-rank run, even where the math is the same: the
// host GEMMs run on OpenBLAS, whose blocking and edge kernels depend on the GEMM's shape, so a
// column- or row-sharded GEMM rounds differently in the last bits from the whole one (besides
// the different reduction order of row-parallel GEMMs and of the TP/DP all-reduces). The 1e-5
// tolerance covers that; each layout repeats bitwise from run to run.
//
// The plans use Adam eps = 1e-5. Adam divides every gradient element by its own running
// magnitude, so an element whose gradient is tiny (a near-dead GELU unit, a key bias, whose
// gradient is exactly zero in exact arithmetic because softmax ignores a shift shared by all
// keys) turns the rounding difference of another reduction order into an update difference of
// up to lr. With eps = 1e-8 the losses still agree within 1e-7 but single elements differ by up
// to 6.5e-4 of their tensor's largest value (Frobenius up to 2.1e-5); eps = 1e-5 keeps such
// elements in the linear regime and every layout then agrees element by element. Key biases
// are still left out: they start at zero and receive only that rounding noise, so they stay
// near 1e-7 in every layout and any relative comparison of them compares noise with noise. So
// is the bias of a LayerNorm key norm (model.qk_norm), added to every key alike.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>

#include "compiler/lower/lower.h"
#include "compiler/lower/memory_plan.h"
#include "runtime/exec/interpreter.h"
#include "runtime/format/ops.h"

using namespace paraplan::exec;
namespace fs = std::filesystem;

namespace {

constexpr double kTolerance = 1e-5;
// Every element of every tensor within 2e-5 of its tensor's largest value. An element whose
// gradient is near zero carries the GEMMs' rounding into its Adam update almost undiminished,
// and how a sharded GEMM rounds depends on OpenBLAS's kernel: with the SkylakeX kernel the
// largest difference is 9.7e-6 (element (63, 55) of layers.3.attention.wo), with the Haswell
// kernel (OPENBLAS_CORETYPE=Haswell on an AVX-512 machine) 1.6e-5. Experts split by tensor
// parallelism (etp = tp) sum each expert's down projection and its input gradient from two
// halves of the ffn and reach 1.15e-5 on that element with the SkylakeX kernel. The losses and
// every tensor's Frobenius difference stay within kTolerance (losses 1e-7, weights 1e-6).
constexpr double kElementTolerance = 2e-5;

std::string SourceDir() {
  const char* dir = std::getenv("PARAPLAN_SOURCE_DIR");
  return dir ? dir : ".";
}

struct Layout {
  int tp = 1, pp = 1, dp = 1, vpp = 1;
  paraplan::Schedule schedule = paraplan::Schedule::k1F1B;
  bool sp = false;
  int zero = 0;
  paraplan::Recompute recompute = paraplan::Recompute::kNone;
  bool sgd = false;
  int cp = 1;            // context parallelism (ring attention over 2·cp chunks of each sequence)
  bool moe = false;      // the Llama-style model with mixture-of-experts layers (TinyPlan)
  int ep = 1;            // expert parallelism (moe): experts / ep experts per rank, carved from dp
  bool etp = false;      // moe: each expert split over the Tp group (etp = tp), else etp = 1
  bool qk_norm = false;  // queries and keys normalised per head (model.qk_norm)
  bool squared_relu = false;  // the Llama-style model with a squared-ReLU MLP (Nemotron-4)
  int window = 0;             // sliding-window attention over this many keys (model.window)
  // Full recompute by layers: activations.recompute_layers and recompute_method (block, else
  // uniform); 0 = every layer.
  int recompute_layers = 0;
  bool recompute_block = false;
  // Selective recompute's modules (activations.recompute_modules); empty = the attention core.
  const char* recompute_modules = "";
  int mtp = 0;  // multi-token prediction modules (model.mtp_layers), weighted 0.3
};

// The tiny models of the suite: Llama-style (RMSNorm, SwiGLU, RoPE, GQA, untied) or GPT-2-style
// (LayerNorm, GELU, learned positions, tied embeddings, biases as the compiler emits them).
paraplan::Plan TinyPlan(bool gpt, const Layout& l) {
  paraplan::Plan plan;
  plan.name = gpt ? "tiny_gpt" : "tiny_llama";
  auto& m = plan.model;
  m.name = plan.name;
  m.layers = 4;
  m.hidden = 64;
  m.heads = 4;
  m.kv_heads = gpt ? 4 : 2;
  m.head_dim = 16;
  m.ffn_hidden = gpt ? 256 : 128;
  m.vocab = 259;
  m.seq_len = 16;
  if (gpt) {
    m.norm = paraplan::Norm::kLayerNorm;
    m.activation = paraplan::Activation::kGelu;
    m.position = paraplan::Position::kLearned;
    m.tied_embeddings = true;
  }
  if (l.moe) {
    // Mixture of experts: a leading dense layer, then every second layer MoE (layers 1 and 3),
    // 4 experts, 2 per token, one shared expert; experts whole on every rank (ep = etp = 1)
    // unless the layout splits them over the Tp group (l.etp: etp = tp).
    plan.name = m.name = gpt ? "tiny_gpt_moe" : "tiny_moe";
    m.experts = 4;
    m.topk = 2;
    m.moe_ffn_hidden = 64;
    m.shared_experts = 1;
    m.dense_layers = 1;
    m.moe_layer_freq = 2;
  }
  m.qk_norm = l.qk_norm;
  m.window = l.window;
  m.mtp_layers = l.mtp;
  m.mtp_loss_scale = 0.3;
  if (l.squared_relu) m.activation = paraplan::Activation::kSquaredRelu;
  plan.cluster.nodes = 1;
  plan.cluster.gpus_per_node = int64_t{l.tp} * l.pp * l.dp * l.cp;
  plan.parallel.cp = l.cp;
  plan.parallel.tp = l.tp;
  plan.parallel.etp = l.moe && !l.etp ? 1 : l.tp;
  plan.parallel.pp = l.pp;
  plan.parallel.dp = l.dp;
  plan.parallel.ep = l.ep;
  plan.parallel.vpp = l.vpp;
  plan.parallel.sp = l.sp;
  plan.pipeline.schedule = l.schedule;
  plan.optimizer.zero = l.zero;
  if (l.sgd) plan.optimizer.type = paraplan::OptimizerType::kSgd;
  plan.recompute = l.recompute;
  plan.activations.recompute_layers = l.recompute_layers;
  plan.activations.recompute_modules = l.recompute_modules;
  plan.activations.recompute_method =
      l.recompute_block ? paraplan::RecomputeMethod::kBlock : paraplan::RecomputeMethod::kUniform;
  plan.optimizer.lr = 3e-3;
  plan.optimizer.min_lr = 3e-4;
  plan.optimizer.warmup_steps = 2;
  plan.optimizer.eps = 1e-5;  // see the top of this file
  plan.precision = paraplan::Precision::kFp32;
  plan.batch.micro = 2;
  plan.batch.global = 8;
  plan.train.steps = 5;
  plan.train.seed = 1234;
  return plan;
}

ProgramImage Compile(const paraplan::Plan& plan) {
  paraplan::DiagnosticSink sink;
  auto program = paraplan::lower::LowerPlan(plan, {}, sink);
  for (const auto& d : sink.diagnostics()) MESSAGE(d.message);
  REQUIRE(program.has_value());
  const std::vector<uint8_t> bytes = paraplan::lower::ToFlatBuffer(*program);
  return DecodeProgramImage(bytes.data(), bytes.size(), plan.name);
}

RunResult Run(const ProgramImage& program) {
  RunOptions options;
  options.data_path = SourceDir() + "/data/corpus/classics.txt";
  options.steps = 5;
  options.comm_timeout_seconds = 120;
  return Train(program, options);
}

struct Comparison {
  double loss = 0, weights = 0, max_elementwise = 0;
  double grad_norm = 0;  // largest relative difference of a step's grad norm (before clipping)
  std::string worst_param;
};

Comparison Compare(const RunResult& got, const RunResult& want) {
  Comparison c;
  REQUIRE(got.steps.size() == want.steps.size());
  for (size_t s = 0; s < got.steps.size(); ++s) {
    c.loss = std::max(
        c.loss, std::abs(got.steps[s].loss - want.steps[s].loss) / std::abs(want.steps[s].loss));
    c.grad_norm = std::max(c.grad_norm, std::abs(got.steps[s].grad_norm - want.steps[s].grad_norm) /
                                            std::max(std::abs(want.steps[s].grad_norm), 1e-30));
    // Multi-token prediction's loss (NaN in both without it).
    REQUIRE(std::isfinite(got.steps[s].mtp_loss) == std::isfinite(want.steps[s].mtp_loss));
    if (std::isfinite(want.steps[s].mtp_loss))
      c.loss = std::max(c.loss, std::abs(got.steps[s].mtp_loss - want.steps[s].mtp_loss) /
                                    std::abs(want.steps[s].mtp_loss));
  }
  for (const auto& param : want.params) {
    // Named copies, not structured bindings: doctest's message lambdas capture them.
    const auto& name = param.first;
    const auto& w = param.second;
    auto ends_with = [&](std::string_view tail) {
      return name.size() >= tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with(".bk") || ends_with(".k_norm.bias")) continue;  // see above
    auto it = got.params.find(name);
    REQUIRE_MESSAGE(it != got.params.end(), "parameter " << name << " missing");
    // The padded vocabulary grows with tp (a multiple of 128·tp): compare the common rows, which
    // hold the same elements (initialisation is by row-major index of the unsharded tensor).
    const size_t n = std::min(it->second.size(), w.size());
    REQUIRE(n > 0);
    double diff = 0, scale = 1e-30, dmax = 0, wmax = 1e-30;
    for (size_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(it->second[i]) - w[i];
      diff += d * d;
      scale += static_cast<double>(w[i]) * w[i];
      dmax = std::max(dmax, std::abs(d));
      wmax = std::max(wmax, std::abs(static_cast<double>(w[i])));
    }
    const double rel = std::sqrt(diff / scale);
    if (dmax / wmax > c.max_elementwise) c.max_elementwise = dmax / wmax;
    if (rel > c.weights) {
      c.weights = rel;
      c.worst_param = name;
    }
  }
  return c;
}

std::string Dir() {
  static const std::string kDir = [] {
    auto d = fs::temp_directory_path() / ("paraplan_equivalence_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return kDir;
}

// `planc compile FILE --plan NAME` through the binary (FILE relative to the source tree).
ProgramImage PlancCompile(const std::string& plan,
                          const std::string& file = "tests/equivalence/equivalence.plan") {
  const std::string out = Dir() + "/" + plan + ".pplan", log = Dir() + "/" + plan + ".log";
  const std::string cmd = std::string(PARAPLAN_PLANC) + " compile '" + SourceDir() + "/" + file +
                          "' --plan " + plan + " -o '" + out + "' > '" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::ostringstream text;
  text << in.rdbuf();
  REQUIRE_MESSAGE(rc == 0, "planc compile --plan " << plan << " failed:\n" << text.str());
  return LoadProgramImage(out);
}

// Compares a run with its reference: losses and weights within the suite's tolerances, every
// element within `element_tolerance` of its tensor's largest value, and the loss falling.
Comparison CheckAgainst(const RunResult& got, const RunResult& want, double element_tolerance) {
  const Comparison c = Compare(got, want);
  MESSAGE("max relative loss error " << c.loss << ", weights " << c.weights << " (" << c.worst_param
                                     << "), largest element difference / tensor max "
                                     << c.max_elementwise << "; losses " << got.steps.front().loss
                                     << " -> " << got.steps.back().loss);
  CHECK(c.loss <= kTolerance);
  CHECK(c.weights <= kTolerance);
  CHECK(c.max_elementwise <= element_tolerance);
  // The global gradient norm (clipping's input): every element counted once on every layout.
  CHECK(c.grad_norm <= kTolerance);
  CHECK(got.steps.back().loss < got.steps.front().loss);
  return c;
}

void CheckPlancEquivalent(const std::string& reference, const std::string& plan,
                          double element_tolerance = kElementTolerance) {
  const RunResult want = Run(PlancCompile(reference));
  CheckAgainst(Run(PlancCompile(plan)), want, element_tolerance);
}

// Runs two programs of one plan that differ only in placement and checks that they train
// bitwise alike (losses, gradient norms, parameters); returns the first's run.
RunResult RunBitwiseAlike(const paraplan::lower::Program& a, const paraplan::lower::Program& b) {
  auto image = [](const paraplan::lower::Program& program) {
    const std::vector<uint8_t> bytes = paraplan::lower::ToFlatBuffer(program);
    return DecodeProgramImage(bytes.data(), bytes.size(), program.plan_name);
  };
  const RunResult x = Run(image(a)), y = Run(image(b));
  REQUIRE(x.steps.size() == y.steps.size());
  for (size_t s = 0; s < x.steps.size(); ++s) {
    CHECK(x.steps[s].loss == y.steps[s].loss);
    CHECK(x.steps[s].grad_norm == y.steps[s].grad_norm);
  }
  CHECK(x.params == y.params);
  return x;
}

// The Llama-style tiny model with six layers, so that pp 2 holds three chunks per rank.
paraplan::Plan LandingPlan(const Layout& layout) {
  paraplan::Plan plan = TinyPlan(false, layout);
  plan.model.layers = 6;
  return plan;
}

Comparison CheckEquivalent(bool gpt, const Layout& layout) {
  static std::map<std::tuple<bool, bool, bool, bool, bool, int, int>, RunResult> reference;
  const auto key = std::make_tuple(gpt, layout.sgd, layout.moe, layout.qk_norm, layout.squared_relu,
                                   layout.window, layout.mtp);
  if (!reference.count(key)) {
    Layout one;
    one.sgd = layout.sgd;
    one.moe = layout.moe;
    one.qk_norm = layout.qk_norm;
    one.squared_relu = layout.squared_relu;
    one.window = layout.window;
    one.mtp = layout.mtp;
    reference[key] = Run(Compile(TinyPlan(gpt, one)));
  }
  const RunResult& want = reference[key];
  return CheckAgainst(Run(Compile(TinyPlan(gpt, layout))), want, kElementTolerance);
}

// Recompute re-runs forward ops on the same inputs with the same deterministic kernels and
// collectives, so a plan with recompute must train bitwise like the same plan without it (and
// therefore like the one-rank run within the tolerance).
void CheckRecompute(bool gpt, Layout layout, paraplan::Recompute mode) {
  layout.recompute = paraplan::Recompute::kNone;
  const RunResult plain = Run(Compile(TinyPlan(gpt, layout)));
  layout.recompute = mode;
  CheckEquivalent(gpt, layout);
  const RunResult got = Run(Compile(TinyPlan(gpt, layout)));
  REQUIRE(got.steps.size() == plain.steps.size());
  for (size_t s = 0; s < got.steps.size(); ++s) {
    CAPTURE(s);
    CHECK(got.steps[s].loss == plain.steps[s].loss);
  }
  size_t differing = 0;
  for (const auto& [name, w] : plain.params) {
    auto it = got.params.find(name);
    REQUIRE(it != got.params.end());
    if (it->second != w) ++differing;
  }
  CHECK_MESSAGE(differing == 0, differing << " parameters differ from the run without recompute");
}

}  // namespace

using paraplan::Recompute;
using paraplan::Schedule;

// --- query/key norms: one weight over head_dim for every head, replicated over tp, its
// gradient summed over Tp (each rank normalises its own heads) ---
namespace {
Layout WithQkNorm(Layout layout = {}) {
  layout.qk_norm = true;
  return layout;
}
}  // namespace

TEST_CASE("query/key norms train the weights the model reads, and change the run") {
  const RunResult with = Run(Compile(TinyPlan(false, WithQkNorm())));
  const RunResult without = Run(Compile(TinyPlan(false, {})));
  REQUIRE(with.steps.size() == without.steps.size());
  CHECK(with.steps.back().loss != without.steps.back().loss);
  for (const char* name :
       {"layers.0.attention.q_norm.weight", "layers.3.attention.k_norm.weight"}) {
    CAPTURE(name);
    const auto it = with.params.find(name);
    REQUIRE(it != with.params.end());
    CHECK(it->second.size() == 16);  // head_dim
    size_t moved = 0;
    for (float w : it->second) moved += w != 1.0f;  // initialised to ones
    CHECK(moved > 0);
  }
  CHECK(without.params.count("layers.0.attention.q_norm.weight") == 0);
}
TEST_CASE("llama, query/key norms: tp 2 (one key head per rank)") {
  CheckEquivalent(false, WithQkNorm({2}));
}
TEST_CASE("llama, query/key norms: tp 2, sequence parallel, pp 2, dp 2, ZeRO 1") {
  Layout l = WithQkNorm({2, 2, 2, 1, Schedule::k1F1B, true});
  l.zero = 1;
  CheckEquivalent(false, l);
}
TEST_CASE("llama, query/key norms: cp 2") {
  Layout l = WithQkNorm();
  l.cp = 2;
  CheckEquivalent(false, l);
}
TEST_CASE("gpt (LayerNorm), query/key norms: tp 2, dp 2, ZeRO 3") {
  Layout l = WithQkNorm({2, 1, 2});
  l.zero = 3;
  CheckEquivalent(true, l);
}
TEST_CASE("llama, query/key norms: tp 2, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, WithQkNorm({2}), Recompute::kFull);
}
TEST_CASE("llama, query/key norms: tp 2, selective recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, WithQkNorm({2}), Recompute::kSelective);
}

// --- the squared-ReLU MLP (Nemotron-4): fc1, max(x, 0)², fc2 ---
namespace {
Layout WithSquaredRelu(Layout layout = {}) {
  layout.squared_relu = true;
  return layout;
}
}  // namespace

TEST_CASE("llama, squared-ReLU MLP: tp 2, sequence parallel") {
  CheckEquivalent(false, WithSquaredRelu({2, 1, 1, 1, Schedule::k1F1B, true}));
}
TEST_CASE("llama, squared-ReLU MLP: pp 2, dp 2, ZeRO 2") {
  Layout l = WithSquaredRelu({1, 2, 2});
  l.zero = 2;
  CheckEquivalent(false, l);
}
TEST_CASE("moe, squared-ReLU experts and shared expert: tp 2, sequence parallel") {
  Layout l = WithSquaredRelu({2, 1, 1, 1, Schedule::k1F1B, true});
  l.moe = true;
  CheckEquivalent(false, l);
}
TEST_CASE("llama, squared-ReLU MLP: tp 2, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, WithSquaredRelu({2}), Recompute::kFull);
}

// --- sliding-window attention (Mistral, Gemma; model.window): each query sees the `window` keys
// ending at its own position; the tiny models' sequences are 16 tokens ---
namespace {
Layout WithWindow(int window, Layout layout = {}) {
  layout.window = window;
  return layout;
}
}  // namespace

TEST_CASE("a sliding window changes the run; one covering the sequence is full attention") {
  const RunResult full = Run(Compile(TinyPlan(false, {})));
  const RunResult windowed = Run(Compile(TinyPlan(false, WithWindow(5))));
  const RunResult covering = Run(Compile(TinyPlan(false, WithWindow(16))));
  REQUIRE(windowed.steps.size() == full.steps.size());
  CHECK(windowed.steps.front().loss != full.steps.front().loss);
  for (size_t s = 0; s < full.steps.size(); ++s)
    CHECK(covering.steps[s].loss == full.steps[s].loss);
  CHECK(covering.params == full.params);
}
TEST_CASE("llama, sliding window 5: tp 2, sequence parallel, pp 2, dp 2") {
  CheckEquivalent(false, WithWindow(5, {2, 2, 2, 1, Schedule::k1F1B, true}));
}
TEST_CASE("llama, sliding window 5: cp 2 (the window crosses the ring's chunks)") {
  Layout l = WithWindow(5);
  l.cp = 2;
  CheckEquivalent(false, l);
}
TEST_CASE("llama, sliding window 3: cp 2, tp 2, sp (chunks wholly outside the window skipped)") {
  Layout l = WithWindow(3, {2, 1, 1, 1, Schedule::k1F1B, true});
  l.cp = 2;
  CheckEquivalent(false, l);
}
TEST_CASE("gpt, sliding window 7: tp 2, dp 2, ZeRO 3") {
  Layout l = WithWindow(7, {2, 1, 2});
  l.zero = 3;
  CheckEquivalent(true, l);
}
TEST_CASE("moe, sliding window 4: tp 2, sp, pp 2") {
  Layout l = WithWindow(4, {2, 2, 1, 1, Schedule::k1F1B, true});
  l.moe = true;
  CheckEquivalent(false, l);
}
TEST_CASE("llama, sliding window 5: tp 2, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, WithWindow(5, {2}), Recompute::kFull);
}

// --- full recompute by layers (Megatron's --recompute-method / --recompute-num-layers) ---
namespace {
Layout RecomputeLayers(int layers, bool block, Layout layout) {
  layout.recompute_layers = layers;
  layout.recompute_block = block;
  return layout;
}
}  // namespace

TEST_CASE("llama: pp 2, block recompute of each chunk's first layer (bitwise equal to none)") {
  CheckRecompute(false, RecomputeLayers(1, true, {1, 2, 1}), Recompute::kFull);
}
TEST_CASE("llama: tp 2, sp, uniform recompute in groups of 2 layers (bitwise equal to none)") {
  CheckRecompute(false, RecomputeLayers(2, false, {2, 1, 1, 1, Schedule::k1F1B, true}),
                 Recompute::kFull);
}
TEST_CASE("gpt: pp 2, interleaved, uniform groups of 3 over 2-layer chunks (bitwise equal)") {
  // Groups larger than a chunk take the chunk whole.
  CheckRecompute(true, RecomputeLayers(3, false, {1, 2, 1, 2, Schedule::kInterleaved1F1B}),
                 Recompute::kFull);
}
TEST_CASE("moe: pp 2, block recompute of the first 2 layers of each chunk (bitwise equal)") {
  // Each chunk holds a dense and an MoE layer, or two MoE layers' worth of both kinds.
  Layout l = RecomputeLayers(2, true, {1, 2, 1});
  l.moe = true;
  CheckRecompute(false, l, Recompute::kFull);
}
TEST_CASE("moe: tp 2, sp, uniform groups of 3 layers of either kind (bitwise equal to none)") {
  // The 4-layer chunk: a group of 3 mixing dense and MoE layers, then a group of 1.
  Layout l = RecomputeLayers(3, false, {2, 1, 1, 1, Schedule::k1F1B, true});
  l.moe = true;
  CheckRecompute(false, l, Recompute::kFull);
}
TEST_CASE("moe: pp 2, dp 2, uniform groups of 2 layers (bitwise equal to none)") {
  Layout l = RecomputeLayers(2, false, {1, 2, 2});
  l.moe = true;
  CheckRecompute(false, l, Recompute::kFull);
}
TEST_CASE("llama: tp 2, sp, pp 2, selective recompute of the MLP (bitwise equal to none)") {
  Layout l = {2, 2, 1, 1, Schedule::k1F1B, true};
  l.recompute_modules = "mlp";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("gpt: tp 2, selective recompute of core_attn and the MLP (bitwise equal to none)") {
  Layout l = {2};
  l.recompute_modules = "core_attn,mlp";
  CheckRecompute(true, l, Recompute::kSelective);
}
TEST_CASE("moe: tp 2, sp, selective recompute of the dense MLP and moe_act (bitwise equal)") {
  Layout l = {2, 1, 1, 1, Schedule::k1F1B, true};
  l.moe = true;
  l.recompute_modules = "mlp,moe_act";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: tp 2, sp, selective recompute of the shared experts (bitwise equal to none)") {
  Layout l = {2, 1, 1, 1, Schedule::k1F1B, true};
  l.moe = true;
  l.recompute_modules = "shared_experts";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: pp 2, dp 2, recompute of core_attn, moe_act, shared_experts (bitwise equal)") {
  Layout l = {1, 2, 2};
  l.moe = true;
  l.recompute_modules = "core_attn,moe_act,shared_experts";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("llama: tp 2, sp, pp 2, selective recompute of the norms (bitwise equal to none)") {
  Layout l = {2, 2, 1, 1, Schedule::k1F1B, true};
  l.recompute_modules = "layernorm";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("gpt: tp 2, recompute of the norms, core_attn and the MLP (bitwise equal to none)") {
  Layout l = {2};
  l.recompute_modules = "layernorm,core_attn,mlp";
  CheckRecompute(true, l, Recompute::kSelective);
}
TEST_CASE("moe: tp 2, sp, recompute of the norms and the shared experts (bitwise equal)") {
  Layout l = {2, 1, 1, 1, Schedule::k1F1B, true};
  l.moe = true;
  l.recompute_modules = "layernorm,shared_experts";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: tp 2, sp, etp 2, dp 2, recompute of the norms and moe_act (bitwise equal)") {
  Layout l = {2, 1, 2, 1, Schedule::k1F1B, true};
  l.moe = true;
  l.etp = true;
  l.recompute_modules = "layernorm,moe_act";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: tp 2, sp, selective recompute of the MoE block (bitwise equal to none)") {
  Layout l = {2, 1, 1, 1, Schedule::k1F1B, true};
  l.moe = true;
  l.recompute_modules = "moe";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: etp 2, tp 2, sp, pp 2, recompute of the MoE block and the norms (bitwise)") {
  Layout l = {2, 2, 1, 1, Schedule::k1F1B, true};
  l.moe = true;
  l.etp = true;
  l.recompute_modules = "moe,layernorm,core_attn";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: ep 2, dp 2, recompute of the MoE block with moe_act (bitwise equal to none)") {
  Layout l = {1, 1, 2};
  l.moe = true;
  l.ep = 2;
  l.recompute_modules = "moe,moe_act";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("llama: uniform groups of 3 over a 4-layer chunk, then 1 (bitwise equal to none)") {
  CheckRecompute(false, RecomputeLayers(3, false, {1, 1, 2}), Recompute::kFull);
}

// --- multi-token prediction: each module one layer of the last layer's kind on the loss chunk,
// the word embedding shared with the first stage over the Embedding group ---
namespace {
Layout WithMtp(int depth, Layout layout = {}) {
  layout.mtp = depth;
  return layout;
}
}  // namespace

TEST_CASE("llama, multi-token prediction (2 modules): tp 2, sp, pp 2, dp 2, ZeRO 1") {
  Layout l = WithMtp(2, {2, 2, 2, 1, Schedule::k1F1B, true});
  l.zero = 1;
  CheckEquivalent(false, l);
}
TEST_CASE("llama, multi-token prediction: pp 2 interleaved (vpp 2), dp 2, ZeRO 3") {
  Layout l = WithMtp(1, {1, 2, 2, 2, Schedule::kInterleaved1F1B});
  l.zero = 3;
  CheckEquivalent(false, l);
}
TEST_CASE("llama, multi-token prediction: cp 2, tp 2, sp (the shifted tokens cross chunks)") {
  Layout l = WithMtp(2, {2, 1, 1, 1, Schedule::k1F1B, true});
  l.cp = 2;
  CheckEquivalent(false, l);
}
TEST_CASE("moe, multi-token prediction (an MoE module): ep 2, dp 2, tp 2, sp, pp 2") {
  Layout l = WithMtp(1, {2, 2, 2, 1, Schedule::k1F1B, true});
  l.moe = true;
  l.ep = 2;
  CheckEquivalent(false, l);
}
TEST_CASE("llama, multi-token prediction: tp 2, sp, full recompute (bitwise equal to none)") {
  CheckRecompute(false, WithMtp(1, {2, 1, 1, 1, Schedule::k1F1B, true}), Recompute::kFull);
}
TEST_CASE("multi-token prediction weighted 0 trains the model bitwise as without it") {
  Layout l = {2, 2, 1, 1, Schedule::k1F1B, true};
  const RunResult plain = Run(Compile(TinyPlan(false, l)));
  paraplan::Plan plan = TinyPlan(false, WithMtp(2, l));
  plan.model.mtp_loss_scale = 0;
  const RunResult got = Run(Compile(plan));
  REQUIRE(got.steps.size() == plain.steps.size());
  for (size_t s = 0; s < got.steps.size(); ++s) {
    CAPTURE(s);
    CHECK(got.steps[s].loss == plain.steps[s].loss);
    CHECK(std::isfinite(got.steps[s].mtp_loss));
    CHECK_FALSE(std::isfinite(plain.steps[s].mtp_loss));
  }
  for (const auto& param : plain.params) {
    // A named copy, not a structured binding: doctest's message lambda captures it.
    const std::string& name = param.first;
    auto it = got.params.find(name);
    REQUIRE(it != got.params.end());
    CHECK_MESSAGE(it->second == param.second, name);
  }
}
// The step is the gradient of the objective the program states, loss + mtp_loss_scale · mtp
// loss: with SGD on data of one sequence (every step sees it), a step of size lr lowers the
// objective by lr · |g|² to first order. The ratio's first-order term is removed by comparing lr
// and lr / 2 (Richardson); a gradient missing a path (the modules' gradient into the model's
// final norm output, say) leaves the ratio 0.5% or more away from 1.
TEST_CASE("multi-token prediction: the step descends the stated objective (lr · |g|²)") {
  const std::string data = Dir() + "/one_sequence.txt";
  {
    std::ofstream out(data);
    out << "One sequence of text.";  // 21 bytes: one sample of 17 tokens
  }
  auto ratio = [&](double lr) {
    paraplan::Plan plan = TinyPlan(false, WithMtp(2, {}));
    plan.model.mtp_loss_scale = 1;
    plan.optimizer.type = paraplan::OptimizerType::kSgd;
    plan.optimizer.lr = plan.optimizer.min_lr = lr;
    plan.optimizer.warmup_steps = 0;
    plan.optimizer.weight_decay = 0;
    plan.optimizer.clip_grad = 0;
    plan.batch.micro = 1;
    plan.batch.global = 1;
    RunOptions options;
    options.data_path = data;
    options.steps = 2;
    const RunResult r = Train(Compile(plan), options);
    REQUIRE(r.steps.size() == 2);
    auto objective = [](const StepMetrics& m) { return m.loss + m.mtp_loss; };
    return (objective(r.steps[0]) - objective(r.steps[1])) /
           (lr * r.steps[0].grad_norm * r.steps[0].grad_norm);
  };
  const double r1 = ratio(1e-3), r2 = ratio(5e-4);
  MESSAGE("descent over lr · |g|²: " << r1 << " at lr 1e-3, " << r2 << " at 5e-4");
  CHECK(2 * r2 - r1 == doctest::Approx(1.0).epsilon(1.5e-3));
}

// --- context parallelism ---
namespace {
Layout WithCp(int cp, Layout layout = {}) {
  layout.cp = cp;
  return layout;
}
}  // namespace

TEST_CASE("llama: cp 2") { CheckEquivalent(false, WithCp(2)); }
TEST_CASE("llama: cp 4") { CheckEquivalent(false, WithCp(4)); }
TEST_CASE("llama: cp 2, tp 2, sequence parallel") {
  CheckEquivalent(false, WithCp(2, {2, 1, 1, 1, Schedule::k1F1B, true}));
}
TEST_CASE("llama: cp 2, pp 2, 1F1B") { CheckEquivalent(false, WithCp(2, {1, 2, 1, 1})); }
TEST_CASE("llama: cp 2, dp 2") { CheckEquivalent(false, WithCp(2, {1, 1, 2, 1})); }
TEST_CASE("llama: cp 2, selective recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, WithCp(2), Recompute::kSelective);
}
TEST_CASE("llama: cp 2, tp 2, pp 2, dp 2, sequence parallel, full recompute") {
  CheckRecompute(false, WithCp(2, {2, 2, 2, 1, Schedule::k1F1B, true}), Recompute::kFull);
}
// ZeRO shards over DpCp (the 4 ranks holding the same weights).
TEST_CASE("llama: cp 2, dp 2, ZeRO 1") {
  CheckEquivalent(false, WithCp(2, {1, 1, 2, 1, Schedule::k1F1B, false, 1}));
}
TEST_CASE("llama: cp 2, dp 2, ZeRO 3") {
  CheckEquivalent(false, WithCp(2, {1, 1, 2, 1, Schedule::k1F1B, false, 3}));
}
TEST_CASE("llama: cp 2, ZeRO 2 (dp 1: sharded over the Cp ranks alone)") {
  CheckEquivalent(false, WithCp(2, {1, 1, 1, 1, Schedule::k1F1B, false, 2}));
}
// Learned positions: each rank adds the table rows of its two chunks.
TEST_CASE("gpt-2: cp 2") { CheckEquivalent(true, WithCp(2)); }
TEST_CASE("gpt-2: cp 2, tp 2, sequence parallel") {
  CheckEquivalent(true, WithCp(2, {2, 1, 1, 1, Schedule::k1F1B, true}));
}
// --- end context parallelism ---

TEST_CASE("llama: tp 2") { CheckEquivalent(false, {2, 1, 1, 1}); }
TEST_CASE("llama: tp 2, sequence parallel") {
  CheckEquivalent(false, {2, 1, 1, 1, Schedule::k1F1B, true});
}
TEST_CASE("llama: pp 2, 1F1B") { CheckEquivalent(false, {1, 2, 1, 1, Schedule::k1F1B}); }
TEST_CASE("llama: pp 2, vpp 2, interleaved 1F1B") {
  CheckEquivalent(false, {1, 2, 1, 2, Schedule::kInterleaved1F1B});
}
TEST_CASE("llama: pp 4, GPipe") { CheckEquivalent(false, {1, 4, 1, 1, Schedule::kGpipe}); }

// Interleaved 1F1B over pp 2 with vpp 3 (six layers): in the steady state the first rank posts
// its middle chunk's next input before the backward gives a slot back, so that input lands in a
// buffer of its own and the forward copies it into its slot (compiler/lower/lower.cpp,
// LandingChunks), one slot fewer than receiving it into a slot. The copy is exact: the run is
// bitwise the run of the program without landing buffers, and the one-rank run's within the
// suite's tolerance.
TEST_CASE("llama: pp 2, vpp 3 interleaved 1F1B, a landing buffer on the first rank") {
  const paraplan::Plan plan = LandingPlan({1, 2, 1, 3, Schedule::kInterleaved1F1B});
  // Slots counted per chunk (no slot pool), where the landing buffer saves the chunk a slot.
  paraplan::lower::LowerOptions per_chunk;
  per_chunk.slot_pools = false;
  paraplan::lower::LowerOptions slots_only = per_chunk;
  slots_only.landing_buffers = false;
  paraplan::DiagnosticSink sink;
  const auto with = paraplan::lower::LowerPlan(plan, per_chunk, sink);
  const auto without = paraplan::lower::LowerPlan(plan, slots_only, sink);
  REQUIRE(with.has_value());
  REQUIRE(without.has_value());
  const paraplan::lower::Role& first = with->roles.at(0);
  REQUIRE(first.chunks.size() == 3);
  CHECK(paraplan::lower::LandingBuffer(first, first.chunks[0]) < 0);
  CHECK(paraplan::lower::LandingBuffer(first, first.chunks[1]) >= 0);
  CHECK(paraplan::lower::LandingBuffer(first, first.chunks[2]) < 0);
  CHECK(first.chunks[1].slots + 1 == without->roles.at(0).chunks[1].slots);
  CHECK(first.peak_bytes < without->roles.at(0).peak_bytes);
  const RunResult landed = RunBitwiseAlike(*with, *without);
  CheckAgainst(landed, Run(Compile(LandingPlan({}))), kElementTolerance);
}

// The chunks of a pipeline rank share one pool of stash slots under interleaved 1F1B
// (compiler/analyze/slot_pool.h): slot s of every chunk of the pool is one frame of memory,
// taken by one microbatch at a time. Only the addresses change: the run is bitwise the run of
// the program with slots per chunk, on a smaller stash.
TEST_CASE("llama: pp 2, vpp 3 interleaved 1F1B, the chunks share one pool of stash slots") {
  const paraplan::Plan plan = LandingPlan({1, 2, 1, 3, Schedule::kInterleaved1F1B});
  paraplan::lower::LowerOptions per_chunk;
  per_chunk.slot_pools = false;
  paraplan::DiagnosticSink sink;
  const auto pooled = paraplan::lower::LowerPlan(plan, {}, sink);
  const auto own = paraplan::lower::LowerPlan(plan, per_chunk, sink);
  REQUIRE(pooled.has_value());
  REQUIRE(own.has_value());
  int pools = 0;
  for (size_t r = 0; r < pooled->roles.size(); ++r) {
    const paraplan::lower::Role& role = pooled->roles[r];
    const paraplan::lower::MemoryBreakdown a = paraplan::lower::MeasureMemory(role);
    const paraplan::lower::MemoryBreakdown b = paraplan::lower::MeasureMemory(own->roles[r]);
    CAPTURE(r);
    CHECK(a.stash <= b.stash);
    int32_t own_slots = 0, pool_slots = 0;
    for (size_t c = 0; c < role.chunks.size(); ++c) {
      own_slots += own->roles[r].chunks[c].slots;
      if (role.chunks[c].pool >= 0) pool_slots = role.chunks[c].slots;
    }
    if (pool_slots > 0) {
      ++pools;
      CHECK(pool_slots < own_slots);
      CHECK(a.stash < b.stash);
    }
  }
  CHECK(pools > 0);
  (void)RunBitwiseAlike(*pooled, *own);
}
// A chunk's output and gradient are one buffer each (compiler/lower/lower.cpp,
// BoundaryBuffersOf): sent before the next forward, received into a landing buffer and copied
// in by the backward. The copy is exact: each run is bitwise the run of the program that keeps
// them in stash slots, on 1F1B with tp 2 and sp, GPipe, and interleaved chunks.
TEST_CASE("llama: one output and one gradient buffer per chunk train bitwise as stash slots") {
  for (const Layout& layout :
       {Layout{2, 2, 2, 1, Schedule::k1F1B, true, 1}, Layout{1, 2, 1, 1, Schedule::kGpipe},
        Layout{1, 2, 1, 3, Schedule::kInterleaved1F1B}}) {
    CAPTURE(layout.pp);
    const paraplan::Plan plan = LandingPlan(layout);
    paraplan::lower::LowerOptions slotted;
    slotted.boundary_buffers = false;
    paraplan::DiagnosticSink sink;
    const auto single = paraplan::lower::LowerPlan(plan, {}, sink);
    const auto apart = paraplan::lower::LowerPlan(plan, slotted, sink);
    REQUIRE(single.has_value());
    REQUIRE(apart.has_value());
    int landings = 0;
    for (const paraplan::lower::Role& role : single->roles)
      for (const paraplan::lower::Chunk& c : role.chunks) {
        CHECK(role.buffers[c.grad].kind == paraplan::prog::BufferKind::Persistent);
        landings += paraplan::lower::GradLandingBuffer(role, c) >= 0 ? 1 : 0;
      }
    // Only a middle chunk (interleaved) both receives and sends gradients.
    CHECK((landings > 0) == (layout.vpp > 1));
    (void)RunBitwiseAlike(*single, *apart);
  }
}
TEST_CASE("llama: dp 2") { CheckEquivalent(false, {1, 1, 2, 1}); }
TEST_CASE("llama: dp 2, ZeRO 1") {
  CheckEquivalent(false, {1, 1, 2, 1, Schedule::k1F1B, false, 1});
}
TEST_CASE("llama: dp 2, ZeRO 2") {
  CheckEquivalent(false, {1, 1, 2, 1, Schedule::k1F1B, false, 2});
}
TEST_CASE("llama: dp 2, ZeRO 3") {
  CheckEquivalent(false, {1, 1, 2, 1, Schedule::k1F1B, false, 3});
}
TEST_CASE("llama: tp 2, pp 2, dp 2, ZeRO 1, sequence parallel") {
  CheckEquivalent(false, {2, 2, 2, 1, Schedule::k1F1B, true, 1});
}
TEST_CASE("llama: tp 2, pp 2 vpp 2 interleaved, dp 2, ZeRO 3, sequence parallel") {
  CheckEquivalent(false, {2, 2, 2, 2, Schedule::kInterleaved1F1B, true, 3});
}
TEST_CASE("llama: pp 2 GPipe, dp 2, ZeRO 2") {
  CheckEquivalent(false, {1, 2, 2, 1, Schedule::kGpipe, false, 2});
}
TEST_CASE("llama, SGD: tp 2, pp 2, dp 2, ZeRO 1, sequence parallel") {
  Layout layout{2, 2, 2, 1, Schedule::k1F1B, true, 1};
  layout.sgd = true;
  CheckEquivalent(false, layout);
}
TEST_CASE("gpt-2: tp 2, sequence parallel") {
  CheckEquivalent(true, {2, 1, 1, 1, Schedule::k1F1B, true});
}
TEST_CASE("gpt-2: pp 2 (tied embeddings across stages), dp 2") {
  CheckEquivalent(true, {1, 2, 2, 1});
}
TEST_CASE("gpt-2: tp 2, pp 2, dp 2, ZeRO 1") {
  CheckEquivalent(true, {2, 2, 2, 1, Schedule::k1F1B, false, 1});
}
TEST_CASE("gpt-2: pp 2 (tied embeddings in their own buckets), dp 2, ZeRO 2") {
  CheckEquivalent(true, {1, 2, 2, 1, Schedule::k1F1B, false, 2});
}
TEST_CASE("gpt-2: tp 2, pp 2, dp 2, ZeRO 3, sequence parallel") {
  CheckEquivalent(true, {2, 2, 2, 1, Schedule::k1F1B, true, 3});
}
TEST_CASE(
    "llama: tp 2, dp 2, ZeRO 2, sequence parallel (norm grads summed over tp in every backward)") {
  CheckEquivalent(false, {2, 1, 2, 1, Schedule::k1F1B, true, 2});
}
TEST_CASE("llama: tp 2, pp 2 vpp 2 interleaved, dp 2, ZeRO 3, sequence parallel, full recompute") {
  CheckRecompute(false, {2, 2, 2, 2, Schedule::kInterleaved1F1B, true, 3}, Recompute::kFull);
}

TEST_CASE("llama: tp 2, sequence parallel, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, {2, 1, 1, 1, Schedule::k1F1B, true}, Recompute::kFull);
}
TEST_CASE("llama: tp 2, sequence parallel, selective recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, {2, 1, 1, 1, Schedule::k1F1B, true}, Recompute::kSelective);
}
TEST_CASE("llama: pp 2, 1F1B, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, {1, 2, 1, 1, Schedule::k1F1B}, Recompute::kFull);
}
TEST_CASE("llama: pp 2, 1F1B, selective recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, {1, 2, 1, 1, Schedule::k1F1B}, Recompute::kSelective);
}
TEST_CASE("gpt-2: tp 2, pp 2, dp 2, ZeRO 1, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(true, {2, 2, 2, 1, Schedule::k1F1B, false, 1}, Recompute::kFull);
}

TEST_CASE(
    "ZeRO 3 with full recompute: the shared transient arena equals separate buffers; resume is "
    "bitwise") {
  Layout layout{2, 2, 2, 2, Schedule::kInterleaved1F1B, true, 3, Recompute::kFull};
  const ProgramImage program = Compile(TinyPlan(false, layout));
  const RunResult arena = Run(program);
  RunOptions options;
  options.data_path = SourceDir() + "/data/corpus/classics.txt";
  options.steps = 5;
  options.comm_timeout_seconds = 120;
  options.separate_buffers = true;
  const RunResult separate = Train(program, options);
  REQUIRE(separate.steps.size() == arena.steps.size());
  for (size_t s = 0; s < arena.steps.size(); ++s)
    CHECK(separate.steps[s].loss == arena.steps[s].loss);
  CHECK(separate.params == arena.params);
  const std::string dir = Dir() + "/zero3_checkpoints";
  RunOptions first = options;
  first.separate_buffers = false;
  first.steps = 3;
  first.checkpoint_dir = dir;
  Train(program, first);
  RunOptions second = first;
  second.steps = -1;  // up to the program's 5 steps
  second.checkpoint_dir.clear();
  second.resume_dir = dir;
  const RunResult resumed = Train(program, second);
  REQUIRE(resumed.start_step == 3);
  REQUIRE(resumed.steps.size() == 2);
  for (size_t s = 0; s < 2; ++s) CHECK(resumed.steps[s].loss == arena.steps[s + 3].loss);
  CHECK(resumed.params == arena.params);
}

// A schedule in loop form (program format 4: the steady state as a repeated block) runs as its
// listed form: each rank expands its own role's loops, bitwise the same run. Loops are forced at
// a small microbatch count (planc writes them from 1,024 forwards per rank).
TEST_CASE("a program whose schedules are in loop form trains bitwise as the listed program") {
  for (const Layout& layout :
       {Layout{1, 2, 2, 1, Schedule::k1F1B}, Layout{1, 2, 1, 2, Schedule::kInterleaved1F1B},
        Layout{1, 2, 1, 1, Schedule::kGpipe}}) {
    paraplan::Plan plan = TinyPlan(false, layout);
    plan.batch.global = int64_t{2} * layout.dp * 12;  // 12 microbatches
    paraplan::DiagnosticSink sink;
    paraplan::lower::LowerOptions options;
    options.compact_schedule = true;
    options.loop_min_microbatches = 1;
    options.loop_min_saving = 1;
    auto looped = paraplan::lower::LowerPlan(plan, options, sink);
    options.schedule_loops = false;
    auto listed = paraplan::lower::LowerPlan(plan, options, sink);
    REQUIRE(looped.has_value());
    REQUIRE(listed.has_value());
    const std::vector<uint8_t> a = paraplan::lower::ToFlatBuffer(*looped);
    const std::vector<uint8_t> b = paraplan::lower::ToFlatBuffer(*listed);
    const ProgramImage with_loops = DecodeProgramImage(a.data(), a.size(), "loops");
    size_t loops = 0;
    for (const auto& role : with_loops.roles) {
      loops += role.loops.size();
      CHECK((role.loops.empty() || role.schedule.empty()));  // kept as steps and loops
    }
    CHECK(loops > 0);
    const RunResult x = Run(with_loops);
    const RunResult y = Run(DecodeProgramImage(b.data(), b.size(), "listed"));
    REQUIRE(x.steps.size() == y.steps.size());
    for (size_t s = 0; s < x.steps.size(); ++s) CHECK(x.steps[s].loss == y.steps[s].loss);
    CHECK(x.params == y.params);
  }
}

// --- mixture of experts (ep = 1, etp = 1) ---
Layout Moe(Layout l) {
  l.moe = true;
  return l;
}
TEST_CASE("moe: tp 2, sequence parallel") {
  CheckEquivalent(false, Moe({2, 1, 1, 1, Schedule::k1F1B, true}));
}
TEST_CASE("moe: tp 2, sp, selective recompute of the experts' activation (bitwise equal)") {
  Layout l = Moe({2, 1, 1, 1, Schedule::k1F1B, true});
  l.recompute_modules = "moe_act";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: pp 2, 1F1B") { CheckEquivalent(false, Moe({1, 2, 1, 1, Schedule::k1F1B})); }
TEST_CASE("moe: dp 2, ZeRO 1") {
  CheckEquivalent(false, Moe({1, 1, 2, 1, Schedule::k1F1B, false, 1}));
}
TEST_CASE("moe: tp 2, pp 2 vpp 2 interleaved, dp 2, ZeRO 3, sequence parallel") {
  CheckEquivalent(false, Moe({2, 2, 2, 2, Schedule::kInterleaved1F1B, true, 3}));
}
TEST_CASE("moe: tp 2, sequence parallel, selective recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, Moe({2, 1, 1, 1, Schedule::k1F1B, true}), Recompute::kSelective);
}
TEST_CASE("moe, gpt-2 (GELU experts): tp 2, sequence parallel, pp 2") {
  CheckEquivalent(true, Moe({2, 2, 1, 1, Schedule::k1F1B, true}));
}
TEST_CASE("moe: tp 2, sequence parallel, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, Moe({2, 1, 1, 1, Schedule::k1F1B, true}), Recompute::kFull);
}
// Beside context parallelism the router's counts are summed over the Cp ranks too, and each
// rank's aux-loss gradient divides by the microbatch's tokens (all Cp ranks' positions).
TEST_CASE("moe: cp 2, dp 2") { CheckEquivalent(false, Moe(WithCp(2, {1, 1, 2, 1}))); }
TEST_CASE("moe: cp 2, dp 2, ZeRO 2 (grads sharded over DpCp)") {
  CheckEquivalent(false, Moe(WithCp(2, {1, 1, 2, 1, Schedule::k1F1B, false, 2})));
}
TEST_CASE("moe: cp 2, tp 2, sequence parallel") {
  CheckEquivalent(false, Moe(WithCp(2, {2, 1, 1, 1, Schedule::k1F1B, true})));
}
TEST_CASE("moe: cp 2, tp 2, sequence parallel, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, Moe(WithCp(2, {2, 1, 1, 1, Schedule::k1F1B, true})), Recompute::kFull);
}
// --- expert parallelism: tokens dispatched by all-to-all over Ep, expert grads summed over Edp ---
namespace {
Layout WithEp(int ep, Layout layout) {
  layout.moe = true;
  layout.ep = ep;
  return layout;
}
// The grad norm counts every expert once (on the first rank of its Edp group) and the rest once
// (on the first of its Dp group), summed over the world: it equals the one-rank run's.
void CheckExpertParallel(const Layout& layout) {
  const Comparison c = CheckEquivalent(false, layout);
  MESSAGE("grad norm relative difference " << c.grad_norm);
  CHECK(c.grad_norm <= kTolerance);
}
}  // namespace

TEST_CASE("moe: ep 2, dp 2, selective recompute of core_attn and moe_act (bitwise equal)") {
  Layout l = WithEp(2, {1, 1, 2, 1});
  l.recompute_modules = "core_attn,moe_act";
  CheckRecompute(false, l, Recompute::kSelective);
}
TEST_CASE("moe: ep 2 (dp 2: 2 experts per rank)") { CheckExpertParallel(WithEp(2, {1, 1, 2, 1})); }
TEST_CASE("moe: ep 4 (dp 4: one expert per rank)") { CheckExpertParallel(WithEp(4, {1, 1, 4, 1})); }
// The Ep group is the Tp group (order tp-cp-ep-dp-pp, etp = 1): each rank dispatches its own
// sequence-parallel rows; the dp 2 copies of each expert sum their grads over Edp.
TEST_CASE("moe: ep 2, tp 2, sequence parallel, dp 2 (etp 1)") {
  CheckExpertParallel(WithEp(2, {2, 1, 2, 1, Schedule::k1F1B, true}));
}
// A stated routing imbalance bounds the receive buffers (1.0: the balanced share, rows · topk);
// the first dispatch that brings more rows fails the run, naming the numbers.
TEST_CASE("moe: ep 2 with moe.imbalance = 1 stated: an overflowing dispatch fails clearly") {
  paraplan::Plan plan = TinyPlan(false, WithEp(2, {1, 1, 2, 1}));
  plan.moe.imbalance = 1.0;
  plan.origins.Mutable("moe.imbalance")->kind = paraplan::OriginKind::kCommandLine;
  const ProgramImage program = Compile(plan);
  CHECK_THROWS_WITH(Run(program), doctest::Contains("rows its receive buffer reserves"));
  CHECK_THROWS_WITH(Run(program), doctest::Contains("compile with a larger moe.imbalance"));
}
// Three steps, a checkpoint, two more resumed from it: the same losses and weights as five
// straight (`dir_name` under the test directory, removed after).
void CheckResumeBitwise(const ProgramImage& program, const std::string& dir_name) {
  const RunResult straight = Run(program);
  const std::string dir = Dir() + "/" + dir_name;
  RunOptions first;
  first.data_path = SourceDir() + "/data/corpus/classics.txt";
  first.comm_timeout_seconds = 120;
  first.steps = 3;
  first.checkpoint_dir = dir;
  REQUIRE(Train(program, first).checkpoint_step == 3);
  RunOptions rest = first;
  rest.steps = 2;
  rest.checkpoint_dir.clear();
  rest.resume_dir = dir;
  const RunResult resumed = Train(program, rest);
  REQUIRE(resumed.start_step == 3);
  REQUIRE(resumed.steps.size() == 2);
  CHECK(resumed.steps[0].loss == straight.steps[3].loss);
  CHECK(resumed.steps[1].loss == straight.steps[4].loss);
  REQUIRE(resumed.params.size() == straight.params.size());
  for (const auto& param : straight.params) {
    const std::string& name = param.first;  // a named copy: doctest's CAPTURE takes it
    CAPTURE(name);
    CHECK(resumed.params.at(name) == param.second);
  }
  fs::remove_all(dir);
}
// Checkpoints are per rank: each rank saves and loads its own experts' shard.
TEST_CASE("moe: ep 2, tp 2, sequence parallel, dp 2: resuming from a checkpoint is bitwise") {
  CheckResumeBitwise(Compile(TinyPlan(false, WithEp(2, {2, 1, 2, 1, Schedule::k1F1B, true}))),
                     "ep_checkpoint");
}

// Full recompute re-runs each layer's dispatch and combine in the backward body, in the same
// order on every Ep rank.
TEST_CASE("moe: ep 2, dp 2, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, WithEp(2, {1, 1, 2, 1}), Recompute::kFull);
}
// ZeRO 1: the experts' optimizer states sharded over Edp (2 ranks), the rest over dp (4).
TEST_CASE("moe: ep 2, dp 4, ZeRO 1 (experts sharded over Edp)") {
  CheckExpertParallel(WithEp(2, {1, 1, 4, 1, Schedule::k1F1B, false, 1}));
}
TEST_CASE("moe: ep 2, tp 2, sequence parallel, dp 2, ZeRO 1") {
  CheckExpertParallel(WithEp(2, {2, 1, 2, 1, Schedule::k1F1B, true, 1}));
}
TEST_CASE("moe: ep 2, pp 2, dp 2, 1F1B") {
  CheckExpertParallel(WithEp(2, {1, 2, 2, 1, Schedule::k1F1B}));
}
// --- end expert parallelism ---
// --- whole experts over Edp (ep = 1, etp = 1, tp > 1, sequence parallelism, ZeRO 0 or 1) ---
// Every rank holds every expert and routes its own rows: the experts' gradients, partial sums
// over Tp, reduce once over Edp (tp · cp · dp ranks), and ZeRO 1 shards their optimizer state
// over it. The grad norm counts each expert element on one rank of Edp.
TEST_CASE("moe: tp 2, sequence parallel, dp 2 (expert grads over Edp = tp · dp)") {
  CheckExpertParallel(Moe({2, 1, 2, 1, Schedule::k1F1B, true}));
}
TEST_CASE("moe: tp 2, sequence parallel, dp 2, ZeRO 1 (expert states sharded over Edp = tp · dp)") {
  CheckExpertParallel(Moe({2, 1, 2, 1, Schedule::k1F1B, true, 1}));
}
TEST_CASE("moe: tp 2, sequence parallel, ZeRO 1 (dp 1: experts sharded over the Tp ranks)") {
  CheckExpertParallel(Moe({2, 1, 1, 1, Schedule::k1F1B, true, 1}));
}
TEST_CASE("moe: cp 2, tp 2, sequence parallel, dp 2, ZeRO 1 (expert states over tp · cp · dp)") {
  CheckExpertParallel(Moe(WithCp(2, {2, 1, 2, 1, Schedule::k1F1B, true, 1})));
}
TEST_CASE("moe: tp 2, sequence parallel, dp 2, ZeRO 2 (experts beside the dense params)") {
  CheckEquivalent(false, Moe({2, 1, 2, 1, Schedule::k1F1B, true, 2}));
}
// Each rank saves and loads its own shard of the experts' optimizer state (a quarter here).
TEST_CASE("moe: tp 2, sequence parallel, dp 2, ZeRO 1: resuming from a checkpoint is bitwise") {
  CheckResumeBitwise(PlancCompile("moe_tp2_dp2_zero1_sp"), "expert_edp_checkpoint");
}
// --- end whole experts over Edp ---
// --- expert tensor parallelism (etp = tp, ep = 1) ---
// Each expert's gate/up split by rows and its down projection by columns over the Tp group; under
// sequence parallelism the group's rows are gathered before dispatch and the combined partial
// outputs reduce-scattered back, without it all-reduced. The expert slices start from the
// one-rank run's values and their gradients reduce over dp · cp as the dense ones do.
Layout Etp(Layout l) {
  l.moe = true;
  l.etp = true;
  return l;
}
TEST_CASE("moe, etp 2: tp 2, sequence parallel, full recompute (bitwise equal to no recompute)") {
  CheckRecompute(false, Etp({2, 1, 1, 1, Schedule::k1F1B, true}), Recompute::kFull);
}
TEST_CASE("moe, etp 2: tp 2, pp 2 vpp 2 interleaved, dp 2, ZeRO 3, sequence parallel") {
  CheckEquivalent(false, Etp({2, 2, 2, 2, Schedule::kInterleaved1F1B, true, 3}));
}
TEST_CASE("moe, etp 2, gpt-2 (GELU experts): tp 2, pp 2") {
  CheckEquivalent(true, Etp({2, 2, 1, 1, Schedule::k1F1B}));
}
TEST_CASE("moe, etp 2: cp 2, tp 2, sequence parallel, dp 2, ZeRO 2 (expert grads over DpCp)") {
  CheckEquivalent(false, Etp(WithCp(2, {2, 1, 2, 1, Schedule::k1F1B, true, 2})));
}
// --- end expert tensor parallelism ---

// --- multi-head latent attention ---
namespace {
// The Llama-style model with multi-head latent attention (DeepSeek-V2): 4 heads of 24 + 8
// query/key columns (the 8 from RoPE, one key head shared by all) and 16 value columns; queries
// through a rank-32 latent (or projected directly), keys and values through a rank-16 latent.
paraplan::Plan MlaPlan(const Layout& l, bool q_latent) {
  paraplan::Plan plan = TinyPlan(false, l);
  auto& m = plan.model;
  plan.name = m.name = q_latent ? "tiny_mla" : "tiny_mla_direct_q";
  m.kv_heads = 4;
  m.q_lora_rank = q_latent ? 32 : 0;
  m.kv_lora_rank = 16;
  m.qk_nope_head_dim = 24;
  m.qk_rope_head_dim = 8;
  m.v_head_dim = 16;
  m.head_dim = 32;
  return plan;
}

void CheckMlaEquivalent(const Layout& layout, bool q_latent = true) {
  static std::map<bool, RunResult> reference;
  if (!reference.count(q_latent)) reference[q_latent] = Run(Compile(MlaPlan({}, q_latent)));
  const RunResult& want = reference[q_latent];
  CheckAgainst(Run(Compile(MlaPlan(layout, q_latent))), want, kElementTolerance);
  // Every latent-attention weight trains and is compared.
  for (const char* name : {"layers.0.attention.wkv_down", "layers.3.attention.kv_norm.weight",
                           "layers.2.attention.wkv_up", "layers.1.attention.wo"})
    CHECK_MESSAGE(want.params.count(name) == 1, name);
  CHECK(want.params.count("layers.0.attention.wq_down") == (q_latent ? 1u : 0u));
}

// Recompute bitwise equal to the same layout without it (see CheckRecompute).
void CheckMlaRecompute(Layout layout, paraplan::Recompute mode, bool q_latent = true) {
  layout.recompute = paraplan::Recompute::kNone;
  const RunResult plain = Run(Compile(MlaPlan(layout, q_latent)));
  layout.recompute = mode;
  CheckMlaEquivalent(layout, q_latent);
  const RunResult got = Run(Compile(MlaPlan(layout, q_latent)));
  REQUIRE(got.steps.size() == plain.steps.size());
  for (size_t s = 0; s < got.steps.size(); ++s) {
    CAPTURE(s);
    CHECK(got.steps[s].loss == plain.steps[s].loss);
  }
  CHECK(got.params == plain.params);
}
}  // namespace

// DeepSeek-V3's shape: latent attention, MoE layers, one multi-token prediction module (an MoE
// layer with latent attention itself, after the MoE last layer).
TEST_CASE("mla, moe, multi-token prediction: tp 2, sp, pp 2, ep 2, dp 2, ZeRO 1") {
  Layout one;
  one.moe = true;
  one.mtp = 1;
  const RunResult want = Run(Compile(MlaPlan(one, true)));
  Layout l = {2, 2, 2, 1, Schedule::k1F1B, true, 1};
  l.moe = true;
  l.ep = 2;
  l.mtp = 1;
  CheckAgainst(Run(Compile(MlaPlan(l, true))), want, kElementTolerance);
  for (const char* name : {"layers.4.attention.wkv_down", "layers.4.moe.router", "mtp.0.eh_proj"})
    CHECK_MESSAGE(want.params.count(name) == 1, name);
}

TEST_CASE("mla: tp 2, sequence parallel") {
  CheckMlaEquivalent({2, 1, 1, 1, Schedule::k1F1B, true});
}
TEST_CASE("mla: tp 2, pp 2, dp 2, ZeRO 2, sequence parallel (replicated grads summed per layer)") {
  CheckMlaEquivalent({2, 2, 2, 1, Schedule::k1F1B, true, 2});
}
TEST_CASE("mla: pp 2 vpp 2 interleaved, dp 2, ZeRO 3") {
  CheckMlaEquivalent({1, 2, 2, 2, Schedule::kInterleaved1F1B, false, 3});
}
TEST_CASE("mla: cp 2 (every head's K and V travel the ring at the query/key head size)") {
  Layout l;
  l.cp = 2;
  CheckMlaEquivalent(l);
}
TEST_CASE("mla: cp 2, tp 2, sequence parallel, pp 2") {
  Layout l = {2, 2, 1, 1, Schedule::k1F1B, true};
  l.cp = 2;
  CheckMlaEquivalent(l);
}
TEST_CASE("mla: cp 2, selective recompute (bitwise equal to no recompute)") {
  Layout l;
  l.cp = 2;
  CheckMlaRecompute(l, Recompute::kSelective);
}
TEST_CASE("mla, queries without a latent (q_lora_rank = 0): tp 2, pp 2") {
  CheckMlaEquivalent({2, 2, 1, 1}, /*q_latent=*/false);
}
TEST_CASE("mla: tp 2, sequence parallel, selective recompute (bitwise equal to no recompute)") {
  CheckMlaRecompute({2, 1, 1, 1, Schedule::k1F1B, true}, Recompute::kSelective);
}
TEST_CASE("mla: tp 2, sp, recompute of the up projections (bitwise equal to none)") {
  Layout l = {2, 1, 1, 1, Schedule::k1F1B, true};
  l.recompute_modules = "mla_up_proj";
  CheckMlaRecompute(l, Recompute::kSelective);
}
TEST_CASE("mla, queries projected directly: pp 2, up projections and core_attn (bitwise)") {
  Layout l = {1, 2, 1};
  l.recompute_modules = "mla_up_proj,core_attn";
  CheckMlaRecompute(l, Recompute::kSelective, /*q_latent=*/false);
}
TEST_CASE("mla: cp 2, tp 2, sp, up projections over the ring's positions (bitwise)") {
  Layout l = {2, 1, 1, 1, Schedule::k1F1B, true};
  l.cp = 2;
  l.recompute_modules = "mla_up_proj,layernorm";
  CheckMlaRecompute(l, Recompute::kSelective);
}
TEST_CASE("mla: tp 2, sp, recompute of the norms and core_attn (bitwise equal to none)") {
  Layout l = {2, 1, 1, 1, Schedule::k1F1B, true};
  l.recompute_modules = "layernorm,core_attn";
  CheckMlaRecompute(l, Recompute::kSelective);
}
TEST_CASE("mla: tp 2, pp 2, sequence parallel, full recompute (bitwise equal to no recompute)") {
  CheckMlaRecompute({2, 2, 1, 1, Schedule::k1F1B, true}, Recompute::kFull);
}
TEST_CASE("planc compile: mla cp 2, tp 2, sequence parallel") {
  CheckPlancEquivalent("mla_single", "mla_cp2_tp2_sp");
}
TEST_CASE("planc compile: QK-norm, squared ReLU, tp 2, pp 2, sp, block recompute") {
  CheckPlancEquivalent("qk_sq_single", "qk_sq_tp2_pp2_sp");
}
TEST_CASE("planc compile: ZeRO 2 and 3 beside ep 2 (experts over Edp; Edp of one rank)") {
  CheckPlancEquivalent("moe_single", "moe_ep2_tp2_dp2_zero2_sp");
  CheckPlancEquivalent("moe_single", "moe_ep2_tp2_dp2_zero3_sp");
  CheckPlancEquivalent("moe_single", "moe_ep2_pp2_dp2_zero3");
  CheckPlancEquivalent("moe_single", "moe_ep2_etp2_tp2_dp4_zero3_sp");
}
TEST_CASE("ZeRO 3 beside ep 2: a checkpoint of the Edp-sharded experts resumes bitwise") {
  CheckResumeBitwise(PlancCompile("moe_ep2_tp2_dp2_zero3_sp"), "expert_zero3_checkpoint");
  CheckResumeBitwise(PlancCompile("moe_ep2_pp2_dp2_zero3"), "expert_zero3_edp1_checkpoint");
}
TEST_CASE("planc compile: hybrid sharding (ZeRO over a replica's ranks, replicas summed)") {
  CheckPlancEquivalent("single", "hsdp_dp4_r2_zero3");
  CheckPlancEquivalent("single", "hsdp_tp2_dp4_r2_zero1_sp");
  CheckPlancEquivalent("single", "hsdp_cp2_dp2_r2_zero2");
  CheckPlancEquivalent("single", "hsdp_pp2_dp4_r4_zero3");  // a shard of one rank: plain dp
}
TEST_CASE("planc compile: hybrid sharding beside experts over Edp (the norm counts each once)") {
  CheckPlancEquivalent("moe_single", "hsdp_moe_ep2_dp4_r2_zero1");
  CheckPlancEquivalent("moe_single", "hsdp_moe_ep2_dp4_r2_zero3");
  CheckPlancEquivalent("moe_dense2_single", "hsdp_moe_pp2_ep2_dp4_r2_zero1");
  CheckPlancEquivalent("moe_single", "hsdp_moe_ep2_dp4_r4_zero2");  // a shard of one rank
}
TEST_CASE("hybrid sharding: a checkpoint of the replicas' shards resumes bitwise") {
  CheckResumeBitwise(PlancCompile("hsdp_dp4_r2_zero3"), "hsdp_checkpoint");
}
TEST_CASE("planc compile: sliding window 6, tp 2, sp, pp 2; and cp 2, tp 2, sp") {
  CheckPlancEquivalent("window_single", "window_tp2_pp2_sp");
  CheckPlancEquivalent("window_single", "window_cp2_tp2_sp");
}
TEST_CASE("planc compile: mla tp 2, sequence parallel") {
  CheckPlancEquivalent("mla_single", "mla_tp2_sp");
}
TEST_CASE("planc compile: mla tp 2, pp 2, dp 2, ZeRO 1, sequence parallel") {
  CheckPlancEquivalent("mla_single", "mla_tp2_pp2_dp2_zero1_sp");
}
TEST_CASE("planc compile: mla with queries projected directly (q_lora_rank = 0), tp 2, pp 2") {
  CheckPlancEquivalent("mla_direct_q_single", "mla_direct_q_tp2_pp2");
}
// --- end multi-head latent attention ---

TEST_CASE("planc compile: llama tp 2, pp 2, dp 2, ZeRO 1, sequence parallel") {
  CheckPlancEquivalent("single", "tp2_pp2_dp2_zero1_sp");
}
TEST_CASE("planc compile: llama pp 2, vpp 2 interleaved, dp 2, ZeRO 3") {
  CheckPlancEquivalent("single", "pp2_vpp2_dp2_zero3");
}
TEST_CASE("planc compile: gpt-2 tp 2, pp 2, dp 2") {
  CheckPlancEquivalent("gpt_single", "gpt_tp2_pp2_dp2");
}
TEST_CASE("planc compile: llama tp 2, pp 2, dp 2, ZeRO 1, sequence parallel, full recompute") {
  CheckPlancEquivalent("single", "tp2_pp2_dp2_zero1_sp_recompute_full");
}
TEST_CASE("planc compile: llama tp 2, pp 2, dp 2, sequence parallel, selective recompute") {
  CheckPlancEquivalent("single", "tp2_pp2_dp2_sp_recompute_selective");
}
TEST_CASE("planc compile: llama cp 2, tp 2, dp 2, sequence parallel") {
  CheckPlancEquivalent("single", "cp2_tp2_dp2_sp");
}
TEST_CASE("planc compile: llama cp 2, tp 2, dp 2, ZeRO 1 over dp · cp, sequence parallel") {
  CheckPlancEquivalent("single", "cp2_tp2_dp2_zero1_sp");
}
TEST_CASE("planc compile: gpt-2 cp 2, tp 2, sequence parallel (learned positions)") {
  CheckPlancEquivalent("gpt_single", "gpt_cp2_tp2_sp");
}
TEST_CASE("planc compile: moe tp 2, pp 2, dp 2, ZeRO 1, sequence parallel (etp 1)") {
  CheckPlancEquivalent("moe_single", "moe_tp2_pp2_dp2_zero1_sp");
}

TEST_CASE("planc compile: moe tp 2, dp 2, sequence parallel (etp 1: expert grads over Edp)") {
  CheckPlancEquivalent("moe_single", "moe_tp2_dp2_sp");
}
TEST_CASE("planc compile: moe tp 2, dp 2, ZeRO 1, sequence parallel (etp 1: states over Edp)") {
  CheckPlancEquivalent("moe_single", "moe_tp2_dp2_zero1_sp");
}
TEST_CASE("planc compile: moe cp 2, tp 2, sequence parallel (etp 1)") {
  CheckPlancEquivalent("moe_single", "moe_cp2_tp2_sp");
}
TEST_CASE("planc compile: moe etp 2, tp 2, sequence parallel (rows gathered over Etp)") {
  CheckPlancEquivalent("moe_single", "moe_etp2_tp2_sp");
}
TEST_CASE("planc compile: moe etp 2, tp 2, no sequence parallelism (partials all-reduced)") {
  CheckPlancEquivalent("moe_single", "moe_etp2_tp2");
}
TEST_CASE("planc compile: moe etp 2, tp 2, pp 2, dp 2, ZeRO 1, sequence parallel") {
  CheckPlancEquivalent("moe_single", "moe_etp2_tp2_pp2_dp2_zero1_sp");
}

// DeepSeek-V3's router: sigmoid scores and the aux-loss-free expert bias, whose update sums the
// load over Dp (and the counts over Tp under sp, and over Cp).
TEST_CASE("planc compile: moe with sigmoid router and expert bias, tp 2, pp 2, dp 2, ZeRO 1, sp") {
  CheckPlancEquivalent("moe_v3_single", "moe_v3_tp2_pp2_dp2_zero1_sp");
}
TEST_CASE("planc compile: moe with sigmoid router and expert bias, cp 2, tp 2, sp") {
  CheckPlancEquivalent("moe_v3_single", "moe_v3_cp2_tp2_sp");
}
TEST_CASE("planc compile: moe with sigmoid router and expert bias, etp 2, tp 2, sp") {
  CheckPlancEquivalent("moe_v3_single", "moe_v3_etp2_tp2_sp");
}
// Group-limited routing and the routed scaling factor (DeepSeek-V3): every layout routes each
// row among the same kept groups, the Etp group's second routing included.
TEST_CASE("planc compile: moe with group-limited routing and a scale, tp 2, pp 2, dp 2, sp") {
  CheckPlancEquivalent("moe_grouped_single", "moe_grouped_tp2_pp2_dp2_sp");
}
TEST_CASE("planc compile: moe with group-limited routing and a scale, etp 2, tp 2, sp") {
  CheckPlancEquivalent("moe_grouped_single", "moe_grouped_etp2_tp2_sp");
}
TEST_CASE("planc compile: moe with group-limited softmax routing and a scale, ep 2, tp 2, sp") {
  CheckPlancEquivalent("moe_grouped_softmax_single", "moe_grouped_softmax_ep2_tp2_dp2_sp");
}
TEST_CASE("group-limited routing changes the routing: the run differs from the ungrouped one") {
  const RunResult grouped = Run(PlancCompile("moe_grouped_single"));
  const RunResult ungrouped = Run(PlancCompile("moe_grouped_ungrouped"));
  CHECK(grouped.steps.front().loss != ungrouped.steps.front().loss);
}
TEST_CASE("planc compile: moe with a capacity factor, tp 2, pp 2, dp 2") {
  CheckPlancEquivalent("moe_capacity_single", "moe_capacity_tp2_pp2_dp2");
}
TEST_CASE("planc compile: moe with a capacity factor, etp 2, tp 2") {
  CheckPlancEquivalent("moe_capacity_single", "moe_capacity_etp2_tp2");
}
TEST_CASE("planc compile: moe with a capacity factor, ep 2, dp 2") {
  CheckPlancEquivalent("moe_capacity_single", "moe_capacity_ep2_dp2");
}
// Experts split over the Etp group under sequence parallelism: each rank drops past the capacity
// of its own rows (one segment of the group's gathered rows), as the etp 1 layout does, whose
// run is the reference (the one-rank run's microbatches hold twice a rank's rows).
TEST_CASE("planc compile: moe with a capacity factor, etp 2, tp 2, sp, equals etp 1, tp 2, sp") {
  CheckPlancEquivalent("moe_capacity_tp2_sp", "moe_capacity_etp2_tp2_sp");
}
TEST_CASE("planc compile: moe with a capacity factor, ep 2, etp 2, tp 2, sp, equals etp 1") {
  CheckPlancEquivalent("moe_capacity_ep2_tp2_dp2_sp", "moe_capacity_ep2_etp2_tp2_dp2_sp");
}
TEST_CASE("a capacity factor drops tokens: the run differs from the dropless one") {
  const RunResult capped = Run(PlancCompile("moe_capacity_single"));
  const RunResult dropless = Run(PlancCompile("moe_single"));
  CHECK(capped.steps.front().loss != dropless.steps.front().loss);
}
// A program whose capacity ops disagree with its buffers fails the run with the numbers: rows
// that are not `segments` equal runs, and more kept pairs than the permuted buffer reserves.
TEST_CASE("a capacity factor: a program that breaks its bounds fails clearly") {
  paraplan::Plan plan = TinyPlan(false, Etp({2, 1, 1, 1, Schedule::k1F1B, true}));
  plan.moe.capacity_factor = 0.75;
  paraplan::DiagnosticSink sink;
  const auto program = paraplan::lower::LowerPlan(plan, {}, sink);
  REQUIRE(program.has_value());
  auto mutated = [&](int64_t attribute, int64_t value) {
    paraplan::lower::Program p = *program;
    int changed = 0;
    for (auto& role : p.roles)
      for (auto& body : role.bodies)
        for (auto& op : body.ops)
          if (op.kind == paraplan::prog::OpKind::MoeCapacity) {
            op.ints.resize(std::max<size_t>(op.ints.size(), static_cast<size_t>(attribute) + 1), 1);
            op.ints[static_cast<size_t>(attribute)] = value;
            ++changed;
          }
    REQUIRE(changed > 0);
    const std::vector<uint8_t> bytes = paraplan::lower::ToFlatBuffer(p);
    return DecodeProgramImage(bytes.data(), bytes.size(), "mutated");
  };
  // segments (attribute 4): 7 runs, which do not divide the Etp group's gathered rows.
  CHECK_THROWS_WITH(Run(mutated(4, 7)),
                    doctest::Contains("the rows are not `segments` runs of equal length"));
  // capacity (attribute 2): every pair kept, past the buffer sized by the plan's capacity.
  CHECK_THROWS_WITH(Run(mutated(2, 1 << 20)),
                    doctest::Contains("rows the permuted buffer reserves"));
}
TEST_CASE("the expert bias changes the routing, and a checkpoint keeps it: resume is bitwise") {
  const ProgramImage program = PlancCompile("moe_v3_tp2_pp2_dp2_zero1_sp");
  const RunResult full = Run(program);
  const RunResult unbiased = Run(PlancCompile("moe_v3_nobias"));
  CHECK(unbiased.steps.back().loss != doctest::Approx(full.steps.back().loss).epsilon(1e-6));
  RunOptions first;
  first.data_path = SourceDir() + "/data/corpus/classics.txt";
  first.comm_timeout_seconds = 120;
  first.steps = 3;
  first.checkpoint_dir = Dir() + "/expert_bias_checkpoints";
  Train(program, first);
  RunOptions second = first;
  second.steps = -1;
  second.checkpoint_dir.clear();
  second.resume_dir = first.checkpoint_dir;
  const RunResult resumed = Train(program, second);
  REQUIRE(resumed.steps.size() == 2);
  for (size_t s = 0; s < 2; ++s) CHECK(resumed.steps[s].loss == full.steps[s + 3].loss);
  CHECK(resumed.params == full.params);
}

TEST_CASE("planc compile: moe ep 2, tp 2, dp 2, sequence parallel (etp 1)") {
  CheckPlancEquivalent("moe_single", "moe_ep2_tp2_dp2_sp");
}
TEST_CASE("planc compile: moe ep 2, tp 2, dp 2, ZeRO 1, sequence parallel (etp 1)") {
  CheckPlancEquivalent("moe_single", "moe_ep2_tp2_dp2_zero1_sp");
}
TEST_CASE("planc compile: moe ep 2, pp 2, dp 2 (etp 1)") {
  CheckPlancEquivalent("moe_single", "moe_ep2_pp2_dp2");
}

TEST_CASE("planc compile: moe ep 2, etp 2 = tp 2, dp 4, sequence parallel") {
  CheckPlancEquivalent("moe_single", "moe_ep2_etp2_tp2_dp4_sp");
}
TEST_CASE("planc compile: moe ep 2, etp 2 = tp 2, dp 4, without sequence parallelism") {
  CheckPlancEquivalent("moe_single", "moe_ep2_etp2_tp2_dp4");
}
TEST_CASE("planc compile: moe ep 2, etp 2 = tp 2, dp 4, ZeRO 1, sequence parallel") {
  CheckPlancEquivalent("moe_single", "moe_ep2_etp2_tp2_dp4_zero1_sp");
}

TEST_CASE(
    "planc compile: DeepSeek-V2-shaped (latent attention, experts), tp 2, pp 2, dp 2, etp 2") {
  CheckPlancEquivalent("deepseek_single", "deepseek_tp2_pp2_dp2_zero1_sp");
}

TEST_CASE("planc compile: DeepSeek-V2-shaped (latent attention, experts), ep 2, tp 2, sp, dp 2") {
  CheckPlancEquivalent("deepseek_single", "deepseek_ep2_tp2_dp2_sp");
}

TEST_CASE(
    "planc compile: DeepSeek-V2-shaped (latent attention, experts), ep 2, etp 2 = tp 2, pp 2, sp") {
  CheckPlancEquivalent("deepseek_single", "deepseek_ep2_etp2_tp2_pp2_dp2_sp");
}

TEST_CASE("the DeepSeek-V2-shaped example compiles and trains on 8 CPU ranks; its loss falls") {
  const ProgramImage program = PlancCompile("tiny_deepseek_8cpu", "examples/tiny_deepseek.plan");
  CHECK(program.world_size == 8);
  RunOptions options;
  options.steps = 12;
  const RunResult r = Train(program, options);
  REQUIRE(r.steps.size() == 12);
  CHECK(r.steps[0].loss == doctest::Approx(std::log(259.0)).epsilon(0.05));
  CHECK(r.steps.back().loss < r.steps[0].loss - 0.5);
}

TEST_CASE("the main job's plan compiles and trains (2 steps of examples/tiny_llama.plan)") {
  const ProgramImage program = PlancCompile("tiny_llama_8cpu", "examples/tiny_llama.plan");
  CHECK(program.world_size == 8);
  RunOptions options;
  options.steps = 2;
  const RunResult r = Train(program, options);
  REQUIRE(r.steps.size() == 2);
  CHECK(r.steps[0].loss == doctest::Approx(std::log(259.0)).epsilon(0.05));
  CHECK(r.steps[1].loss < r.steps[0].loss);
  CHECK(r.data_description.find("classics.txt") !=
        std::string::npos);  // the bundled text by default
}

// The coverage rule of docs/adding-an-op.md: every op the registry marks as emitted
// (runtime/format/ops.def) is trained by one of the cases above, and planc emits no op the
// registry calls runtime-only or reserved. The layouts are those of cases above; lowering them
// is enough to see which ops they run.
TEST_CASE("coverage: every op planc emits is trained by an equivalence case") {
  struct Case {
    bool gpt;
    Layout layout;
  };
  Layout sgd{2, 2, 2, 1, Schedule::k1F1B, true, 1};
  sgd.sgd = true;
  const Case cases[] = {
      {false, {2, 1, 1, 1, Schedule::k1F1B, true}},
      {false, {1, 2, 1, 1, Schedule::k1F1B}},
      {false, {1, 1, 2, 1, Schedule::k1F1B, false, 2}},
      {false, {2, 2, 2, 2, Schedule::kInterleaved1F1B, true, 3, Recompute::kFull}},
      {false, {2, 1, 1, 1, Schedule::k1F1B, true, 0, Recompute::kSelective}},
      {false, sgd},
      {true, {1, 2, 2, 1}},
      {true, {2, 2, 2, 1, Schedule::k1F1B, true, 3}},
      {false, WithCp(2)},
      {false, Moe({2, 1, 1, 1, Schedule::k1F1B, true})},
      {false, WithEp(2, {1, 1, 2, 1})},
      {false, Etp({2, 1, 1, 1, Schedule::k1F1B, true})},
      {false, WithSquaredRelu({2, 1, 1, 1, Schedule::k1F1B, true})},
  };
  std::vector<paraplan::Plan> plans;
  for (const Case& c : cases) plans.push_back(TinyPlan(c.gpt, c.layout));
  plans.push_back(MlaPlan({2, 1, 1, 1, Schedule::k1F1B, true}, true));     // multi-head latent
  plans.push_back(LandingPlan({1, 2, 1, 3, Schedule::kInterleaved1F1B}));  // a landing buffer
  std::set<paraplan::prog::OpKind> emitted;
  for (const paraplan::Plan& plan : plans) {
    paraplan::DiagnosticSink sink;
    auto program = paraplan::lower::LowerPlan(plan, {}, sink);
    REQUIRE(program.has_value());
    for (const auto& role : program->roles) {
      for (const auto& op : role.schedule) emitted.insert(op.kind);
      for (const auto& body : role.bodies)
        for (const auto& op : body.ops) emitted.insert(op.kind);
    }
  }
  // Plans of the `planc compile` cases (the router the model states: the expert bias).
  for (const char* plan : {"moe_v3_tp2_pp2_dp2_zero1_sp", "moe_capacity_tp2_pp2_dp2"}) {
    const ProgramImage program = PlancCompile(plan);
    for (const auto& role : program.roles) {
      for (const auto& op : role.schedule) emitted.insert(op.kind);
      for (const auto& body : role.bodies)
        for (const auto& op : body.ops) emitted.insert(op.kind);
    }
  }
  for (const paraplan::prog::OpInfo& op : paraplan::prog::AllOps()) {
    CAPTURE(op.type_name);
    const bool is_emitted = op.status == paraplan::prog::OpStatus::kEmitted;
    CHECK_MESSAGE(emitted.count(op.kind) == (is_emitted ? 1u : 0u),
                  (is_emitted ? "no equivalence case trains this op"
                              : "planc emits an op the registry does not mark as emitted"));
  }
}
