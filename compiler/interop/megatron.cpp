// Megatron-LM / Megatron-Core launch scripts and argument files for pretrain_gpt.py: the flags
// through MegatronRows(), the cluster from the launcher (torchrun, srun, #SBATCH), and the
// settings that need more than one flag (virtual stages from layers per virtual stage, dense
// layers from --moe-layer-freq, shared experts from their size, Megatron's defaults).
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "compiler/base/checked.h"
#include "compiler/interop/draft.h"
#include "compiler/interop/readers.h"
#include "compiler/interop/shell_words.h"
#include "compiler/interop/tables.h"

namespace paraplan::interop {
namespace {

struct FlagValue {
  std::string text;    // the value ("" for a switch)
  SourceRange range;   // the flag and its value
  std::string source;  // "--tensor-model-parallel-size 4"
};

// Launcher flags: torchrun, srun and #SBATCH.
enum class Launcher : uint8_t { kNodes, kGpusPerNode, kOther };

Launcher LauncherFlag(std::string_view flag) {
  // torchrun, srun/#SBATCH, and the deepspeed launcher.
  if (flag == "--nnodes" || flag == "--nodes" || flag == "-N" || flag == "--num_nodes") {
    return Launcher::kNodes;
  }
  if (flag == "--num_gpus" || flag == "--nproc-per-node" || flag == "--nproc_per_node" ||
      flag == "--gpus-per-node" || flag == "--ntasks-per-node" || flag == "--gres") {
    return Launcher::kGpusPerNode;
  }
  return Launcher::kOther;
}

bool IsLauncherSetting(std::string_view flag) {
  static const std::set<std::string_view> kLauncher = {"--node-rank",
                                                       "--node_rank",
                                                       "--master-addr",
                                                       "--master_addr",
                                                       "--master-port",
                                                       "--master_port",
                                                       "--rdzv-id",
                                                       "--rdzv_id",
                                                       "--rdzv-backend",
                                                       "--rdzv_backend",
                                                       "--rdzv-endpoint",
                                                       "--rdzv_endpoint",
                                                       "--standalone",
                                                       "--max-restarts",
                                                       "--max_restarts",
                                                       "--job-name",
                                                       "--time",
                                                       "--partition",
                                                       "--account",
                                                       "--output",
                                                       "--error",
                                                       "--exclusive",
                                                       "--mem",
                                                       "--cpus-per-task",
                                                       "--container-image",
                                                       "--container-mounts",
                                                       "--mpi",
                                                       "--ntasks",
                                                       "--qos",
                                                       "--dependency",
                                                       "--overlap"};
  return kLauncher.count(flag) > 0;
}

bool TakesNoValue(std::string_view flag) {
  return flag == "--standalone" || flag == "--exclusive" || flag == "--overlap";
}

// Flags of pretrain_gpt.py that do not change the layout, by prefix.
bool IsNonLayoutFlag(std::string_view flag) {
  static constexpr const char* kPrefixes[] = {"--log",
                                              "--eval",
                                              "--tensorboard",
                                              "--wandb",
                                              "--timing",
                                              "--save",
                                              "--load",
                                              "--data",
                                              "--split",
                                              "--tokenizer",
                                              "--vocab-file",
                                              "--merge-file",
                                              "--lr-decay",
                                              "--lr-wsd",
                                              "--init-method",
                                              "--attention-dropout",
                                              "--hidden-dropout",
                                              "--no-",
                                              "--exit",
                                              "--use-flash",
                                              "--use-checkpoint",
                                              "--ckpt",
                                              "--dist-ckpt",
                                              "--distributed-backend",
                                              "--distributed-timeout",
                                              "--manual-gc",
                                              "--num-workers",
                                              "--mock-data",
                                              "--bias",
                                              "--disable-bias",
                                              "--rotary",
                                              "--attention-backend",
                                              "--cross-entropy",
                                              "--profile",
                                              "--calculate-per-token-loss",
                                              "--apply-layernorm-1p",
                                              "--layernorm-epsilon",
                                              "--norm-epsilon",
                                              "--make-vocab-size",
                                              "--tp-comm-overlap",
                                              "--async-save",
                                              "--ddp-",
                                              "--check-for-nan",
                                              "--seq-length-",
                                              "--transformer-impl",
                                              "--moe-router",
                                              "--moe-aux",
                                              "--moe-z-loss",
                                              "--moe-token",
                                              "--moe-permute",
                                              "--moe-expert-capacity",
                                              "--moe-pad",
                                              "--moe-per-layer",
                                              "--moe-shared-expert-overlap",
                                              "--qk-layernorm",
                                              "--use-rotary",
                                              "--attention-softmax",
                                              "--accumulate-allreduce",
                                              "--gradient-accumulation-fusion",
                                              "--masked-softmax",
                                              "--bias-",
                                              "--apply-query-key",
                                              "--untie-",
                                              "--position-embedding",
                                              "--group-query",
                                              "--max-position",
                                              "--override-opt",
                                              "--decoupled-lr",
                                              "--lr-",
                                              "--start-weight-decay",
                                              "--end-weight-decay",
                                              "--weight-decay-",
                                              "--loss-scale",
                                              "--initial-loss-scale",
                                              "--min-loss-scale",
                                              "--hysteresis",
                                              "--fp32-residual",
                                              "--attention-softmax-in-fp32",
                                              "--num-dataset-builder",
                                              "--object-storage",
                                              "--ft-",
                                              "--use-torch-fsdp2",
                                              "--sft",
                                              "--train-samples",
                                              "--exit-interval",
                                              "--rerun"};
  for (const char* p : kPrefixes) {
    if (flag.rfind(p, 0) == 0) return true;
  }
  return false;
}

// Whether `b` continues the command of `a`: the same line, or a `\` continuation between them.
bool Continued(const SourceManager& sm, uint32_t buffer, const ShellWord& a, const ShellWord& b) {
  std::string_view between = sm.Text(buffer).substr(a.range.end, b.range.begin - a.range.end);
  if (between.find('\n') == std::string_view::npos) return true;
  return between.find("\\\n") != std::string_view::npos;
}

// Flags read together with others (beside the table).
bool IsCombined(std::string_view flag) {
  return flag == "--num-query-groups" || flag == "--group-query-attention" ||
         flag == "--multi-latent-attention" || flag == "--moe-shared-expert-intermediate-size" ||
         flag == "--moe-layer-freq" || flag == "--num-layers-per-virtual-pipeline-stage" ||
         flag == "--recompute-modules" || flag == "--recompute-num-layers";
}

std::string FlagSource(std::string_view flag, std::string_view value) {
  return value.empty() ? std::string(flag) : std::string(flag) + " " + std::string(value);
}

}  // namespace

std::optional<PlanDraft> ReadMegatron(const SourceManager& sm, uint32_t buffer,
                                      DiagnosticSink& sink) {
  ShellScript script = ScanShellScript(sm, buffer);
  if (script.unterminated.IsValid()) {
    sink.Report(Diag(DiagKind::kConfigSyntax, "unterminated quote or `${` in a launch script")
                    .At(script.unterminated, "opened here and never closed")
                    .Help("close it; planc reads the script as the shell would"));
    return std::nullopt;
  }
  PlanDraft draft;
  draft.kind = ConfigKind::kMegatron;
  draft.vocab_help =
      "add `--vocab-size N` (pretrain_gpt.py takes the vocabulary from the tokenizer otherwise), "
      "or pass the shape of a stdlib model";
  std::map<std::string, FlagValue, std::less<>> flags;     // table rows: the last occurrence
  std::map<std::string, FlagValue, std::less<>> combined;  // read together with other flags
  bool ok = true;
  const auto& words = script.words;
  auto bad_value = [&](SourceRange at, std::string message, std::string help) {
    Diag d(DiagKind::kConfigBadValue, std::move(message));
    d.At(at);
    if (!help.empty()) d.Help(std::move(help));
    sink.Report(std::move(d));
    ok = false;
  };
  for (size_t i = 0; i < words.size(); ++i) {
    const ShellWord& w = words[i];
    if (w.list_expansion || w.text.size() < 2 || w.text[0] != '-') continue;
    std::string flag = w.text;
    std::string value;
    SourceRange range = w.range;
    bool has_inline_value = false;
    std::string unresolved = w.unresolved;
    if (auto eq = flag.find('='); eq != std::string::npos && flag.rfind("--", 0) == 0) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline_value = true;
    }
    const bool long_flag = flag.rfind("--", 0) == 0;
    if (!long_flag && flag != "-N") continue;  // set -ex, python -u, ...
    const SettingRow* row = FindRow(MegatronRows(), flag);
    const SkippedRow* skipped = FindSkipped(MegatronSkippedRows(), flag);
    const Launcher launcher = LauncherFlag(flag);
    bool takes_value = true;
    if (row)
      takes_value = row->convert != Convert::kSwitch;
    else if (IsCombined(flag))
      takes_value = flag != "--group-query-attention" && flag != "--multi-latent-attention";
    else if (skipped)
      takes_value = skipped->takes_value;
    else if (TakesNoValue(flag))
      takes_value = false;
    else if (launcher == Launcher::kOther && !IsLauncherSetting(flag)) {
      // Unknown: it takes the next word as its value when that is not a flag.
      takes_value = i + 1 < words.size() && !words[i + 1].text.empty() &&
                    words[i + 1].text[0] != '-' && words[i + 1].text != "(" &&
                    words[i + 1].text != ")" && !words[i + 1].list_expansion;
    }
    if (takes_value && !has_inline_value) {
      const bool next_is_value =
          i + 1 < words.size() && !words[i + 1].list_expansion && words[i + 1].text != ")" &&
          !(words[i + 1].text.rfind("--", 0) == 0) && words[i + 1].range.begin > w.range.end;
      // A value must be on the same logical line or follow in an array/list.
      if (!next_is_value || (row == nullptr && skipped == nullptr && launcher == Launcher::kOther &&
                             !IsLauncherSetting(flag) && !next_is_value)) {
        if (row || launcher != Launcher::kOther) {
          bad_value(w.range, "`" + flag + "` needs a value",
                    "write it after the flag: `" + flag + " N`");
        } else if (!IsLauncherSetting(flag)) {
          // Its value is a list held in a variable, or missing: still listed, never dropped.
          draft.Skip(flag, w.range,
                     skipped                 ? std::string(skipped->reason)
                     : IsNonLayoutFlag(flag) ? "not a layout setting"
                                             : "not recognised by planc");
        }
        continue;
      }
      const ShellWord& v = words[++i];
      value = v.text;
      unresolved = v.unresolved;
      range = {buffer, w.range.begin, v.range.end};
      // Flags that take a list (--recompute-modules core_attn mlp, --data-path 0.5 a 0.5 b):
      // the words up to the next flag on the same command.
      if (!row && launcher == Launcher::kOther && !IsLauncherSetting(flag)) {
        while (i + 1 < words.size() && !words[i + 1].list_expansion && !words[i + 1].text.empty() &&
               words[i + 1].text[0] != '-' && words[i + 1].text != "(" &&
               words[i + 1].text != ")" && !words[i + 1].text.ends_with(".py") &&
               Continued(sm, buffer, words[i], words[i + 1])) {
          value += " " + words[++i].text;
          range.end = words[i].range.end;
        }
      }
    }
    if (!unresolved.empty() && (row || launcher != Launcher::kOther)) {
      std::string help = launcher == Launcher::kNodes ? "pass --nodes N to planc"
                         : launcher == Launcher::kGpusPerNode
                             ? "pass --gpus-per-node N to planc"
                             : "set `" + unresolved + "` in the script";
      bad_value(range,
                "the value of `" + flag + "` comes from `" + unresolved +
                    "`, which the script does not set",
                help);
      continue;
    }
    FlagValue fv{value, range, FlagSource(flag, value)};
    if (launcher == Launcher::kNodes) {
      auto n = ParseInteger(value);
      if (!n) {
        bad_value(range, "`" + flag + "` expects a node count, got '" + value + "'",
                  "pass --nodes N to planc");
        continue;
      }
      draft.Set(fields::kClusterNodes, std::to_string(*n), range, fv.source);
      continue;
    }
    if (launcher == Launcher::kGpusPerNode) {
      std::string v = value;
      if (flag == "--gres") {  // gpu:8 or gpu:h100:8
        auto colon = v.rfind(':');
        if (v.rfind("gpu", 0) != 0 || colon == std::string::npos) {
          draft.Skip(fv.source, range, "not a GPU count");
          continue;
        }
        std::string kind = v.substr(0, colon);
        if (auto k = kind.find(':'); k != std::string::npos) {
          draft.gpu = kind.substr(k + 1);
          draft.gpu_origin = range;
          draft.gpu_source = fv.source;
        }
        v = v.substr(colon + 1);
      }
      auto n = ParseInteger(v);
      if (!n) {
        bad_value(range, "`" + flag + "` expects a GPU count, got '" + value + "'",
                  "pass --gpus-per-node N to planc");
        continue;
      }
      draft.Set(fields::kClusterGpusPerNode, std::to_string(*n), range, fv.source);
      continue;
    }
    if (IsLauncherSetting(flag)) continue;  // where to rendezvous, how long to run: no layout
    if (skipped) {
      draft.Skip(fv.source, range, std::string(skipped->reason));
      continue;
    }
    if (IsCombined(flag)) {
      combined[flag] = fv;
      continue;
    }
    if (!row) {
      draft.Skip(fv.source, range,
                 IsNonLayoutFlag(flag) ? "not a layout setting" : "not recognised by planc");
      continue;
    }
    flags[flag] = fv;
  }

