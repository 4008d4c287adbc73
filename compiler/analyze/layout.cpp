#include "compiler/analyze/layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "compiler/base/checked.h"

namespace paraplan {
namespace {

struct KindInfo {
  GroupKind kind;
  std::string_view name;
  std::string_view megatron;
  bool expert;
  std::string_view token;  // the RankGenerator request; empty for the embedding groups
};

constexpr std::array<KindInfo, kGroupKindCount> kKindInfo = {{
    {GroupKind::kTp, "tp", "TENSOR_MODEL_PARALLEL_GROUP", false, "tp"},
    {GroupKind::kPp, "pp", "PIPELINE_MODEL_PARALLEL_GROUP", false, "pp"},
    {GroupKind::kDp, "dp", "DATA_PARALLEL_GROUP", false, "dp"},
    {GroupKind::kCp, "cp", "CONTEXT_PARALLEL_GROUP", false, "cp"},
    {GroupKind::kDpCp, "dp_cp", "DATA_PARALLEL_GROUP_WITH_CP", false, "dp-cp"},
    {GroupKind::kTpPp, "tp_pp", "MODEL_PARALLEL_GROUP", false, "tp-pp"},
    {GroupKind::kTpDp, "tp_dp", "TENSOR_AND_DATA_PARALLEL_GROUP", false, "tp-dp"},
    {GroupKind::kTpDpCp, "tp_dp_cp", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", false, "tp-dp-cp"},
    {GroupKind::kTpCp, "tp_cp", "TENSOR_AND_CONTEXT_PARALLEL_GROUP", false, "tp-cp"},
    {GroupKind::kEp, "ep", "EXPERT_MODEL_PARALLEL_GROUP", true, "ep"},
    {GroupKind::kEtp, "etp", "EXPERT_TENSOR_PARALLEL_GROUP", true, "tp"},
    {GroupKind::kEtpEp, "etp_ep", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", true, "tp-ep"},
    {GroupKind::kEtpEpPp, "etp_ep_pp", "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", true,
     "tp-ep-pp"},
    {GroupKind::kEdp, "edp", "EXPERT_DATA_PARALLEL_GROUP", true, "dp"},
    {GroupKind::kEmbd, "embd", "EMBEDDING_GROUP", false, ""},
    {GroupKind::kPosEmbd, "pos_embd", "POSITION_EMBEDDING_GROUP", false, ""},
}};

constexpr std::array<GroupKind, kGroupKindCount> kAllKinds = {
    GroupKind::kTp,      GroupKind::kPp,   GroupKind::kDp,   GroupKind::kCp,
    GroupKind::kDpCp,    GroupKind::kTpPp, GroupKind::kTpDp, GroupKind::kTpDpCp,
    GroupKind::kTpCp,    GroupKind::kEp,   GroupKind::kEtp,  GroupKind::kEtpEp,
    GroupKind::kEtpEpPp, GroupKind::kEdp,  GroupKind::kEmbd, GroupKind::kPosEmbd};

constexpr std::array<std::string_view, 5> kAxisTokens = {"tp", "cp", "ep", "dp", "pp"};

// Ranks beyond this are refused: the layout keeps O(kinds × world) integers.
constexpr int64_t kMaxLayoutRanks = int64_t{1} << 18;

std::vector<std::string_view> SplitDash(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t dash = s.find('-', start);
    out.push_back(s.substr(start, dash == std::string_view::npos ? s.npos : dash - start));
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  return out;
}

}  // namespace

std::string_view GroupKindName(GroupKind kind) { return kKindInfo[static_cast<size_t>(kind)].name; }
std::string_view GroupKindMegatronName(GroupKind kind) {
  return kKindInfo[static_cast<size_t>(kind)].megatron;
}
bool IsExpertGroupKind(GroupKind kind) { return kKindInfo[static_cast<size_t>(kind)].expert; }
std::span<const GroupKind> AllGroupKinds() { return kAllKinds; }

std::optional<GroupKind> GroupKindFromName(std::string_view name) {
  for (const KindInfo& k : kKindInfo) {
    if (k.name == name) return k.kind;
  }
  return std::nullopt;
}

MeshSizes MeshSizes::FromPlan(const Plan& plan) {
  MeshSizes s;
  s.tp = plan.parallel.tp;
  s.cp = plan.parallel.cp;
  s.dp = plan.parallel.dp;
  s.pp = plan.parallel.pp;
  s.ep = plan.parallel.ep;
  s.etp = plan.parallel.etp;
  s.order = plan.parallel.order;
  s.gpus_per_node = plan.cluster.gpus_per_node;
  return s;
}

int MeshAxes::Find(std::string_view token) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == token) return static_cast<int>(i);
  }
  return -1;
}

