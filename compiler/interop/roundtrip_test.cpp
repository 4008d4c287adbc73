// import(export(plan)) == plan for every example and every target that can express it; a target
// that cannot says which setting (P0905) instead of writing an approximate file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "compiler/check/evaluate.h"
#include "compiler/interop/interop.h"

namespace paraplan {
namespace {

std::string Root() {
  const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
  return root ? root : ".";
}

std::optional<Plan> EvaluateText(const std::string& name, const std::string& text,
                                 SourceManager& sm, DiagnosticSink& sink) {
  LoadOptions load;
  load.stdlib_dir = Root() + "/stdlib";
  auto source = PlanSource::FromText(name, text, load, sm, sink);
  if (!source) return std::nullopt;
  return source->Evaluate("", {}, EvalOptions{}, sink);
}

// Fields a framework's file does not hold: the GPU's and the network's figures (import takes the
// cluster from --gpu), and settings a target has no key for, listed per target.
bool Compared(std::string_view path, ConfigKind kind) {
  if (path.rfind("cluster.gpu.", 0) == 0 || path == "cluster.nvlink_bandwidth" ||
      path == "cluster.network_bandwidth") {
    return false;
  }
  // The framework is the target's (checked below); moe.imbalance is a modelling assumption that
  // no framework states.
  if (path == "framework" || path == "moe.imbalance") return false;
  if (kind == ConfigKind::kTorchtitan && path == "train.data") return false;
  if (kind == ConfigKind::kNemo && (path == "train.data" || path == "train.checkpoint_dir" ||
                                    path == "train.checkpoint_every")) {
    return false;
  }
  return true;
}

std::vector<std::string> Differences(const Plan& a, const Plan& b, ConfigKind kind) {
  std::vector<std::string> out;
  for (const FieldInfo& f : PlanFields()) {
    if (!Compared(f.path, kind)) continue;
    FieldValue va = GetFieldValue(a, f), vb = GetFieldValue(b, f);
    const double* da = std::get_if<double>(&va);
    const double* db = std::get_if<double>(&vb);
    bool same = da && db ? std::fabs(*da - *db) <= 1e-12 * std::max(std::fabs(*da), std::fabs(*db))
                         : va == vb;
    if (!same)
      out.push_back(std::string(f.path) + ": " + *GetFieldText(a, f.path) + " -> " +
                    *GetFieldText(b, f.path));
  }
  return out;
}

TEST_CASE(
    "import(export(plan)) equals the plan for every example, or the target says what it cannot "
    "express") {
  namespace fs = std::filesystem;
  const fs::path scratch =
      fs::temp_directory_path() / ("paraplan_roundtrip_" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  int round_trips = 0, examples = 0;
  for (const auto& entry : fs::directory_iterator(Root() + "/examples")) {
    if (entry.path().extension() != ".plan") continue;
    ++examples;
    std::ifstream in(entry.path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SourceManager sm;
    DiagnosticSink sink;
    auto plan = EvaluateText(entry.path().string(), text, sm, sink);
    REQUIRE_MESSAGE(plan, entry.path().string());
    // Two examples are plans no framework runs as written (their READMEs say why); with the fix
    // their diagnostics give, they export and come back unchanged.
    const std::string stem = entry.path().stem().string();
    if (stem == "megatron_deepspeed_1t") {
      // ZeRO-3 with pipeline parallelism (DeepSpeed refuses it) and CP (Megatron-DeepSpeed has
      // none).
      DiagnosticSink refused;
      CHECK(ExportPlan(ConfigKind::kDeepSpeed, *plan, refused).text.empty());
      CHECK(refused.diagnostics().size() == 2);
      CHECK(SetFieldText(*plan, "optimizer.zero", "1").empty());
    }
    if (stem == "nanotron_small_llama") {
      // Nanotron's greedy cost split: no framework here splits by cost.
      DiagnosticSink refused;
      CHECK(ExportPlan(ConfigKind::kMegatron, *plan, refused).text.empty());
      CHECK(SetFieldText(*plan, "pipeline.balance", "even").empty());
    }
    int exported = 0;
    for (ConfigKind kind : {ConfigKind::kMegatron, ConfigKind::kTorchtitan, ConfigKind::kDeepSpeed,
                            ConfigKind::kNemo}) {
      CAPTURE(entry.path().filename().string());
      CAPTURE(ToString(kind));
      DiagnosticSink export_sink;
      ExportResult out = ExportPlan(kind, *plan, export_sink);
      if (out.text.empty()) {
        // Refused: every diagnostic is P0905 and names a setting of the plan.
        REQUIRE(!export_sink.diagnostics().empty());
        for (const Diagnostic& d : export_sink.diagnostics())
          CHECK(GetDiagKindInfo(d.kind).code == "P0905");
        continue;
      }
      ++exported;
      const fs::path file = scratch / ("exported." + std::string(ToString(kind)));
      if (!out.companion_name.empty())
        std::ofstream(scratch / out.companion_name) << out.companion_text;
      ImportOptions options;
      options.stdlib_dir = Root() + "/stdlib";
      options.nodes = plan->cluster.nodes;
      options.gpus_per_node = plan->cluster.gpus_per_node;
      options.gpu = plan->cluster.gpu.name.find("a100") != std::string::npos
                        ? plan->cluster.gpu.name
                        : "h100";
      SourceManager sm2;
      DiagnosticSink sink2;
      auto imported = ImportConfigText(kind, file.string(), out.text, options, sm2, sink2);
      REQUIRE_MESSAGE(imported, out.text);
      auto back = EvaluateText("imported", imported->text, sm2, sink2);
      REQUIRE(back);
      CHECK_MESSAGE(!sink2.has_errors(), imported->text);
      std::vector<std::string> diff = Differences(*plan, *back, kind);
      CHECK_MESSAGE(diff.empty(), [&] {
        std::string s;
        for (const std::string& d : diff) s += d + "\n";
        return s + out.text;
      }());
      const char* framework = kind == ConfigKind::kTorchtitan  ? "torchtitan"
                              : kind == ConfigKind::kDeepSpeed ? "deepspeed"
                                                               : "megatron_core";
      CHECK(*GetFieldText(*back, "framework") == framework);
      ++round_trips;
    }
    CHECK_MESSAGE(exported > 0, entry.path().string());
  }
  fs::remove_all(scratch);
  CHECK(examples >= 10);
  MESSAGE("round trips: " << round_trips << " over " << examples << " examples");
}

TEST_CASE("TP communication overlap round-trips through megatron, torchtitan and nemo") {
  namespace fs = std::filesystem;
  const fs::path scratch =
      fs::temp_directory_path() / ("paraplan_overlap_" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  std::map<ConfigKind, int> round_trips;
  // The examples with tensor and sequence parallelism, and torchtitan's Llama 3 70B preset (TP 8),
  // since no example exports to torchtitan with tp > 1.
  std::vector<std::pair<std::string, Plan>> sources;
  SourceManager sm;
  DiagnosticSink sink;
  for (const auto& entry : fs::directory_iterator(Root() + "/examples")) {
    if (entry.path().extension() != ".plan") continue;
    std::ifstream in(entry.path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto plan = EvaluateText(entry.path().string(), text, sm, sink);
    REQUIRE_MESSAGE(plan, entry.path().string());
    if (plan->parallel.tp > 1 && plan->parallel.sp)
      sources.emplace_back(entry.path().filename(), *plan);
  }
  {
    const std::string path = Root() + "/tests/interop/corpus/torchtitan/llama3_70b.toml";
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ImportOptions options;
    options.stdlib_dir = Root() + "/stdlib";
    options.nodes = 8;
    options.gpu = "a100";
    auto imported = ImportConfigText(ConfigKind::kTorchtitan, path, text, options, sm, sink);
    REQUIRE(imported);
    auto plan = EvaluateText("llama3_70b", imported->text, sm, sink);
    REQUIRE(plan);
    REQUIRE(plan->parallel.tp == 8);
    CHECK_FALSE(plan->parallel.tp_comm_overlap);
    sources.emplace_back("llama3_70b.toml", *plan);
  }
  for (const auto& entry : sources) {
    const auto& name = entry.first;  // not a structured binding: CAPTURE captures it
    const auto& source = entry.second;
    const Plan* plan = &source;
    for (ConfigKind kind : {ConfigKind::kMegatron, ConfigKind::kTorchtitan, ConfigKind::kDeepSpeed,
                            ConfigKind::kNemo}) {
      CAPTURE(name);
      CAPTURE(ToString(kind));
      DiagnosticSink plain_sink;
      if (ExportPlan(kind, *plan, plain_sink).text.empty()) continue;  // refused for other reasons
      Plan overlap = *plan;
      overlap.parallel.tp_comm_overlap = true;
      // torchtitan runs async TP only compiled: its export turns torch.compile on.
      if (kind == ConfigKind::kTorchtitan) overlap.compile = true;
      DiagnosticSink export_sink;
      ExportResult out = ExportPlan(kind, overlap, export_sink);
      if (kind == ConfigKind::kDeepSpeed) {
        // Megatron-DeepSpeed has no such flag: refused, naming the field.
        CHECK(out.text.empty());
        REQUIRE(export_sink.diagnostics().size() == 1);
        CHECK(GetDiagKindInfo(export_sink.diagnostics()[0].kind).code == "P0905");
        continue;
      }
      REQUIRE(!out.text.empty());
      const fs::path file = scratch / ("exported." + std::string(ToString(kind)));
      if (!out.companion_name.empty())
        std::ofstream(scratch / out.companion_name) << out.companion_text;
      ImportOptions options;
      options.stdlib_dir = Root() + "/stdlib";
      options.nodes = overlap.cluster.nodes;
      options.gpus_per_node = overlap.cluster.gpus_per_node;
      options.gpu = overlap.cluster.gpu.name.find("a100") != std::string::npos
                        ? overlap.cluster.gpu.name
                        : "h100";
      SourceManager sm2;
      DiagnosticSink sink2;
      auto imported = ImportConfigText(kind, file.string(), out.text, options, sm2, sink2);
      REQUIRE_MESSAGE(imported, out.text);
      auto back = EvaluateText("imported", imported->text, sm2, sink2);
      REQUIRE(back);
      CHECK_MESSAGE(!sink2.has_errors(), imported->text);
      CHECK_MESSAGE(back->parallel.tp_comm_overlap, imported->text);
      std::vector<std::string> diff = Differences(overlap, *back, kind);
      CHECK_MESSAGE(diff.empty(), [&] {
        std::string s;
        for (const std::string& d : diff) s += d + "\n";
        return s;
      }());
      ++round_trips[kind];
    }
  }
  fs::remove_all(scratch);
  CHECK(round_trips[ConfigKind::kMegatron] > 0);
  CHECK(round_trips[ConfigKind::kTorchtitan] > 0);
  CHECK(round_trips[ConfigKind::kNemo] > 0);
}

// The settings Megatron-Bridge configs carry beyond NeMo's GPT keys: the MoE router in full,
// shared experts and leading dense layers, QK-norm, token dropping, multi-token prediction,
// activation offload and the gradient precision. Each variant exports to NeMo and imports back
// unchanged.
TEST_CASE("the MoE router, QK-norm and gradient precision round-trip through nemo") {
  constexpr const char* kMoePlan = R"(import std.clusters
model small_moe {
  layers = 8  hidden = 512  ffn_hidden = 1024  heads = 8  kv_heads = 2  head_dim = 64
  vocab = 32000  seq_len = 2048  norm = rmsnorm  activation = swiglu  position = rope
  tied_embeddings = false
  experts = 16  topk = 4  moe_ffn_hidden = 128
}
plan small_moe_h100 {
  model = small_moe
  cluster = dgx_h100 { nodes = 2 }
  framework = megatron_core
  parallel { tp = 1  pp = 2  ep = 8 }
  batch { global = 64  micro = 1 }
  precision = fp8
  mixed_precision { fp8 = current  grads = bf16 }
  optimizer { zero = 1 }
}
)";
  const std::vector<std::vector<std::pair<std::string, std::string>>> variants = {
      {},
      {{"model.qk_norm", "true"},
       {"model.router_score", "sigmoid"},
       {"model.router_aux_coeff", "0.0"},
       {"model.router_bias_rate", "0.001"},
       {"model.router_groups", "4"},
       {"model.router_group_topk", "2"},
       {"model.router_scale", "2.5"},
       {"moe.capacity_factor", "1.25"},
       {"moe.drop_policy", "position"},
       {"model.mtp_layers", "1"},
       {"model.mtp_loss_scale", "0.3"},
       {"activations.offload_layers", "1"}},
      {{"model.router_topk_norm", "false"},
       {"model.router_aux_coeff", "0.001"},
       {"model.shared_experts", "2"},
       {"model.dense_layers", "1"},
       {"mixed_precision.grads", "fp32"}},
      {{"model.moe_layer_freq", "2"}, {"precision", "bf16"}, {"mixed_precision.fp8", "none"}},
  };
  for (size_t i = 0; i < variants.size(); ++i) {
    CAPTURE(i);
    SourceManager sm;
    DiagnosticSink sink;
    auto plan = EvaluateText("small_moe.plan", kMoePlan, sm, sink);
    REQUIRE(plan);
    for (const auto& [path, value] : variants[i]) REQUIRE(SetFieldText(*plan, path, value).empty());
    DiagnosticSink export_sink;
    ExportResult out = ExportPlan(ConfigKind::kNemo, *plan, export_sink);
    REQUIRE_MESSAGE(!out.text.empty(), export_sink.diagnostics().size());
    ImportOptions options;
    options.stdlib_dir = Root() + "/stdlib";
    options.nodes = plan->cluster.nodes;
    options.gpus_per_node = plan->cluster.gpus_per_node;
    options.gpu = "h100";
    SourceManager sm2;
    DiagnosticSink sink2;
    auto imported =
        ImportConfigText(ConfigKind::kNemo, "exported.yaml", out.text, options, sm2, sink2);
    REQUIRE_MESSAGE(imported, out.text);
    auto back = EvaluateText("imported", imported->text, sm2, sink2);
    REQUIRE(back);
    CHECK_MESSAGE(!sink2.has_errors(), imported->text);
    std::vector<std::string> diff = Differences(*plan, *back, ConfigKind::kNemo);
    CHECK_MESSAGE(diff.empty(), [&] {
      std::string s;
      for (const std::string& d : diff) s += d + "\n";
      return s + out.text;
    }());
  }
}

// An explicit split with one entry per virtual stage is Megatron-Core's pipeline layout: it
// exports to megatron and nemo as one and comes back unchanged (vpp included, which Megatron-LM
// derives from the layout); one entry per rank over several chunks is refused.
TEST_CASE("an explicit per-chunk split round-trips through megatron and nemo as a layout") {
  constexpr const char* kPlan = R"(import std.clusters
model small_mtp {
  layers = 8  hidden = 512  ffn_hidden = 1024  heads = 8  kv_heads = 2  head_dim = 64
  vocab = 32000  seq_len = 2048  norm = rmsnorm  activation = swiglu  position = rope
  tied_embeddings = false  mtp_layers = 1
}
plan small_mtp_h100 {
  model = small_mtp
  cluster = dgx_h100 { nodes = 1 }
  framework = megatron_core
  parallel { tp = 2  pp = 2  vpp = 2 }
  batch { global = 64  micro = 1 }
  precision = bf16
  optimizer { zero = 1 }
  pipeline { schedule = interleaved_1f1b  stage_layers = [1, 3, 3, 1] }
}
)";
  struct Variant {
    std::vector<std::pair<std::string, std::string>> set;
    std::string layout;  // as written in both files
  };
  const std::vector<Variant> variants = {
      {{}, "Et|(ttt|)*2tmL"},
      {{{"pipeline.stage_layers", "[1, 2, 2, 2, 1, 0]"},
        {"parallel.vpp", "3"},
        {"model.mtp_layers", "2"}},
       "Et|(tt|)*3t|mmL"},
      {{{"pipeline.stage_layers", "[3, 5]"},
        {"parallel.vpp", "1"},
        {"pipeline.schedule", "1f1b"},
        {"model.mtp_layers", "0"}},
       "Ettt|t*5L"},
  };
  for (size_t i = 0; i < variants.size(); ++i) {
    for (ConfigKind kind : {ConfigKind::kMegatron, ConfigKind::kNemo}) {
      CAPTURE(i);
      CAPTURE(ToString(kind));
      SourceManager sm;
      DiagnosticSink sink;
      auto plan = EvaluateText("small_mtp.plan", kPlan, sm, sink);
      REQUIRE(plan);
      for (const auto& [path, value] : variants[i].set)
        REQUIRE(SetFieldText(*plan, path, value).empty());
      DiagnosticSink export_sink;
      ExportResult out = ExportPlan(kind, *plan, export_sink);
      REQUIRE_MESSAGE(!out.text.empty(), export_sink.diagnostics().size());
      CHECK(out.text.find("\"" + variants[i].layout + "\"") != std::string::npos);
      // Megatron-LM takes no other virtual-stage flag beside the layout.
      CHECK(out.text.find("--num-virtual-stages-per-pipeline-rank") == std::string::npos);
      CHECK(out.text.find("--num-layers-per-virtual-pipeline-stage") == std::string::npos);
      ImportOptions options;
      options.stdlib_dir = Root() + "/stdlib";
      options.nodes = plan->cluster.nodes;
      options.gpus_per_node = plan->cluster.gpus_per_node;
      options.gpu = "h100";
      SourceManager sm2;
      DiagnosticSink sink2;
      auto imported = ImportConfigText(kind, "exported", out.text, options, sm2, sink2);
      REQUIRE_MESSAGE(imported, out.text);
      auto back = EvaluateText("imported", imported->text, sm2, sink2);
      REQUIRE(back);
      CHECK_MESSAGE(!sink2.has_errors(), imported->text);
      CHECK(back->pipeline.stage_layers == plan->pipeline.stage_layers);
      std::vector<std::string> diff = Differences(*plan, *back, kind);
      CHECK_MESSAGE(diff.empty(), [&] {
        std::string s;
        for (const std::string& d : diff) s += d + "\n";
        return s + out.text;
      }());
    }
  }
  // One entry per rank with two chunks each: refused, naming the field.
  for (ConfigKind kind : {ConfigKind::kMegatron, ConfigKind::kNemo, ConfigKind::kDeepSpeed}) {
    CAPTURE(ToString(kind));
    SourceManager sm;
    DiagnosticSink sink;
    auto plan = EvaluateText("small_mtp.plan", kPlan, sm, sink);
    REQUIRE(plan);
    REQUIRE(SetFieldText(*plan, "pipeline.stage_layers", "[4, 4]").empty());
    DiagnosticSink export_sink;
    CHECK(ExportPlan(kind, *plan, export_sink).text.empty());
    bool named = false;
    for (const Diagnostic& d : export_sink.diagnostics()) {
      CHECK(GetDiagKindInfo(d.kind).code == "P0905");
      named = named || d.message.find("pipeline.stage_layers") != std::string::npos;
    }
    CHECK(named);
  }
}

}  // namespace
}  // namespace paraplan
