#include "compiler/analyze/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/analyze/format_util.h"
#include "compiler/base/checked.h"

namespace paraplan {
namespace {

// Costs are computed in double and clamped, so that absurd model sizes cannot overflow; real
// models stay far below 2^53 FLOPs per token and block, where doubles are exact.
int64_t ClampCost(double v) {
  if (!(v > 0)) return 0;
  return v >= 1e18 ? int64_t{1000000000000000000} : static_cast<int64_t>(std::llround(v));
}

std::string ListText(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

}  // namespace

// Layers per virtual stage as evenly as possible, the remainder on the middle stages first
// (the first and last stages also hold the embedding and the output layer).
std::vector<int64_t> EvenLayerCounts(int64_t layers, int64_t stages) {
  std::vector<int64_t> counts(static_cast<size_t>(stages), layers / stages);
  int64_t rest = layers % stages;
  for (int64_t i = 1; i < stages && rest > 0; ++i, --rest) counts[static_cast<size_t>(i)] += 1;
  if (rest > 0) counts[0] += rest;
  return counts;
}

std::string_view ToString(PartitionMethod method) {
  switch (method) {
    case PartitionMethod::kEven:
      return "even";
    case PartitionMethod::kAccount:
      return "account";
    case PartitionMethod::kFirstLast:
      return "first_last";
    case PartitionMethod::kExplicit:
      return "explicit";
    case PartitionMethod::kCost:
      return "cost";
    case PartitionMethod::kNanotron:
      return "nanotron";
  }
  return "even";
}

BlockCosts ComputeBlockCosts(const ModelSpec& m) {
  BlockCosts c;
  const double h = static_cast<double>(m.hidden);
  const double heads = static_cast<double>(m.heads);
  const double kv = static_cast<double>(m.kv_heads > 0 ? m.kv_heads : m.heads);
  const double hd =
      static_cast<double>(m.head_dim > 0 ? m.head_dim : (m.heads > 0 ? m.hidden / m.heads : 0));
  const double seq = static_cast<double>(m.seq_len);
  double attention = 0;
  if (m.IsMla()) {
    const double qk = static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim);
    const double v = static_cast<double>(m.v_head_dim);
    const double q = m.q_lora_rank > 0 ? 2 * h * m.q_lora_rank + 2.0 * m.q_lora_rank * heads * qk
                                       : 2 * h * heads * qk;
    const double kv_proj = 2 * h * (m.kv_lora_rank + m.qk_rope_head_dim) +
                           2.0 * m.kv_lora_rank * heads * (m.qk_nope_head_dim + v);
    attention = q + kv_proj + 2 * heads * v * h + seq * heads * (qk + v);
  } else {
    const double q_dim = heads * hd;
    const double kv_dim = kv * hd;
    attention = 2 * h * (q_dim + 2 * kv_dim) + 2 * q_dim * h + 2 * seq * q_dim;
  }
  const double mats = m.activation == Activation::kSwiGlu ? 3 : 2;
  const double dense_mlp = 2 * mats * static_cast<double>(m.ffn_hidden) * h;
  const double moe_ffn = static_cast<double>(m.ExpertFfn());
  const double moe_mlp =
      2 * h * m.experts + static_cast<double>(m.topk + m.shared_experts) * 2 * mats * moe_ffn * h;
  c.layers.reserve(static_cast<size_t>(std::max<int64_t>(m.layers, 0)));
  for (int64_t i = 0; i < m.layers; ++i) {
    bool moe = m.IsMoe() && i >= m.dense_layers;
    c.layers.push_back(ClampCost(attention + (moe ? moe_mlp : dense_mlp)));
  }
  c.embedding = 0;  // a lookup: no multiply-adds
  // The output layer, and after it each multi-token-prediction module (DeepSeek-V3): a layer of
  // the last layer's kind, its 2h -> h projection and the output layer once more.
  const double logits = 2 * h * static_cast<double>(m.vocab);
  const double last = c.layers.empty() ? 0 : c.layers.back();
  const double mtp = static_cast<double>(std::max<int64_t>(m.mtp_layers, 0));
  c.head = ClampCost(logits + mtp * (last + 2 * 2 * h * h + logits));
  return c;
}

BlockCosts NanotronBlockCosts(const ModelSpec& m) {
  BlockCosts c;
  const double h = static_cast<double>(m.hidden);
  // Nanotron's head size is hidden // heads, an integer division, as here.
  const int64_t head_size = m.heads > 0 ? m.hidden / m.heads : 0;
  const double d_qkv = static_cast<double>(head_size);
  const double layer =
      4 * static_cast<double>(m.heads) * d_qkv * h + 3 * static_cast<double>(m.ffn_hidden) * h;
  c.layers.assign(static_cast<size_t>(std::max<int64_t>(m.layers, 0)), ClampCost(layer));
  c.embedding = 0;
  c.head = ClampCost(static_cast<double>(m.vocab) * h);
  return c;
}

NanotronSplit NanotronGreedySplit(const ModelSpec& model, int64_t pp) {
  // Blocks in Nanotron's llama order: embedding, decoder layers, final norm, LM head, cast to
  // fp32, loss. Only decoder layers and the LM head have a cost.
  BlockCosts costs = NanotronBlockCosts(model);
  struct Block {
    int64_t cost;
    bool parameters;
    bool layer;
    bool head;
  };
  std::vector<Block> blocks;
  blocks.push_back({0, true, false, false});
  for (int64_t c : costs.layers) blocks.push_back({c, true, true, false});
  blocks.push_back({0, true, false, false});          // final norm
  blocks.push_back({costs.head, true, false, true});  // LM head
  blocks.push_back({0, false, false, false});         // cast to fp32
  blocks.push_back({0, false, false, false});         // loss
  double total = 0;
  for (const Block& b : blocks) total += static_cast<double>(b.cost);
  NanotronSplit split;
  split.layers.assign(static_cast<size_t>(pp), 0);
  split.has_parameters.assign(static_cast<size_t>(pp), false);
  int64_t rank = 0;
  double cumulative = 0;
  for (const Block& b : blocks) {
    cumulative += static_cast<double>(b.cost);
    size_t r = static_cast<size_t>(std::min(rank, pp - 1));
    if (b.layer) split.layers[r] += 1;
    if (b.parameters) split.has_parameters[r] = true;
    if (b.head) split.head_rank = static_cast<int64_t>(r);
    double threshold = total * (static_cast<double>(rank + 1) / static_cast<double>(pp));
    if (cumulative > threshold) ++rank;
  }
  return split;
}

std::optional<std::vector<int64_t>> BalanceByCost(const BlockCosts& costs, int64_t stages) {
  const int64_t n = static_cast<int64_t>(costs.layers.size());
  if (stages < 1 || n < stages) return std::nullopt;
  std::vector<int64_t> prefix(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs.layers[static_cast<size_t>(i)];
  auto stage_cost = [&](int64_t s, int64_t j, int64_t i) {
    return prefix[i] - prefix[j] + (s == 0 ? costs.embedding : 0) +
           (s == stages - 1 ? costs.head : 0);
  };
  // Exact dynamic programme on (most expensive stage, sum of squares) for ordinary sizes;
  // for very long models a bottleneck search with greedy packing (same bottleneck).
  if (stages * n * n <= 40'000'000) {
    struct Cell {
      int64_t worst = std::numeric_limits<int64_t>::max();
      double squares = 0;
      int64_t from = -1;
    };
    std::vector<std::vector<Cell>> best(static_cast<size_t>(stages),
                                        std::vector<Cell>(static_cast<size_t>(n + 1)));
    for (int64_t i = 1; i <= n - (stages - 1); ++i) {
      double c = static_cast<double>(stage_cost(0, 0, i));
      best[0][i] = {stage_cost(0, 0, i), c * c, 0};
    }
    for (int64_t s = 1; s < stages; ++s) {
      for (int64_t i = s + 1; i <= n - (stages - 1 - s); ++i) {
        Cell& cell = best[s][i];
        for (int64_t j = s; j < i; ++j) {
          const Cell& prev = best[s - 1][j];
          if (prev.from < 0) continue;
          int64_t c = stage_cost(s, j, i);
          int64_t worst = std::max(prev.worst, c);
          double squares = prev.squares + static_cast<double>(c) * static_cast<double>(c);
          if (worst < cell.worst || (worst == cell.worst && squares < cell.squares))
            cell = {worst, squares, j};
        }
      }
    }
    std::vector<int64_t> counts(static_cast<size_t>(stages));
    int64_t i = n;
    for (int64_t s = stages - 1; s >= 0; --s) {
      int64_t j = best[s][i].from;
      counts[static_cast<size_t>(s)] = i - j;
      i = j;
    }
    return counts;
  }
  auto pack = [&](int64_t bound, std::vector<int64_t>* counts) {
    counts->clear();
    int64_t j = 0;
    for (int64_t s = 0; s < stages; ++s) {
      int64_t left = stages - s - 1;
      int64_t i = j + 1;
      if (stage_cost(s, j, i) > bound) return false;
      while (i < n - left && stage_cost(s, j, i + 1) <= bound) ++i;
      if (s == stages - 1) i = n;
      if (stage_cost(s, j, i) > bound) return false;
      counts->push_back(i - j);
      j = i;
    }
    return j == n;
  };
  int64_t lo = 0, hi = prefix[n] + costs.embedding + costs.head;
  std::vector<int64_t> counts;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (pack(mid, &counts))
      hi = mid;
    else
      lo = mid + 1;
  }
  pack(lo, &counts);
  return counts;
}

std::optional<std::vector<int64_t>> MegatronStageLayers(const Plan& plan, std::string* why) {
  const PipelineSpec& pl = plan.pipeline;
  const int64_t layers = plan.model.layers, pp = plan.parallel.pp, vpp = plan.parallel.vpp;
  const int64_t stages = pp * vpp;
  std::vector<int64_t> counts;
  if (!pl.stage_layers.empty()) {
    const int64_t n = static_cast<int64_t>(pl.stage_layers.size());
    int64_t sum = 0;
    for (int64_t v : pl.stage_layers) sum += v;
    if (sum != layers) {
      *why = fmt::format("`stage_layers` {} sums to {}, but the model has {} layers",
                         ListText(pl.stage_layers), sum, layers);
      return std::nullopt;
    }
    if (n == stages) return pl.stage_layers;
    if (n != pp) {
      *why = fmt::format(
          "`stage_layers` has {} entries; it needs one per pipeline rank (pp = {}){}", n, pp,
          vpp > 1 ? fmt::format(" or one per virtual stage (pp · vpp = {})", stages) : "");
      return std::nullopt;
    }
    counts.assign(static_cast<size_t>(stages), 0);
    for (int64_t p = 0; p < pp; ++p) {
      int64_t v = pl.stage_layers[static_cast<size_t>(p)];
      if (v % vpp != 0) {
        *why = fmt::format(
            "stage {} has {} layers in `stage_layers`, which do not split into vpp = {} chunks", p,
            v, vpp);
        return std::nullopt;
      }
      for (int64_t c = 0; c < vpp; ++c) counts[static_cast<size_t>(c * pp + p)] = v / vpp;
    }
    return counts;
  }
  if (pl.first_stage_layers || pl.last_stage_layers) {
    if (pl.account_for_embedding || pl.account_for_loss) {
      *why =
          "first/last stage layer counts cannot be combined with account_for_embedding or "
          "account_for_loss";
      return std::nullopt;
    }
    int64_t first = pl.first_stage_layers.value_or(0), last = pl.last_stage_layers.value_or(0);
    int64_t given = (pl.first_stage_layers ? 1 : 0) + (pl.last_stage_layers ? 1 : 0);
    if (given > pp) {
      *why = "first and last stage layer counts need pp > 1";
      return std::nullopt;
    }
    int64_t middle_stages = pp - given;
    int64_t middle = layers - first - last;
    if ((pl.first_stage_layers && first <= 0) || (pl.last_stage_layers && last <= 0) ||
        middle < 0 || (middle_stages == 0) != (middle == 0) ||
        (middle_stages > 0 && middle % middle_stages != 0)) {
      *why = fmt::format("{} layers do not split as first {} / last {} with {} middle stages",
                         layers, pl.first_stage_layers ? std::to_string(first) : "-",
                         pl.last_stage_layers ? std::to_string(last) : "-", middle_stages);
      return std::nullopt;
    }
    std::vector<int64_t> per_rank(static_cast<size_t>(pp),
                                  middle_stages > 0 ? middle / middle_stages : 0);
    if (pl.first_stage_layers) per_rank[0] = first;
    if (pl.last_stage_layers) per_rank[static_cast<size_t>(pp - 1)] = last;
    counts.assign(static_cast<size_t>(stages), 0);
    for (int64_t p = 0; p < pp; ++p) {
      if (per_rank[static_cast<size_t>(p)] % vpp != 0) {
        *why =
            fmt::format("pipeline rank {} holds {} layers, which do not split into vpp = {} chunks",
                        p, per_rank[static_cast<size_t>(p)], vpp);
        return std::nullopt;
      }
      for (int64_t c = 0; c < vpp; ++c)
        counts[static_cast<size_t>(c * pp + p)] = per_rank[static_cast<size_t>(p)] / vpp;
    }
    return counts;
  }
  const int64_t e = pl.account_for_embedding ? 1 : 0, l = pl.account_for_loss ? 1 : 0;
  const int64_t total = layers + e + l;
  if (total % stages != 0) {
    *why = fmt::format(
        "{} layers{} do not split evenly over pp · vpp = {} · {} = {} virtual stages", total,
        e + l > 0 ? " (with the embedding and loss counted as layers)" : "", pp, vpp, stages);
    return std::nullopt;
  }
  counts.assign(static_cast<size_t>(stages), total / stages);
  counts.front() -= e;
  counts.back() -= l;
  if (counts.front() < 0 || counts.back() < 0) {
    *why = fmt::format("not enough layers in the {} virtual pipeline stage",
                       counts.front() < 0 ? "first" : "last");
    return std::nullopt;
  }
  return counts;
}

int64_t PipelineStage::layer_count() const {
  int64_t n = 0;
  for (const PipelineChunk& c : chunks) n += c.layer_count();
  return n;
}

int64_t PipelineStage::cost() const {
  int64_t n = 0;
  for (const PipelineChunk& c : chunks) n += c.cost;
  return n;
}

const PipelineChunk* Partition::ChunkOfLayer(int64_t layer) const {
  for (const PipelineStage& s : stages) {
    for (const PipelineChunk& c : s.chunks) {
      if (layer >= c.first_layer && layer < c.end_layer) return &c;
    }
  }
  return nullptr;
}

std::vector<const PipelineChunk*> Partition::VirtualStages() const {
  std::vector<const PipelineChunk*> out(static_cast<size_t>(pp * vpp), nullptr);
  for (const PipelineStage& s : stages) {
    for (const PipelineChunk& c : s.chunks) out[static_cast<size_t>(c.virtual_stage)] = &c;
  }
  return out;
}

std::vector<std::string> Partition::Verify() const {
  std::vector<std::string> problems;
  if (static_cast<int64_t>(stages.size()) != pp)
    problems.push_back("one stage per pipeline rank expected");
  int64_t next = 0;
  for (const PipelineChunk* c : VirtualStages()) {
    if (c == nullptr) {
      problems.push_back("a virtual stage is missing");
      return problems;
    }
    if (c->first_layer != next || c->end_layer < c->first_layer) {
      problems.push_back(
          fmt::format("virtual stage {} does not continue at layer {}", c->virtual_stage, next));
    }
    if (c->layer_count() == 0 && !c->embedding && !c->loss) {
      problems.push_back(fmt::format("virtual stage {} holds nothing", c->virtual_stage));
    }
    next = c->end_layer;
  }
  if (next != layers)
    problems.push_back(fmt::format("the stages cover {} of {} layers", next, layers));
  return problems;
}

std::string Partition::Print() const {
  std::string out = fmt::format("partition: {} layers over pp {} x vpp {} ({})\n", layers, pp, vpp,
                                ToString(method));
  for (const PipelineStage& s : stages) {
    for (const PipelineChunk& c : s.chunks) {
      out += fmt::format("  pp {} chunk {}: layers [{}, {}) ({}){}{}  cost {}\n", c.pp_rank,
                         c.chunk, c.first_layer, c.end_layer, c.layer_count(),
                         c.embedding ? " +embedding" : "", c.loss ? " +loss" : "", c.cost);
    }
  }
  return out;
}

}  // namespace paraplan