int64_t MeshAxes::Coordinate(int64_t rank, std::string_view token) const {
  int i = Find(token);
  if (i < 0) return 0;
  return (rank / strides[i]) % sizes[i];
}

std::optional<MeshAxes> MakeMeshAxes(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp,
                                     std::string_view order, std::string* error) {
  const std::array<int64_t, 5> size_of = {tp, cp, ep, dp, pp};
  auto size_for = [&](std::string_view token) -> int64_t {
    for (size_t i = 0; i < kAxisTokens.size(); ++i) {
      if (kAxisTokens[i] == token) return size_of[i];
    }
    return -1;
  };
  MeshAxes axes;
  for (std::string_view token : SplitDash(order)) {
    if (size_for(token) < 0) {
      *error = fmt::format("order \"{}\" names an unknown axis `{}` (axes: tp, cp, ep, dp, pp)",
                           order, token);
      return std::nullopt;
    }
    if (axes.Find(token) >= 0) {
      *error = fmt::format("order \"{}\" names the axis `{}` twice", order, token);
      return std::nullopt;
    }
    axes.tokens.emplace_back(token);
  }
  // Megatron appends missing size-1 axes in the order tp, pp, dp, ep, cp (its dict order).
  for (std::string_view token : {"tp", "pp", "dp", "ep", "cp"}) {
    if (axes.Find(token) >= 0) continue;
    if (size_for(token) != 1) {
      *error = fmt::format("the size of `{}` is {}, but the order \"{}\" does not name it", token,
                           size_for(token), order);
      return std::nullopt;
    }
    axes.tokens.emplace_back(token);
  }
  int64_t stride = 1;
  for (const std::string& token : axes.tokens) {
    int64_t size = size_for(token);
    if (size < 1) {
      *error = fmt::format("the size of `{}` is {}; every axis needs a size >= 1", token, size);
      return std::nullopt;
    }
    axes.sizes.push_back(size);
    axes.strides.push_back(stride);
    auto next = CheckedMul(stride, size);
    if (!next) {
      *error = "the mesh is too large (its size overflows a 64-bit integer)";
      return std::nullopt;
    }
    stride = *next;
  }
  return axes;
}