  // The table.
  for (const auto& [flag, fv] : flags) {
    const SettingRow* row = FindRow(MegatronRows(), flag);
    std::string error;
    auto v = ConvertSetting(*row, fv.text, &error);
    if (!v) {
      if (!error.empty()) bad_value(fv.range, "`" + flag + "` " + error, "");
      continue;
    }
    // --bf16 with --fp8-format: fp8 wins (the fp8 layers run on a bf16 model).
    if (row->path == fields::kPrecision && flags.count("--fp8-format") && flag != "--fp8-format")
      continue;
    draft.Set(row->path, *v, fv.range, fv.source);
  }
  if (!ok) return std::nullopt;

  auto get = [&](FieldId path) -> std::optional<int64_t> {
    const DraftSetting* s = draft.Find(path);
    return s ? ParseInteger(s->value) : std::nullopt;
  };
  auto combined_of = [&](std::string_view f) -> const FlagValue* {
    auto it = combined.find(f);
    return it == combined.end() ? nullptr : &it->second;
  };
  auto defaulted = [&](FieldId path, std::string value, std::string why) {
    if (!draft.Has(path)) draft.Set(path, std::move(value), {}, "Megatron-LM's default: " + why);
  };

  // GPT-2's BPE vocabulary (50,257 tokens) is fixed by the tokenizer type.
  if (!draft.Has(fields::kModelVocab)) {
    for (const DraftSkip& s : draft.Skipped()) {
      if (s.text == "--tokenizer-type GPT2BPETokenizer") {
        draft.Set(fields::kModelVocab, "50257", s.range,
                  "--tokenizer-type GPT2BPETokenizer (50,257 tokens)");
      }
    }
  }
  draft.Set(fields::kFramework, "megatron_core", {},
            "a pretrain_gpt.py script runs on Megatron-Core");
  // Megatron's defaults where the script is silent.
  defaulted(fields::kPrecision, "fp32", "no --bf16 or --fp16 (fp32)");
  defaulted(fields::kModelNorm, "layernorm", "no --normalization (LayerNorm)");
  defaulted(fields::kModelActivation, "gelu", "no --swiglu (GeLU)");
  defaulted(fields::kModelPosition, "learned", "no --position-embedding-type (learned_absolute)");
  defaulted(fields::kModelTiedEmbeddings, "true", "no --untie-embeddings-and-output-weights");
  defaulted(fields::kOptimizerWeightDecay, "0.01", "--weight-decay 0.01");
  defaulted(fields::kOptimizerBeta2, "0.999", "--adam-beta2 0.999");
  defaulted(fields::kOptimizerMinLr, "0.0", "--min-lr 0.0");
  // Without --global-batch-size Megatron-LM runs one microbatch per data-parallel rank.
  if (!draft.Has(fields::kBatchGlobal)) {
    const DraftSetting* micro = draft.Find(fields::kBatchMicro);
    draft.Set(fields::kBatchGlobal, (micro ? micro->value : std::string("1")) + " * parallel.dp",
              {}, "Megatron-LM's default: --micro-batch-size · dp");
  }

