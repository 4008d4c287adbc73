// BuildPartition: picks the split method from the plan, builds the chunks, and reports what
// only the partition can know (P0601-P0603).
#include <fmt/format.h>

#include "compiler/analyze/format_util.h"
#include "compiler/analyze/partition.h"

namespace paraplan {
namespace {

std::string ListText(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

void ReportSplitInvalid(const Plan& plan, DiagnosticSink* sink, FieldId field, std::string message,
                        std::vector<std::string> helps) {
  if (sink == nullptr) return;
  Diag d(DiagKind::kPipelineSplitInvalid, std::move(message));
  d.At(plan.Range(field));
  d.Note("every transformer layer must sit on exactly one (pipeline rank, chunk), in order");
  for (std::string& h : helps) d.Help(std::move(h));
  sink->Report(std::move(d));
}

// Layers per pipeline rank of a virtual-stage list.
std::vector<int64_t> PerRank(const std::vector<int64_t>& counts, int64_t pp) {
  std::vector<int64_t> out(static_cast<size_t>(pp), 0);
  for (size_t s = 0; s < counts.size(); ++s) out[s % static_cast<size_t>(pp)] += counts[s];
  return out;
}

void ReportNanotronEmptyStage(const Plan& plan, const NanotronSplit& split, int64_t stage,
                              const BlockCosts& paraplan_costs, DiagnosticSink* sink) {
  if (sink == nullptr) return;
  const ModelSpec& m = plan.model;
  const int64_t pp = plan.parallel.pp;
  BlockCosts nc = NanotronBlockCosts(m);
  const int64_t layer = nc.layers.empty() ? 0 : nc.layers.front();
  int64_t layers_total = 0;
  for (int64_t c : nc.layers) layers_total += c;
  const int64_t total = layers_total + nc.head;
  Diag d(DiagKind::kNanotronBalanceEmptyStage,
         fmt::format("Nanotron's cost balancing leaves pipeline stage {} without a trainable layer",
                     stage));
  d.At(plan.Range(fields::kPipelineBalance), "Nanotron's greedy split by block cost");
  if (plan.Range(fields::kModelVocab).IsValid()) {
    d.Label(plan.Range(fields::kModelVocab),
            fmt::format("the LM head costs vocab · hidden = {}, more than all {} layers together",
                        GroupDigits(nc.head), m.layers));
  }
  if (plan.Range(fields::kParallelPp).IsValid())
    d.Label(plan.Range(fields::kParallelPp), fmt::format("{} stages", pp));
  d.Value("decoder layer (4·heads·head_dim·hidden + 3·ffn_hidden·hidden)",
          fmt::format("4·{}·{}·{} + 3·{}·{} = {}", m.heads, m.heads > 0 ? m.hidden / m.heads : 0,
                      m.hidden, m.ffn_hidden, m.hidden, GroupDigits(layer)));
  d.Value(fmt::format("{} decoder layers", m.layers), GroupDigits(layers_total));
  d.Value("LM head (vocab·hidden)",
          fmt::format("{}·{} = {}", m.vocab, m.hidden, GroupDigits(nc.head)));
  d.Value("embedding, final norm, loss", "0");
  d.Value(
      fmt::format("stage {} threshold (total · {}/{})", split.head_rank, split.head_rank + 1, pp),
      fmt::format("{} · {}/{} = {}", GroupDigits(total), split.head_rank + 1, pp,
                  GroupDigits(total * (split.head_rank + 1) / pp)));
  std::string placement;
  for (int64_t r = 0; r < pp; ++r) {
    if (r > 0) placement += "; ";
    const int64_t n = split.layers[static_cast<size_t>(r)];
    if (!split.has_parameters[static_cast<size_t>(r)]) {
      placement += fmt::format("stage {}: {} (no parameters)", r,
                               r > split.head_rank ? "the loss only" : "nothing");
    } else {
      placement +=
          fmt::format("stage {}: {}{} layer{}{}", r, r == 0 ? "embedding, " : "", n,
                      n == 1 ? "" : "s", r == split.head_rank ? ", final norm, LM head" : "");
    }
  }
  d.Value("Nanotron's split", placement);
  d.Note(
      fmt::format("Nanotron places blocks in order and moves to the next stage only after the "
                  "cumulative cost exceeds "
                  "(k+1)/pp of the total; a stage without parameters stops the run with \"Can't "
                  "use DDP because model "
                  "in PP={} has no gradient\"",
                  stage));
  auto balanced = BalanceByCost(paraplan_costs, pp * plan.parallel.vpp);
  if (balanced) {
    d.Help(fmt::format(
        "use `balance = cost`: paraplan's cost split keeps a transformer layer on every stage: {}",
        ListText(PerRank(*balanced, pp))));
    d.Help(fmt::format("or pin the split for Nanotron as well: `stage_layers = {}`",
                       ListText(PerRank(*balanced, pp))));
  }
  if (pp > 1)
    d.Help(fmt::format("or use fewer pipeline stages: `pp = {}`", pp / 2 > 1 ? pp / 2 : 1));
  sink->Report(std::move(d));
}

// balance = nanotron: Nanotron's greedy split by block cost, refused where Nanotron would leave
// a stage without a trainable layer.
std::optional<std::vector<int64_t>> NanotronCounts(const Plan& plan, const Partition& part,
                                                   DiagnosticSink* sink) {
  const PipelineSpec& pl = plan.pipeline;
  const int64_t pp = plan.parallel.pp;
  const bool overrides = !pl.stage_layers.empty() || pl.first_stage_layers || pl.last_stage_layers;
  if (plan.parallel.vpp > 1 || overrides || pl.account_for_embedding || pl.account_for_loss) {
    ReportSplitInvalid(
        plan, sink, fields::kPipelineBalance,
        "`balance = nanotron` reproduces Nanotron's split, which has no virtual pipeline, "
        "explicit stage sizes or embedding/loss accounting",
        {"remove vpp, stage_layers, first/last_stage_layers and account_for_* from the plan, "
         "or use `balance = cost`"});
    return std::nullopt;
  }
  NanotronSplit split = NanotronGreedySplit(plan.model, pp);
  for (int64_t r = 0; r < pp; ++r) {
    if (!split.has_parameters[static_cast<size_t>(r)] ||
        split.layers[static_cast<size_t>(r)] == 0) {
      // A stage holding only the final norm and head trains, but holds no transformer layer;
      // Nanotron runs it, paraplan reports what Nanotron would fail on and also the idle case.
      if (!split.has_parameters[static_cast<size_t>(r)] || r != pp - 1) {
        ReportNanotronEmptyStage(plan, split, r, part.costs, sink);
        return std::nullopt;
      }
    }
  }
  return split.layers;
}

// balance = cost: paraplan's own split by block cost.
std::optional<std::vector<int64_t>> CostCounts(const Plan& plan, const Partition& part,
                                               DiagnosticSink* sink) {
  const PipelineSpec& pl = plan.pipeline;
  const int64_t layers = plan.model.layers, pp = plan.parallel.pp, vpp = plan.parallel.vpp;
  const int64_t stages = pp * vpp;
  const bool overrides = !pl.stage_layers.empty() || pl.first_stage_layers || pl.last_stage_layers;
  if (overrides || pl.account_for_embedding || pl.account_for_loss) {
    ReportSplitInvalid(
        plan, sink, fields::kPipelineBalance,
        "`balance = cost` chooses the split itself; it cannot be combined with stage_layers, "
        "first/last_stage_layers or account_for_embedding/account_for_loss",
        {"remove the explicit split options, or use `balance = even` to keep them"});
    return std::nullopt;
  }
  auto balanced = BalanceByCost(part.costs, stages);
  if (!balanced) {
    ReportSplitInvalid(
        plan, sink, fields::kPipelineBalance,
        fmt::format("`balance = cost` needs at least one layer per virtual stage: {} layers < "
                    "pp · vpp = {} · {} = {}",
                    layers, pp, vpp, stages),
        {fmt::format("use at most {} pipeline stages", layers / vpp > 0 ? layers / vpp : 1)});
    return std::nullopt;
  }
  return balanced;
}

// How balance = even splits: the plan's explicit sizes, first/last sizes, embedding/loss
// accounting, or evenly.
PartitionMethod MegatronMethod(const PipelineSpec& pl) {
  return !pl.stage_layers.empty()                            ? PartitionMethod::kExplicit
         : (pl.first_stage_layers || pl.last_stage_layers)   ? PartitionMethod::kFirstLast
         : (pl.account_for_embedding || pl.account_for_loss) ? PartitionMethod::kAccount
                                                             : PartitionMethod::kEven;
}

// balance = even: Megatron-LM's split, with the plan's explicit sizes or accounting if any.
std::optional<std::vector<int64_t>> MegatronCounts(const Plan& plan, const Partition& part,
                                                   DiagnosticSink* sink) {
  std::string why;
  auto megatron = MegatronStageLayers(plan, &why);
  if (!megatron) {
    FieldId path = part.method == PartitionMethod::kExplicit ? FieldId(fields::kPipelineStageLayers)
                   : part.method == PartitionMethod::kFirstLast
                       ? FieldId(fields::kPipelineFirstStageLayers)
                       : FieldId(fields::kModelLayers);
    ReportSplitInvalid(plan, sink, path, why, {"or let paraplan choose: `balance = cost`"});
    return std::nullopt;
  }
  return megatron;
}

// The chunks from the per-virtual-stage layer counts (execution order: chunk-major).
void PlaceChunks(const std::vector<int64_t>& counts, Partition& part) {
  const int64_t pp = part.pp, vpp = part.vpp, stages = pp * vpp;
  part.stages.resize(static_cast<size_t>(pp));
  for (int64_t p = 0; p < pp; ++p) {
    part.stages[static_cast<size_t>(p)].pp_rank = p;
    part.stages[static_cast<size_t>(p)].chunks.resize(static_cast<size_t>(vpp));
  }
  int64_t next = 0;
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t p = s % pp, c = s / pp;
    PipelineChunk& chunk = part.stages[static_cast<size_t>(p)].chunks[static_cast<size_t>(c)];
    chunk.pp_rank = p;
    chunk.chunk = c;
    chunk.virtual_stage = s;
    chunk.first_layer = next;
    next += counts[static_cast<size_t>(s)];
    chunk.end_layer = next;
    chunk.embedding = s == 0;
    chunk.loss = s == stages - 1;
    for (int64_t i = chunk.first_layer; i < chunk.end_layer; ++i)
      chunk.cost += part.costs.layers[static_cast<size_t>(i)];
    if (chunk.embedding) chunk.cost += part.costs.embedding;
    if (chunk.loss) chunk.cost += part.costs.head;
  }
  for (PipelineStage& stage : part.stages) {
    stage.embedding = stage.chunks.front().embedding;
    stage.loss = stage.chunks.back().loss;
  }
}

// A chunk with no layer, no embedding and no loss (P0601); true when the partition has one.
bool ReportEmptyChunk(const Plan& plan, const Partition& part, DiagnosticSink* sink) {
  const PipelineSpec& pl = plan.pipeline;
  for (const PipelineChunk* c : part.VirtualStages()) {
    if (c->layer_count() > 0 || c->embedding || c->loss) continue;
    if (sink != nullptr) {
      std::string where = part.vpp > 1
                              ? fmt::format("chunk {} of pipeline stage {}", c->chunk, c->pp_rank)
                              : fmt::format("pipeline stage {}", c->pp_rank);
      Diag d(DiagKind::kPipelineStageEmpty,
             fmt::format("{} holds no transformer layer, no embedding and no loss", where));
      d.At(plan.Range(fields::kPipelineStageLayers), fmt::format("{} gets 0 layers here", where));
      d.Value("stage_layers", ListText(pl.stage_layers));
      d.Note(
          "every pipeline stage runs every microbatch; a stage with nothing to compute only "
          "forwards "
          "activations, idles a GPU per replica and holds no gradient to synchronise");
      std::vector<int64_t> even =
          EvenLayerCounts(part.layers, static_cast<int64_t>(pl.stage_layers.size()));
      d.Help(fmt::format("spread the {} layers: `stage_layers = {}`", part.layers, ListText(even)));
      d.Help("or let paraplan balance them by cost: `balance = cost` without `stage_layers`");
      sink->Report(std::move(d));
    }
    return true;
  }
  return false;
}

}  // namespace

std::optional<Partition> BuildPartition(const Plan& plan, DiagnosticSink* sink) {
  const int64_t layers = plan.model.layers, pp = plan.parallel.pp, vpp = plan.parallel.vpp;
  if (layers < 1 || pp < 1 || vpp < 1 || pp > (int64_t{1} << 20) || vpp > (int64_t{1} << 20)) {
    ReportSplitInvalid(
        plan, sink, fields::kParallelPp,
        fmt::format("cannot split {} layers over pp = {} and vpp = {}", layers, pp, vpp), {});
    return std::nullopt;
  }
  Partition part;
  part.layers = layers;
  part.pp = pp;
  part.vpp = vpp;
  part.costs = ComputeBlockCosts(plan.model);

  std::optional<std::vector<int64_t>> counts;
  if (plan.pipeline.balance == Balance::kNanotron) {
    part.method = PartitionMethod::kNanotron;
    counts = NanotronCounts(plan, part, sink);
  } else if (plan.pipeline.balance == Balance::kCost) {
    part.method = PartitionMethod::kCost;
    counts = CostCounts(plan, part, sink);
  } else {
    part.method = MegatronMethod(plan.pipeline);
    counts = MegatronCounts(plan, part, sink);
  }
  if (!counts) return std::nullopt;
  PlaceChunks(*counts, part);
  if (ReportEmptyChunk(plan, part, sink)) return std::nullopt;
  return part;
}

}  // namespace paraplan