std::vector<int64_t> MeshAxes::Groups(std::string_view marked, int64_t* group_size,
                                      std::string* error) const {
  std::vector<bool> mask(tokens.size(), false);
  for (std::string_view token : SplitDash(marked)) {
    int i = Find(token);
    if (i < 0) {
      *error = fmt::format("no axis `{}` in the mesh", token);
      return {};
    }
    mask[i] = true;
  }
  std::vector<int64_t> masked_size, masked_stride, unmasked_size, unmasked_stride;
  int64_t world = 1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    world *= sizes[i];
    (mask[i] ? masked_size : unmasked_size).push_back(sizes[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(strides[i]);
  }
  int64_t size = 1;
  for (int64_t s : masked_size) size *= s;
  int64_t count = world / size;
  *group_size = size;
  std::vector<int64_t> members;
  members.reserve(static_cast<size_t>(world));
  // Offsets of the members inside a group (leftmost marked axis fastest), computed once.
  std::vector<int64_t> inner(static_cast<size_t>(size));
  for (int64_t m = 0; m < size; ++m) {
    int64_t rest = m, offset = 0;
    for (size_t a = 0; a < masked_size.size(); ++a) {
      offset += (rest % masked_size[a]) * masked_stride[a];
      rest /= masked_size[a];
    }
    inner[m] = offset;
  }
  for (int64_t g = 0; g < count; ++g) {
    int64_t rest = g, base = 0;
    for (size_t a = 0; a < unmasked_size.size(); ++a) {
      base += (rest % unmasked_size[a]) * unmasked_stride[a];
      rest /= unmasked_size[a];
    }
    for (int64_t offset : inner) members.push_back(base + offset);
  }
  return members;
}

std::optional<Layout> BuildLayout(const MeshSizes& sizes, std::string* error) {
  for (auto [name, value] : {std::pair{"tp", sizes.tp},
                             {"cp", sizes.cp},
                             {"dp", sizes.dp},
                             {"pp", sizes.pp},
                             {"ep", sizes.ep},
                             {"etp", sizes.etp},
                             {"gpus_per_node", sizes.gpus_per_node}}) {
    if (value < 1) {
      *error = fmt::format("`{}` is {}; it must be at least 1", name, value);
      return std::nullopt;
    }
  }
  auto world = CheckedProduct({sizes.tp, sizes.cp, sizes.dp, sizes.pp});
  if (!world || *world > kMaxLayoutRanks) {
    *error = fmt::format("the layout of more than {} ranks is not computed", kMaxLayoutRanks);
    return std::nullopt;
  }
  auto expert_model = CheckedProduct({sizes.etp, sizes.ep, sizes.pp});
  if (!expert_model || *world % *expert_model != 0) {
    *error = fmt::format(
        "world_size ({}) is not divisible by expert_tensor_model_pipeline_parallel size ({} · {} · "
        "{})",
        *world, sizes.etp, sizes.ep, sizes.pp);
    return std::nullopt;
  }
  Layout layout;
  layout.sizes_ = sizes;
  layout.world_size_ = *world;
  layout.edp_ = *world / *expert_model;
  auto dense = MakeMeshAxes(sizes.tp, sizes.cp, 1, sizes.dp, sizes.pp, sizes.order, error);
  if (!dense) return std::nullopt;
  auto expert = MakeMeshAxes(sizes.etp, 1, sizes.ep, layout.edp_, sizes.pp, sizes.order, error);
  if (!expert) return std::nullopt;
  layout.dense_ = std::move(*dense);
  layout.expert_ = std::move(*expert);

  for (const KindInfo& info : kKindInfo) {
    GroupList& list = layout.groups_[static_cast<size_t>(info.kind)];
    list.kind = info.kind;
    if (info.token.empty()) continue;
    const MeshAxes& mesh = info.expert ? layout.expert_ : layout.dense_;
    std::string problem;
    list.members = mesh.Groups(info.token, &list.group_size, &problem);
    if (!problem.empty()) {
      *error = problem;
      return std::nullopt;
    }
  }
  // Embedding groups from the pipeline groups (Megatron's default_embedding_ranks and
  // default_position_embedding_ranks; with vpp the embedding stays on chunk 0 of the first
  // pipeline rank and the output layer on the last chunk of the last, so nothing changes).
  const GroupList& pp = layout.groups_[static_cast<size_t>(GroupKind::kPp)];
  GroupList& embd = layout.groups_[static_cast<size_t>(GroupKind::kEmbd)];
  GroupList& pos = layout.groups_[static_cast<size_t>(GroupKind::kPosEmbd)];
  embd.group_size = sizes.pp == 1 ? 1 : 2;
  pos.group_size = 1;
  for (int64_t g = 0; g < pp.group_count(); ++g) {
    auto group = pp.Group(g);
    embd.members.push_back(group.front());
    if (sizes.pp > 1) embd.members.push_back(group.back());
    pos.members.push_back(group.front());
  }
  // The dense and the expert pipeline groups must coincide (Megatron asserts it; with a
  // non-pp-last order it needs edp == dp).
  int64_t expert_pp_size = 0;
  std::string problem;
  std::vector<int64_t> expert_pp = layout.expert_.Groups("pp", &expert_pp_size, &problem);
  bool pp_last = sizes.order.size() >= 2 && sizes.order.ends_with("pp");
  if (expert_pp != pp.members || (!pp_last && sizes.pp > 1 && layout.edp_ != sizes.dp)) {
    *error = fmt::format(
        "with the order \"{}\" and pp = {} the expert data-parallel size ({}) must equal the "
        "data-parallel size ({}), or the pipeline groups of the dense and expert meshes differ",
        sizes.order, sizes.pp, layout.edp_, sizes.dp);
    return std::nullopt;
  }
  for (const KindInfo& info : kKindInfo) {
    const GroupList& list = layout.groups_[static_cast<size_t>(info.kind)];
    std::vector<int32_t>& of = layout.group_of_[static_cast<size_t>(info.kind)];
    of.assign(static_cast<size_t>(layout.world_size_), -1);
    for (size_t i = 0; i < list.members.size(); ++i) {
      of[static_cast<size_t>(list.members[i])] = static_cast<int32_t>(i / list.group_size);
    }
  }
  return layout;
}

int64_t Layout::GroupIndexOf(GroupKind kind, int64_t rank) const {
  if (rank < 0 || rank >= world_size_) return -1;
  return group_of_[static_cast<size_t>(kind)][static_cast<size_t>(rank)];
}

std::span<const int64_t> Layout::GroupOf(GroupKind kind, int64_t rank) const {
  int64_t g = GroupIndexOf(kind, rank);
  if (g < 0) return {};
  return Groups(kind).Group(g);
}

RankCoordinates Layout::Coordinates(int64_t rank) const {
  RankCoordinates c;
  c.rank = rank;
  c.tp = dense_.Coordinate(rank, "tp");
  c.cp = dense_.Coordinate(rank, "cp");
  c.dp = dense_.Coordinate(rank, "dp");
  c.pp = dense_.Coordinate(rank, "pp");
  c.etp = expert_.Coordinate(rank, "tp");
  c.ep = expert_.Coordinate(rank, "ep");
  c.edp = expert_.Coordinate(rank, "dp");
  c.node = rank / sizes_.gpus_per_node;
  c.local = rank % sizes_.gpus_per_node;
  return c;
}

int64_t Layout::NextPipelineRank(int64_t rank) const {
  auto group = GroupOf(GroupKind::kPp, rank);
  if (group.empty()) return -1;
  int64_t pp = dense_.Coordinate(rank, "pp");
  return pp + 1 < static_cast<int64_t>(group.size()) ? group[pp + 1] : -1;
}

int64_t Layout::PrevPipelineRank(int64_t rank) const {
  auto group = GroupOf(GroupKind::kPp, rank);
  if (group.empty()) return -1;
  int64_t pp = dense_.Coordinate(rank, "pp");
  return pp > 0 ? group[pp - 1] : -1;
}

std::vector<std::string> Layout::Verify() const {
  std::vector<std::string> problems;
  if (sizes_.tp * sizes_.cp * sizes_.dp * sizes_.pp != world_size_) {
    problems.push_back("tp·cp·dp·pp differs from the world size");
  }
  if (sizes_.etp * sizes_.ep * edp_ * sizes_.pp != world_size_) {
    problems.push_back("etp·ep·edp·pp differs from the world size");
  }
  for (GroupKind kind : kAllKinds) {
    const GroupList& list = Groups(kind);
    bool partial = kind == GroupKind::kEmbd || kind == GroupKind::kPosEmbd;
    std::vector<int> seen(static_cast<size_t>(world_size_), 0);
    for (int64_t r : list.members) {
      if (r < 0 || r >= world_size_) {
        problems.push_back(fmt::format("{}: rank {} out of range", GroupKindName(kind), r));
        break;
      }
      ++seen[static_cast<size_t>(r)];
    }
    for (int64_t r = 0; r < world_size_ && problems.empty(); ++r) {
      int n = seen[static_cast<size_t>(r)];
      if (n > 1 || (!partial && n != 1)) {
        problems.push_back(fmt::format("{}: rank {} is in {} groups", GroupKindName(kind), r, n));
      }
    }
  }
  return problems;
}

std::string Layout::Print(int64_t max_groups) const {
  std::string out = fmt::format(
      "world {}  tp {}  cp {}  dp {}  pp {}  ep {}  etp {}  edp {}  order {}  gpus_per_node {}\n",
      world_size_, sizes_.tp, sizes_.cp, sizes_.dp, sizes_.pp, sizes_.ep, sizes_.etp, edp_,
      sizes_.order, sizes_.gpus_per_node);
  for (GroupKind kind : kAllKinds) {
    const GroupList& list = Groups(kind);
    out += fmt::format("{} ({} groups of {}):\n", GroupKindName(kind), list.group_count(),
                       list.group_size);
    int64_t shown = max_groups > 0 ? std::min(max_groups, list.group_count()) : list.group_count();
    for (int64_t g = 0; g < shown; ++g) {
      out += fmt::format("  [{}]\n", fmt::join(list.Group(g), ", "));
    }
    if (shown < list.group_count())
      out += fmt::format("  ... {} more\n", list.group_count() - shown);
  }
  return out;
}

}  // namespace paraplan