  // Grouped-query attention: --num-query-groups counts only with --group-query-attention.
  if (const FlagValue* g = combined_of("--num-query-groups")) {
    if (combined_of("--group-query-attention")) {
      auto n = ParseInteger(g->text);
      if (!n)
        return bad_value(g->range, "`--num-query-groups` expects an integer, got '" + g->text + "'",
                         ""),
               std::nullopt;
      draft.Set(fields::kModelKvHeads, std::to_string(*n), g->range, g->source);
    } else {
      draft.Skip(g->source, g->range, "ignored by Megatron-LM without --group-query-attention");
    }
  }
  if (const FlagValue* m = combined_of("--multi-latent-attention")) {
    if (!draft.Has(fields::kModelKvLoraRank)) {
      draft.Skip(m->source, m->range, "multi-latent attention needs --kv-lora-rank for a plan");
    }
  }
  // Multi-latent attention: the query/key head is the no-position part plus the rotary part
  // (what a plan's head_dim holds for an MLA model); --kv-channels does not size it.
  if (draft.Has(fields::kModelKvLoraRank)) {
    auto nope = get(fields::kModelQkNopeHeadDim), rope = get(fields::kModelQkRopeHeadDim);
    if (nope && rope) {
      if (const DraftSetting* kv = draft.Find(fields::kModelHeadDim)) {
        draft.Skip(
            kv->source, kv->origin,
            "multi-latent attention sizes its heads by --qk-head-dim and --qk-pos-emb-head-dim");
      }
      const DraftSetting* n = draft.Find(fields::kModelQkNopeHeadDim);
      auto sum = CheckedAdd(*nope, *rope);
      if (!sum)
        return bad_value(n->origin, "--qk-head-dim + --qk-pos-emb-head-dim is past 64 bits", ""),
               std::nullopt;
      draft.Set(fields::kModelHeadDim, std::to_string(*sum), n->origin,
                "--qk-head-dim + --qk-pos-emb-head-dim");
    }
  }
  if (auto h = get(fields::kModelHidden); h && !draft.Has(fields::kModelFfnHidden)) {
    const bool swiglu = draft.Find(fields::kModelActivation)->value == "swiglu";
    auto four_h = CheckedMul(4, *h);
    if (!four_h)
      return bad_value(draft.Find(fields::kModelHidden)->origin, "`--hidden-size` is too large",
                       ""),
             std::nullopt;
    int64_t ffn = swiglu ? (*four_h / 3 * 2) / 64 * 64 : *four_h;
    draft.Set(fields::kModelFfnHidden, std::to_string(ffn), {},
              swiglu ? "Megatron-LM's default with --swiglu: int(4 · hidden · 2/3 / 64) · 64"
                     : "Megatron-LM's default: 4 · hidden");
  }
  if (draft.Has(fields::kModelExperts)) {
    defaulted(fields::kModelTopk, "2", "--moe-router-topk 2");
    if (!draft.Has(fields::kModelMoeFfnHidden)) {
      // (Without a hidden size there is no ffn either; the writer reports the missing hidden.)
      if (const DraftSetting* ffn = draft.Find(fields::kModelFfnHidden)) {
        draft.Set(fields::kModelMoeFfnHidden, ffn->value, {},
                  "Megatron-LM's default: --ffn-hidden-size");
      }
    }
  }
  // Shared experts are given by their total size: a count of experts of the routed size.
  if (const FlagValue* sh = combined_of("--moe-shared-expert-intermediate-size")) {
    auto size = ParseInteger(sh->text);
    auto each = get(fields::kModelMoeFfnHidden);
    if (!size || !each || *each <= 0 || *size % *each != 0) {
      return bad_value(
                 sh->range,
                 "`--moe-shared-expert-intermediate-size " + sh->text +
                     "` is not a whole number of experts of --moe-ffn-hidden-size " +
                     (each ? std::to_string(*each) : std::string("?")),
                 "a plan counts shared experts (model.shared_experts) of the routed experts' size"),
             std::nullopt;
    }
    draft.Set(fields::kModelSharedExperts, std::to_string(*size / *each), sh->range, sh->source);
  }
  // --moe-layer-freq: 1 (every layer), or a pattern `([0]*K+[1]*N)` / a list with K leading
  // dense layers, which is what a plan's model.dense_layers expresses.
  if (const FlagValue* f = combined_of("--moe-layer-freq")) {
    std::smatch m;
    const std::regex pattern(
        R"(^\(?\s*\[\s*0\s*\]\s*\*\s*(\d+)\s*\+\s*\[\s*1\s*\]\s*\*\s*(\d+)\s*\)?$)");
    if (auto k = ParseInteger(f->text); k && *k == 1) {
      draft.Set(fields::kModelDenseLayers, "0", f->range, f->source);
    } else if (std::regex_match(f->text, m, pattern)) {
      draft.Set(fields::kModelDenseLayers, m[1].str(), f->range, f->source);
    } else {
      std::string t;
      for (char c : f->text)
        if (c != ' ') t += c;
      size_t zeros = 0, i = t.rfind('[', 0) == 0 ? 1 : std::string::npos;
      bool leading_only = i != std::string::npos && t.back() == ']';
      bool seen_one = false;
      for (; leading_only && i + 1 < t.size(); ++i) {
        if (t[i] == ',') continue;
        if (t[i] == '0' && !seen_one)
          ++zeros;
        else if (t[i] == '1')
          seen_one = true;
        else
          leading_only = false;
      }
      if (leading_only) {
        draft.Set(fields::kModelDenseLayers, std::to_string(zeros), f->range, f->source);
      } else {
        draft.Skip(f->source, f->range,
                   "a plan has leading dense layers only (model.dense_layers)");
      }
    }
  }
  // --moe-layer-freq k: every k-th layer is an MoE layer.
  if (const FlagValue* f = combined_of("--moe-layer-freq")) {
    if (auto k = ParseInteger(f->text); k && *k > 1) {
      draft.Set(fields::kModelMoeLayerFreq, std::to_string(*k), f->range, f->source);
      draft.Set(fields::kModelDenseLayers, "0", f->range, f->source);
    }
  }
  // Selective recompute's modules: a list of names, one string in the plan.
  if (const FlagValue* m = combined_of("--recompute-modules")) {
    std::string names;
    for (char c : m->text) names += c == ' ' ? std::string(", ") : std::string(1, c);
    draft.Set(fields::kActivationsRecomputeModules, QuoteString(names), m->range, m->source);
  }
  // Layers per recompute group (uniform) or recomputed per chunk (block); a whole chunk is the
  // plan's 0 ("all").
  if (const FlagValue* n = combined_of("--recompute-num-layers")) {
    auto v = ParseInteger(n->text);
    if (!v || *v < 0) {
      return bad_value(n->range,
                       "`--recompute-num-layers` expects a layer count, got '" + n->text + "'", ""),
             std::nullopt;
    }
    int64_t chunk = 0;
    if (auto layers = get(fields::kModelLayers)) {
      const int64_t pp = get(fields::kParallelPp).value_or(1);
      const int64_t vpp = get(fields::kParallelVpp).value_or(1);
      if (pp * vpp > 0 && *layers % (pp * vpp) == 0 &&
          !draft.Has(fields::kPipelineFirstStageLayers) &&
          !draft.Has(fields::kPipelineLastStageLayers)) {
        chunk = *layers / (pp * vpp);
      }
    }
    draft.Set(fields::kActivationsRecomputeLayers, *v == chunk ? "0" : std::to_string(*v), n->range,
              *v == chunk ? n->source + " (every layer of a chunk)" : n->source);
  }
  // Layers per virtual stage -> virtual stages per pipeline rank, and the interleaved schedule.
  if (const FlagValue* vs = combined_of("--num-layers-per-virtual-pipeline-stage")) {
    auto per = ParseInteger(vs->text);
    auto layers = get(fields::kModelLayers);
    int64_t pp = get(fields::kParallelPp).value_or(1);
    const int64_t accounted = (draft.Has(fields::kPipelineAccountForEmbedding) ? 1 : 0) +
                              (draft.Has(fields::kPipelineAccountForLoss) ? 1 : 0);
    const int64_t counted = CheckedAdd(layers.value_or(0), accounted).value_or(0);
    auto group = per ? CheckedMul(pp, *per) : std::nullopt;
    if (!per || *per <= 0 || !layers || !group || *group <= 0 || counted % *group != 0) {
      return bad_value(vs->range,
                       "`--num-layers-per-virtual-pipeline-stage " + vs->text +
                           "` does not divide " + std::to_string(counted) + " layers over " +
                           std::to_string(pp) + " pipeline stages",
                       "Megatron-LM needs layers / (pipeline size · layers per virtual stage) to "
                       "be whole"),
             std::nullopt;
    }
    draft.Set(fields::kParallelVpp, std::to_string(counted / *group), vs->range, vs->source);
  }
  if (auto vpp = get(fields::kParallelVpp); vpp && *vpp > 1) {
    const DraftSetting* v = draft.Find(fields::kParallelVpp);
    draft.Set(fields::kPipelineSchedule, "interleaved_1f1b", v->origin, v->source);
  }
  return draft;
}

}  // namespace paraplan::interop
