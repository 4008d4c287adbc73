// The rank layout: every rank's coordinates and every process group, exactly as Megatron-Core's
// RankGenerator and initialize_model_parallel compute them for the same sizes and order string.
//
// Two meshes cover the same ranks (reference/megatron-constraints.md §3):
//   dense  mesh  tp × cp × dp × pp      (ep has size 1 in it)
//   expert mesh  etp × ep × edp × pp    (cp has size 1 in it; edp = world / (etp·ep·pp))
// Both read the same order string (fastest-varying axis first, default "tp-cp-ep-dp-pp"); in the
// expert mesh the tokens `tp` and `dp` mean etp and edp. Axes of size 1 missing from the string
// are appended at its end, as Megatron does.
//
// A GroupList holds all groups of one kind in Megatron's order (group j decodes the unmarked
// coordinates with the leftmost unmarked axis fastest; members ascend). Every group of a kind
// has the same size, so the list is one flat array. Every rank is in exactly one group of
// each kind, except embd / pos_embd, which hold only the first (and last) pipeline stage.
//
// Invariants after BuildLayout: tp·cp·dp·pp == etp·ep·edp·pp == world_size; the pipeline
// groups of both meshes coincide. Made by BuildLayout (analyze/); read by checks (topology),
// `planc explain`, and lower/ (communicators by member ranks). Cost: O(kinds × world) memory
// and time, about 1 MB and well under a millisecond for 16,384 ranks.
#ifndef PARAPLAN_COMPILER_ANALYZE_LAYOUT_H_
#define PARAPLAN_COMPILER_ANALYZE_LAYOUT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/plan/plan.h"

namespace paraplan {

// Every group kind, in the order explain and JSON list them. Megatron's own names in
// comments; `etp_ep` is EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP.
enum class GroupKind : uint8_t {
  kTp,       // TENSOR_MODEL_PARALLEL_GROUP            dense  "tp"
  kPp,       // PIPELINE_MODEL_PARALLEL_GROUP          dense  "pp"
  kDp,       // DATA_PARALLEL_GROUP                    dense  "dp"
  kCp,       // CONTEXT_PARALLEL_GROUP                 dense  "cp"
  kDpCp,     // DATA_PARALLEL_GROUP_WITH_CP            dense  "dp-cp"
  kTpPp,     // MODEL_PARALLEL_GROUP                   dense  "tp-pp"
  kTpDp,     // TENSOR_AND_DATA_PARALLEL_GROUP         dense  "tp-dp"
  kTpDpCp,   // TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP dense  "tp-dp-cp"
  kTpCp,     // TENSOR_AND_CONTEXT_PARALLEL_GROUP      dense  "tp-cp"
  kEp,       // EXPERT_MODEL_PARALLEL_GROUP            expert "ep"
  kEtp,      // EXPERT_TENSOR_PARALLEL_GROUP           expert "tp"
  kEtpEp,    // EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP expert "tp-ep"
  kEtpEpPp,  // EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP expert "tp-ep-pp"
  kEdp,      // EXPERT_DATA_PARALLEL_GROUP             expert "dp"
  kEmbd,     // EMBEDDING_GROUP: first and last member of each pp group (first only if pp = 1)
  kPosEmbd,  // POSITION_EMBEDDING_GROUP: first member of each pp group
};
inline constexpr int kGroupKindCount = 16;

// "tp", "dp_cp", "etp_ep_pp", ... (the JSON keys and explain's names).
std::string_view GroupKindName(GroupKind kind);
std::optional<GroupKind> GroupKindFromName(std::string_view name);
// Megatron's group description, e.g. "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP".
std::string_view GroupKindMegatronName(GroupKind kind);
// True for the kinds built on the expert mesh (ep, etp, etp_ep, etp_ep_pp, edp).
bool IsExpertGroupKind(GroupKind kind);
// All kinds in enum order.
std::span<const GroupKind> AllGroupKinds();

// The sizes a layout is built from. FromPlan reads plan.parallel and the cluster.
struct MeshSizes {
  int64_t tp = 1;
  int64_t cp = 1;
  int64_t dp = 1;
  int64_t pp = 1;
  int64_t ep = 1;
  int64_t etp = 1;
  std::string order = "tp-cp-ep-dp-pp";
  int64_t gpus_per_node = 8;  // for node / local indices only

  static MeshSizes FromPlan(const Plan& plan);
};

// One kind's groups, flat: group g is members[g·group_size, (g+1)·group_size).
struct GroupList {
  GroupKind kind = GroupKind::kTp;
  int64_t group_size = 1;
  std::vector<int64_t> members;

