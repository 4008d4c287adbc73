// Megatron-LM / Megatron-Core launch scripts and argument files for pretrain_gpt.py: the flags
// through MegatronRows(), the cluster from the launcher (torchrun, srun, #SBATCH), and the
// settings that need more than one flag (virtual stages from layers per virtual stage, dense
// layers from --moe-layer-freq, shared experts from their size, Megatron's defaults).
#include <cmath>
#include <map>
#include <set>
#include <span>

#include "compiler/base/checked.h"
#include "compiler/interop/draft.h"
#include "compiler/interop/pipeline_layout.h"
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
constexpr const char* kNonLayoutPrefixes[] = {"--log",
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

bool IsNonLayoutFlag(std::string_view flag) {
  for (const char* p : kNonLayoutPrefixes) {
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
         flag == "--recompute-modules" || flag == "--recompute-num-layers" ||
         flag == "--moe-router-enable-expert-bias" || flag == "--moe-router-bias-update-rate" ||
         flag == "--moe-router-load-balancing-type" || flag == "--pipeline-model-parallel-layout";
}

std::string FlagSource(std::string_view flag, std::string_view value) {
  return value.empty() ? std::string(flag) : std::string(flag) + " " + std::string(value);
}

// A word a flag can take as its value: not a flag, not a parenthesis, not a list's expansion.
bool LooksLikeValue(const ShellWord& w) {
  return !w.list_expansion && !w.text.empty() && w.text[0] != '-' && w.text != "(" && w.text != ")";
}

// Whether words[i + 1] is the value of the flag words[i]: a later word that is not a long flag.
bool NextIsValue(std::span<const ShellWord> words, size_t i) {
  if (i + 1 >= words.size()) return false;
  const ShellWord& next = words[i + 1];
  return !next.list_expansion && next.text != ")" && next.text.rfind("--", 0) != 0 &&
         next.range.begin > words[i].range.end;
}

// A flag of the script with its value as read.
struct ScriptFlag {
  std::string flag;           // "--tensor-model-parallel-size"
  std::string value;          // "" for a switch
  SourceRange range;          // the flag and its value
  std::string unresolved;     // what the value comes from that planc cannot read (ShellWord)
  std::string why;            // why, when not a variable the script does not set
  bool inline_value = false;  // written `--flag=value`
};

// What planc knows of a flag: its table row, its skipped row, its part in the launcher.
struct FlagKnowledge {
  const SettingRow* row = nullptr;
  const SkippedRow* skipped = nullptr;
  Launcher launcher = Launcher::kOther;
  bool launcher_setting = false;  // rendezvous, time limits: no layout

  // In neither the table nor the launcher's lists: its value may be a list of words.
  bool FreeForm() const {
    return row == nullptr && launcher == Launcher::kOther && !launcher_setting;
  }
};

FlagKnowledge KnowFlag(std::string_view flag) {
  return {FindRow(MegatronRows(), flag), FindSkipped(MegatronSkippedRows(), flag),
          LauncherFlag(flag), IsLauncherSetting(flag)};
}

// Whether the flag at words[i] takes a value; an unknown flag takes the next word when that is
// not a flag.
bool TakesValue(std::string_view flag, const FlagKnowledge& known, std::span<const ShellWord> words,
                size_t i) {
  if (known.row) return known.row->convert != Convert::kSwitch;
  if (IsCombined(flag)) {
    return flag != "--group-query-attention" && flag != "--multi-latent-attention" &&
           flag != "--moe-router-enable-expert-bias";
  }
  if (known.skipped) return known.skipped->takes_value;
  if (TakesNoValue(flag)) return false;
  if (known.launcher == Launcher::kOther && !known.launcher_setting) {
    return i + 1 < words.size() && LooksLikeValue(words[i + 1]);
  }
  return true;
}

// Why a flag without a table row is listed as not imported.
std::string SkipReason(std::string_view flag, const FlagKnowledge& known) {
  if (known.skipped) return std::string(known.skipped->reason);
  return IsNonLayoutFlag(flag) ? "not a layout setting" : "not recognised by planc";
}

// Reads one launch script: its flags first (table rows, launcher flags, flags read together),
// then the settings that need several flags or Megatron-LM's defaults.
class MegatronReader {
 public:
  MegatronReader(const SourceManager& sm, uint32_t buffer, DiagnosticSink& sink, GivenCluster given)
      : sm_(sm), buffer_(buffer), sink_(sink), given_(given) {}

  std::optional<PlanDraft> Read() {
    ShellScript script = ScanShellScript(sm_, buffer_);
    if (script.unterminated.IsValid()) {
      sink_.Report(Diag(DiagKind::kConfigSyntax, "unterminated quote or `${` in a launch script")
                       .At(script.unterminated, "opened here and never closed")
                       .Help("close it; planc reads the script as the shell would"));
      return std::nullopt;
    }
    draft_.kind = ConfigKind::kMegatron;
    draft_.vocab_help =
        "add `--vocab-size N` (pretrain_gpt.py takes the vocabulary from the tokenizer "
        "otherwise), or pass the shape of a stdlib model";
    const std::vector<ShellWord>& words = script.words;
    for (size_t i = 0; i < words.size(); ++i) i = ReadFlag(words, i);
    ApplyTable();
    if (!ok_) return std::nullopt;
    SetVocabFromTokenizer();
    SetMegatronDefaults();
    if (!ReadAttention() || !SetFfnDefault() || !ReadExperts() || !ReadPipelineLayout() ||
        !ReadRecompute() || !ReadVirtualStages()) {
      return std::nullopt;
    }
    return std::move(draft_);
  }

 private:
  // Reads the flag at words[i] with its value; returns the index of the last word it used.
  size_t ReadFlag(std::span<const ShellWord> words, size_t i) {
    const ShellWord& w = words[i];
    if (w.list_expansion || w.text.size() < 2 || w.text[0] != '-') return i;
    ScriptFlag f{w.text, "", w.range, w.unresolved, w.why};
    if (auto eq = f.flag.find('='); eq != std::string::npos && f.flag.rfind("--", 0) == 0) {
      f.value = f.flag.substr(eq + 1);
      f.flag = f.flag.substr(0, eq);
      f.inline_value = true;
    }
    if (f.flag.rfind("--", 0) != 0 && f.flag != "-N") return i;  // set -ex, python -u, ...
    const FlagKnowledge known = KnowFlag(f.flag);
    if (!f.inline_value && TakesValue(f.flag, known, words, i)) {
      // A value must be on the same logical line or follow in an array/list.
      if (!NextIsValue(words, i)) {
        ReportMissingValue(f.flag, w.range, known);
        return i;
      }
      i = ReadValueWords(words, i, known, f);
    }
    if (Overridden(known.launcher)) return i;  // --nodes / --gpus-per-node say it instead
    if (!f.unresolved.empty() &&
        (known.row || known.launcher != Launcher::kOther || IsCombined(f.flag))) {
      ReportUnresolved(f, known.launcher);
      return i;
    }
    FileFlag(f, known);
    return i;
  }

  bool Overridden(Launcher launcher) const {
    return (launcher == Launcher::kNodes && given_.nodes) ||
           (launcher == Launcher::kGpusPerNode && given_.gpus_per_node);
  }

  void ReportMissingValue(const std::string& flag, SourceRange at, const FlagKnowledge& known) {
    if (known.row || known.launcher != Launcher::kOther) {
      BadValue(at, "`" + flag + "` needs a value", "write it after the flag: `" + flag + " N`");
    } else if (!known.launcher_setting) {
      // Its value is a list held in a variable, or missing: still listed, never dropped.
      draft_.Skip(flag, at, SkipReason(flag, known));
    }
  }

  // Reads the value after the flag at words[i] into `f`; returns the index of its last word.
  size_t ReadValueWords(std::span<const ShellWord> words, size_t i, const FlagKnowledge& known,
                        ScriptFlag& f) const {
    const SourceRange flag_range = words[i].range;
    const ShellWord& v = words[++i];
    f.value = v.text;
    f.unresolved = v.unresolved;
    f.why = v.why;
    f.range = {buffer_, flag_range.begin, v.range.end};
    // Flags that take a list (--recompute-modules core_attn mlp, --data-path 0.5 a 0.5 b): the
    // words up to the next flag on the same command.
    if (known.FreeForm()) {
      while (i + 1 < words.size() && LooksLikeValue(words[i + 1]) &&
             !words[i + 1].text.ends_with(".py") &&
             Continued(sm_, buffer_, words[i], words[i + 1])) {
        f.value += " " + words[++i].text;
        f.range.end = words[i].range.end;
      }
    }
    return i;
  }

  void ReportUnresolved(const ScriptFlag& f, Launcher launcher) {
    std::string help = launcher == Launcher::kNodes         ? "pass --nodes N to planc"
                       : launcher == Launcher::kGpusPerNode ? "pass --gpus-per-node N to planc"
                       : f.why.empty() ? "set `" + f.unresolved + "` in the script"
                                       : "write the value in the script, or set the variable";
    BadValue(f.range,
             "the value of `" + f.flag + "` comes from `" + f.unresolved + "`, " +
                 (f.why.empty() ? "which the script does not set" : f.why),
             help);
  }

  // Files a flag with its value: the cluster from the launcher, a table row, a flag read with
  // others later, or the list of settings not imported.
  void FileFlag(const ScriptFlag& f, const FlagKnowledge& known) {
    FlagValue fv{f.value, f.range, FlagSource(f.flag, f.value)};
    if (known.launcher == Launcher::kNodes) {
      ReadNodes(f, fv);
      return;
    }
    if (known.launcher == Launcher::kGpusPerNode) {
      ReadGpusPerNode(f, fv);
      return;
    }
    if (known.launcher_setting) return;  // where to rendezvous, how long to run: no layout
    if (known.skipped) {
      draft_.Skip(fv.source, f.range, std::string(known.skipped->reason));
    } else if (IsCombined(f.flag)) {
      combined_[f.flag] = fv;
    } else if (!known.row) {
      draft_.Skip(fv.source, f.range, SkipReason(f.flag, known));
    } else {
      flags_[f.flag] = fv;
    }
  }

  void ReadNodes(const ScriptFlag& f, const FlagValue& fv) {
    auto n = ParseInteger(f.value);
    if (!n) {
      BadValue(f.range, "`" + f.flag + "` expects a node count, got '" + f.value + "'",
               "pass --nodes N to planc");
      return;
    }
    draft_.Set(fields::kClusterNodes, std::to_string(*n), f.range, fv.source);
  }

  // --nproc-per-node 8, or Slurm's --gres gpu:8 / gpu:h100:8 (which also names the GPU).
  void ReadGpusPerNode(const ScriptFlag& f, const FlagValue& fv) {
    std::string v = f.value;
    if (f.flag == "--gres") {
      auto colon = v.rfind(':');
      if (v.rfind("gpu", 0) != 0 || colon == std::string::npos) {
        draft_.Skip(fv.source, f.range, "not a GPU count");
        return;
      }
      std::string kind = v.substr(0, colon);
      if (auto k = kind.find(':'); k != std::string::npos) {
        draft_.gpu = kind.substr(k + 1);
        draft_.gpu_origin = f.range;
        draft_.gpu_source = fv.source;
      }
      v = v.substr(colon + 1);
    }
    auto n = ParseInteger(v);
    if (!n) {
      BadValue(f.range, "`" + f.flag + "` expects a GPU count, got '" + f.value + "'",
               "pass --gpus-per-node N to planc");
      return;
    }
    draft_.Set(fields::kClusterGpusPerNode, std::to_string(*n), f.range, fv.source);
  }

  // The flags with a table row, converted to plan values.
  void ApplyTable() {
    for (const auto& [flag, fv] : flags_) {
      const SettingRow* row = FindRow(MegatronRows(), flag);
      std::string error;
      auto v = ConvertSetting(*row, fv.text, &error);
      if (!v) {
        if (!error.empty()) BadValue(fv.range, "`" + flag + "` " + error, "");
        continue;
      }
      // --bf16 with --fp8-format: fp8 wins (the fp8 layers run on a bf16 model).
      if (row->path == fields::kPrecision && flags_.count("--fp8-format") &&
          flag != "--fp8-format") {
        continue;
      }
      draft_.Set(row->path, *v, fv.range, fv.source);
    }
  }

  // GPT-2's BPE vocabulary (50,257 tokens) is fixed by the tokenizer type.
  void SetVocabFromTokenizer() {
    if (draft_.Has(fields::kModelVocab)) return;
    for (const DraftSkip& s : draft_.Skipped()) {
      if (s.text == "--tokenizer-type GPT2BPETokenizer") {
        draft_.Set(fields::kModelVocab, "50257", s.range,
                   "--tokenizer-type GPT2BPETokenizer (50,257 tokens)");
      }
    }
  }

  // The framework, and Megatron-LM's defaults where the script is silent.
  void SetMegatronDefaults() {
    draft_.Set(fields::kFramework, "megatron_core", {},
               "a pretrain_gpt.py script runs on Megatron-Core");
    Default(fields::kPrecision, "fp32", "no --bf16 or --fp16 (fp32)");
    Default(fields::kModelNorm, "layernorm", "no --normalization (LayerNorm)");
    Default(fields::kModelActivation, "gelu", "no --swiglu (GeLU)");
    Default(fields::kModelPosition, "learned", "no --position-embedding-type (learned_absolute)");
    Default(fields::kModelTiedEmbeddings, "true", "no --untie-embeddings-and-output-weights");
    Default(fields::kOptimizerWeightDecay, "0.01", "--weight-decay 0.01");
    Default(fields::kOptimizerBeta2, "0.999", "--adam-beta2 0.999");
    Default(fields::kOptimizerMinLr, "0.0", "--min-lr 0.0");
    // Without --global-batch-size Megatron-LM runs one microbatch per data-parallel rank.
    if (!draft_.Has(fields::kBatchGlobal)) {
      const DraftSetting* micro = draft_.Find(fields::kBatchMicro);
      draft_.Set(fields::kBatchGlobal, (micro ? micro->value : std::string("1")) + " * parallel.dp",
                 {}, "Megatron-LM's default: --micro-batch-size · dp");
    }
  }

  // Grouped-query and multi-latent attention.
  bool ReadAttention() {
    // --num-query-groups counts only with --group-query-attention.
    if (const FlagValue* g = Combined("--num-query-groups")) {
      if (Combined("--group-query-attention")) {
        auto n = ParseInteger(g->text);
        if (!n) {
          BadValue(g->range, "`--num-query-groups` expects an integer, got '" + g->text + "'", "");
          return false;
        }
        draft_.Set(fields::kModelKvHeads, std::to_string(*n), g->range, g->source);
      } else {
        draft_.Skip(g->source, g->range, "ignored by Megatron-LM without --group-query-attention");
      }
    }
    if (const FlagValue* m = Combined("--multi-latent-attention")) {
      if (!draft_.Has(fields::kModelKvLoraRank)) {
        draft_.Skip(m->source, m->range, "multi-latent attention needs --kv-lora-rank for a plan");
      }
    }
    return SetLatentHeadDim();
  }

  // Multi-latent attention: the query/key head is the no-position part plus the rotary part
  // (what a plan's head_dim holds for an MLA model); --kv-channels does not size it.
  bool SetLatentHeadDim() {
    if (!draft_.Has(fields::kModelKvLoraRank)) return true;
    auto nope = Integer(fields::kModelQkNopeHeadDim);
    auto rope = Integer(fields::kModelQkRopeHeadDim);
    if (!nope || !rope) return true;
    if (const DraftSetting* kv = draft_.Find(fields::kModelHeadDim)) {
      draft_.Skip(kv->source, kv->origin,
                  "multi-latent attention sizes its heads by --qk-head-dim and "
                  "--qk-pos-emb-head-dim");
    }
    const DraftSetting* n = draft_.Find(fields::kModelQkNopeHeadDim);
    auto sum = CheckedAdd(*nope, *rope);
    if (!sum) {
      BadValue(n->origin, "--qk-head-dim + --qk-pos-emb-head-dim is past 64 bits", "");
      return false;
    }
    draft_.Set(fields::kModelHeadDim, std::to_string(*sum), n->origin,
               "--qk-head-dim + --qk-pos-emb-head-dim");
    return true;
  }

  // The feed-forward size when the script does not state it.
  bool SetFfnDefault() {
    auto h = Integer(fields::kModelHidden);
    if (!h || draft_.Has(fields::kModelFfnHidden)) return true;
    const bool swiglu = draft_.Find(fields::kModelActivation)->value == "swiglu";
    auto four_h = CheckedMul(4, *h);
    if (!four_h) {
      BadValue(draft_.Find(fields::kModelHidden)->origin, "`--hidden-size` is too large", "");
      return false;
    }
    int64_t ffn = swiglu ? (*four_h / 3 * 2) / 64 * 64 : *four_h;
    draft_.Set(fields::kModelFfnHidden, std::to_string(ffn), {},
               swiglu ? "Megatron-LM's default with --swiglu: int(4 · hidden · 2/3 / 64) · 64"
                      : "Megatron-LM's default: 4 · hidden");
    return true;
  }

  // Mixture of experts: defaults, shared experts, and which layers are dense.
  bool ReadExperts() {
    if (draft_.Has(fields::kModelExperts)) {
      Default(fields::kModelTopk, "2", "--moe-router-topk 2");
      // (Without a hidden size there is no ffn either; the writer reports the missing hidden.)
      const DraftSetting* ffn = draft_.Find(fields::kModelFfnHidden);
      if (!draft_.Has(fields::kModelMoeFfnHidden) && ffn) {
        draft_.Set(fields::kModelMoeFfnHidden, ffn->value, {},
                   "Megatron-LM's default: --ffn-hidden-size");
      }
    }
    if (!ReadSharedExperts()) return false;
    ReadMoeLayerFreq();
    return ReadRouterBalancing();
  }

  // The router's balancing: the loss (Megatron-LM's default coefficient is 0; the type `none`
  // turns it off) and the aux-loss-free expert bias, whose rate counts only with the switch.
  bool ReadRouterBalancing() {
    if (!draft_.Has(fields::kModelExperts)) {
      for (const char* flag : {"--moe-router-load-balancing-type",
                               "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate"})
        if (const FlagValue* f = Combined(flag))
          draft_.Skip(f->source, f->range, "the model has no experts (--num-experts)");
      return true;
    }
    if (const FlagValue* t = Combined("--moe-router-load-balancing-type")) {
      if (t->text == "none")
        draft_.Set(fields::kModelRouterAuxCoeff, "0", t->range, t->source);
      else if (t->text != "aux_loss")
        draft_.Skip(t->source, t->range,
                    "no plan field: priced as the batch-wise loss of model.router_aux_coeff");
    }
    Default(fields::kModelRouterAuxCoeff, "0", "--moe-aux-loss-coeff 0");
    const FlagValue* bias = Combined("--moe-router-enable-expert-bias");
    if (!bias) return true;
    const FlagValue* rate = Combined("--moe-router-bias-update-rate");
    if (!rate) {
      draft_.Set(fields::kModelRouterBiasRate, "0.001", bias->range,
                 "--moe-router-enable-expert-bias (Megatron-LM's rate 1e-3)");
      return true;
    }
    const std::optional<double> r = ParseReal(rate->text);
    if (!r || !(*r >= 0)) {
      BadValue(rate->range, "`--moe-router-bias-update-rate " + rate->text + "` is not a rate",
               "a rate is a number >= 0");
      return false;
    }
    draft_.Set(fields::kModelRouterBiasRate, RealText(*r), rate->range, rate->source);
    return true;
  }

  // Shared experts are given by their total size: a count of experts of the routed size.
  bool ReadSharedExperts() {
    const FlagValue* sh = Combined("--moe-shared-expert-intermediate-size");
    if (!sh) return true;
    auto size = ParseInteger(sh->text);
    auto each = Integer(fields::kModelMoeFfnHidden);
    if (!size || !each || *each <= 0 || *size % *each != 0) {
      BadValue(sh->range,
               "`--moe-shared-expert-intermediate-size " + sh->text +
                   "` is not a whole number of experts of --moe-ffn-hidden-size " +
                   (each ? std::to_string(*each) : std::string("?")),
               "a plan counts shared experts (model.shared_experts) of the routed experts' size");
      return false;
    }
    draft_.Set(fields::kModelSharedExperts, std::to_string(*size / *each), sh->range, sh->source);
    return true;
  }

  // --moe-layer-freq: k > 1, every k-th layer an MoE layer (model.moe_layer_freq); or 1 (every
  // layer), a pattern `([0]*K+[1]*N)` or a list with K leading dense layers, which is what a
  // plan's model.dense_layers expresses.
  void ReadMoeLayerFreq() {
    const FlagValue* f = Combined("--moe-layer-freq");
    if (!f) return;
    auto k = ParseInteger(f->text);
    if (k && *k > 1) {
      draft_.Set(fields::kModelMoeLayerFreq, std::to_string(*k), f->range, f->source);
      draft_.Set(fields::kModelDenseLayers, "0", f->range, f->source);
    } else if (k && *k == 1) {
      draft_.Set(fields::kModelDenseLayers, "0", f->range, f->source);
    } else if (auto pattern = MoePatternDenseLayers(f->text)) {
      draft_.Set(fields::kModelDenseLayers, *pattern, f->range, f->source);
    } else if (auto zeros = MoeListDenseLayers(f->text)) {
      draft_.Set(fields::kModelDenseLayers, std::to_string(*zeros), f->range, f->source);
    } else {
      draft_.Skip(f->source, f->range, "a plan has leading dense layers only (model.dense_layers)");
    }
  }

  // Selective recompute's modules, and the layers of a recompute group.
  bool ReadRecompute() {
    // A list of names, one string in the plan.
    if (const FlagValue* m = Combined("--recompute-modules")) {
      std::string names;
      for (char c : m->text) names += c == ' ' ? std::string(", ") : std::string(1, c);
      draft_.Set(fields::kActivationsRecomputeModules, QuoteString(names), m->range, m->source);
    }
    // Layers per recompute group (uniform) or recomputed per chunk (block); a whole chunk is
    // the plan's 0 ("all").
    const FlagValue* n = Combined("--recompute-num-layers");
    if (!n) return true;
    auto v = ParseInteger(n->text);
    if (!v || *v < 0) {
      BadValue(n->range, "`--recompute-num-layers` expects a layer count, got '" + n->text + "'",
               "");
      return false;
    }
    int64_t chunk = 0;
    if (auto layers = Integer(fields::kModelLayers)) {
      const int64_t pp = Integer(fields::kParallelPp).value_or(1);
      const int64_t vpp = Integer(fields::kParallelVpp).value_or(1);
      if (pp * vpp > 0 && *layers % (pp * vpp) == 0 &&
          !draft_.Has(fields::kPipelineFirstStageLayers) &&
          !draft_.Has(fields::kPipelineLastStageLayers) &&
          !draft_.Has(fields::kPipelineStageLayers)) {
        chunk = *layers / (pp * vpp);
      }
    }
    draft_.Set(fields::kActivationsRecomputeLayers, *v == chunk ? "0" : std::to_string(*v),
               n->range, *v == chunk ? n->source + " (every layer of a chunk)" : n->source);
    return true;
  }

  // --pipeline-model-parallel-layout: the plan's per-chunk stage_layers, and vpp (Megatron-LM
  // derives it from the layout, and takes no layers-per-virtual-stage beside it).
  bool ReadPipelineLayout() {
    const FlagValue* l = Combined("--pipeline-model-parallel-layout");
    if (!l) return true;
    const FlagValue* vs = Combined("--num-layers-per-virtual-pipeline-stage");
    const DraftSetting* vpp = draft_.Find(fields::kParallelVpp);
    const bool per_rank =
        vpp && vpp->source.rfind("--num-virtual-stages-per-pipeline-rank", 0) == 0;
    if (vs || per_rank) {
      const std::string other =
          vs ? "--num-layers-per-virtual-pipeline-stage" : "--num-virtual-stages-per-pipeline-rank";
      sink_.Report(Diag(DiagKind::kConfigBadValue,
                        "`" + other + "` is given with `--pipeline-model-parallel-layout`")
                       .At(vs ? vs->range : vpp->origin)
                       .Label(l->range, "the layout sets the virtual stages")
                       .Note("Megatron-LM takes no more than one of them")
                       .Help("remove " + other));
      ok_ = false;
      return false;
    }
    if (!ApplyLayout(ParseLayoutString(l->text), "--pipeline-model-parallel-layout", l->range,
                     l->source, LayoutVpp::kDerived, draft_, sink_)) {
      ok_ = false;
      return false;
    }
    return true;
  }

  // Layers per virtual stage -> virtual stages per pipeline rank, and the interleaved schedule.
  bool ReadVirtualStages() {
    if (const FlagValue* vs = Combined("--num-layers-per-virtual-pipeline-stage")) {
      auto per = ParseInteger(vs->text);
      auto layers = Integer(fields::kModelLayers);
      int64_t pp = Integer(fields::kParallelPp).value_or(1);
      const int64_t accounted = (draft_.Has(fields::kPipelineAccountForEmbedding) ? 1 : 0) +
                                (draft_.Has(fields::kPipelineAccountForLoss) ? 1 : 0);
      const int64_t counted = CheckedAdd(layers.value_or(0), accounted).value_or(0);
      auto group = per ? CheckedMul(pp, *per) : std::nullopt;
      if (!per || *per <= 0 || !layers || !group || *group <= 0 || counted % *group != 0) {
        BadValue(vs->range,
                 "`--num-layers-per-virtual-pipeline-stage " + vs->text + "` does not divide " +
                     std::to_string(counted) + " layers over " + std::to_string(pp) +
                     " pipeline stages",
                 "Megatron-LM needs layers / (pipeline size · layers per virtual stage) to be "
                 "whole");
        return false;
      }
      draft_.Set(fields::kParallelVpp, std::to_string(counted / *group), vs->range, vs->source);
    }
    if (auto vpp = Integer(fields::kParallelVpp); vpp && *vpp > 1) {
      const DraftSetting* v = draft_.Find(fields::kParallelVpp);
      draft_.Set(fields::kPipelineSchedule, "interleaved_1f1b", v->origin, v->source);
    }
    return true;
  }

  void BadValue(SourceRange at, std::string message, std::string help) {
    Diag d(DiagKind::kConfigBadValue, std::move(message));
    d.At(at);
    if (!help.empty()) d.Help(std::move(help));
    sink_.Report(std::move(d));
    ok_ = false;
  }

  void Default(FieldId path, std::string value, const std::string& why) {
    if (!draft_.Has(path)) draft_.Set(path, std::move(value), {}, "Megatron-LM's default: " + why);
  }

  std::optional<int64_t> Integer(FieldId path) const {
    const DraftSetting* s = draft_.Find(path);
    return s ? ParseInteger(s->value) : std::nullopt;
  }

  const FlagValue* Combined(std::string_view flag) const {
    auto it = combined_.find(flag);
    return it == combined_.end() ? nullptr : &it->second;
  }

  const SourceManager& sm_;
  uint32_t buffer_;
  DiagnosticSink& sink_;
  PlanDraft draft_;
  std::map<std::string, FlagValue, std::less<>> flags_;     // table rows: the last occurrence
  std::map<std::string, FlagValue, std::less<>> combined_;  // read together with other flags
  bool ok_ = true;
  GivenCluster given_;
};

}  // namespace

std::optional<PlanDraft> ReadMegatron(const SourceManager& sm, uint32_t buffer,
                                      DiagnosticSink& sink, GivenCluster given) {
  return MegatronReader(sm, buffer, sink, given).Read();
}

}  // namespace paraplan::interop