  int64_t group_count() const {
    return group_size ? static_cast<int64_t>(members.size()) / group_size : 0;
  }
  std::span<const int64_t> Group(int64_t g) const {
    return {members.data() + g * group_size, static_cast<size_t>(group_size)};
  }
};

// Where one rank sits. Coordinates are Megatron's ranks inside each axis (get_*_rank()).
struct RankCoordinates {
  int64_t rank = 0;
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;  // dense mesh
  int64_t etp = 0, ep = 0, edp = 0;        // expert mesh (its pp equals the dense pp)
  int64_t node = 0;                        // rank / gpus_per_node
  int64_t local = 0;                       // rank % gpus_per_node (the GPU inside the node)
};

// One mesh as a RankGenerator sees it: the order-string tokens, their sizes and strides.
struct MeshAxes {
  std::vector<std::string> tokens;  // e.g. {"tp", "cp", "ep", "dp", "pp"}, size-1 axes appended
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // strides[0] = 1, strides[i] = sizes[0]·…·sizes[i-1]

  // Index of a token, or -1.
  int Find(std::string_view token) const;
  // Megatron's get_ranks(token): all groups varying along the '-'-separated axes in `marked`.
  // Empty `error` on success.
  std::vector<int64_t> Groups(std::string_view marked, int64_t* group_size,
                              std::string* error) const;
  int64_t Coordinate(int64_t rank, std::string_view token) const;
};

// Builds a RankGenerator's axes for the given sizes (keys tp, cp, ep, dp, pp) and order.
// Fails with a message when the order names an unknown axis, names one twice, or leaves out an
// axis whose size is not 1 (Megatron: "The size of (dp) is (8), but you haven't specified the
// order").
std::optional<MeshAxes> MakeMeshAxes(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp,
                                     std::string_view order, std::string* error);

class Layout {
 public:
  int64_t world_size() const { return world_size_; }
  const MeshSizes& sizes() const { return sizes_; }
  int64_t edp() const { return edp_; }
  int64_t nodes() const { return (world_size_ + sizes_.gpus_per_node - 1) / sizes_.gpus_per_node; }
  const MeshAxes& dense_mesh() const { return dense_; }
  const MeshAxes& expert_mesh() const { return expert_; }

  const GroupList& Groups(GroupKind kind) const { return groups_[static_cast<size_t>(kind)]; }
  // Index of the group of `kind` that holds `rank`, or -1 (embd / pos_embd for middle stages).
  int64_t GroupIndexOf(GroupKind kind, int64_t rank) const;
  // The members of that group; empty when the rank is in none.
  std::span<const int64_t> GroupOf(GroupKind kind, int64_t rank) const;
  RankCoordinates Coordinates(int64_t rank) const;

  // The dense pipeline neighbours of a rank (pp ± 1 inside its pp group); -1 at the ends.
  int64_t NextPipelineRank(int64_t rank) const;
  int64_t PrevPipelineRank(int64_t rank) const;

  // Consistency of the structure (sizes, partitions, pipeline groups of both meshes equal);
  // returns the violations, empty when none.
  std::vector<std::string> Verify() const;
  // A stable text dump (`--dump=layout`): sizes, then each kind's groups one per line.
  // Lists at most `max_groups` groups per kind (0 = all).
  std::string Print(int64_t max_groups = 0) const;

 private:
  friend std::optional<Layout> BuildLayout(const MeshSizes&, std::string*);
  MeshSizes sizes_;
  int64_t world_size_ = 0;
  int64_t edp_ = 0;
  MeshAxes dense_;
  MeshAxes expert_;
  std::array<GroupList, kGroupKindCount> groups_;
  // group_of_[kind][rank]: index of the rank's group of that kind, -1 if none.
  std::array<std::vector<int32_t>, kGroupKindCount> group_of_;
};

// Builds the layout; nullopt with `error` set when the sizes do not form both meshes (a size
// < 1, the expert mesh does not divide the world, a bad order string, or a non-pp-last order
// with pp > 1 and edp != dp, where Megatron's pipeline groups of the two meshes would differ).
// The rules (P03xx) report these to the user first; the error here guards other callers.
std::optional<Layout> BuildLayout(const MeshSizes& sizes, std::string* error);
inline std::optional<Layout> BuildLayout(const Plan& plan, std::string* error) {
  return BuildLayout(MeshSizes::FromPlan(plan), error);
}

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_LAYOUT_H_
