// Rank layout: hand-derived groups for small worlds (both orders, expert mesh with etp != tp),
// and a literal transcription of Megatron's generate_masked_orthogonal_rank_groups as an
// oracle over many sizes.
#include "compiler/analyze/layout.h"

#include <doctest/doctest.h>

#include <map>
#include <sstream>

namespace paraplan {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

Groups ListOf(const Layout& layout, GroupKind kind) {
  Groups out;
  const GroupList& list = layout.Groups(kind);
  for (int64_t g = 0; g < list.group_count(); ++g) {
    auto span = list.Group(g);
    out.emplace_back(span.begin(), span.end());
  }
  return out;
}

Layout Build(int64_t tp, int64_t cp, int64_t dp, int64_t pp, int64_t ep, int64_t etp,
             std::string order = "tp-cp-ep-dp-pp", int64_t gpus_per_node = 8) {
  MeshSizes s{tp, cp, dp, pp, ep, etp, order, gpus_per_node};
  std::string error;
  auto layout = BuildLayout(s, &error);
  REQUIRE_MESSAGE(layout.has_value(), error);
  CHECK(layout->Verify().empty());
  return *layout;
}

// Megatron's algorithm, transcribed as literally as C++ allows (prefix products, decompose,
// inner products), for the oracle test.
Groups MegatronGroups(const std::vector<int64_t>& parallel_size, const std::vector<bool>& mask) {
  auto prefix_product = [](const std::vector<int64_t>& a) {
    std::vector<int64_t> r{1};
    for (int64_t v : a) r.push_back(r.back() * v);
    return r;
  };
  auto decompose = [&](int64_t index, const std::vector<int64_t>& shape) {
    auto stride = prefix_product(shape);
    std::vector<int64_t> idx;
    for (size_t i = 0; i < shape.size(); ++i) idx.push_back((index / stride[i]) % shape[i]);
    return idx;
  };
  std::vector<int64_t> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  auto global_stride = prefix_product(parallel_size);
  int64_t world = global_stride.back();
  for (size_t i = 0; i < parallel_size.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  int64_t group_size = prefix_product(masked_shape).back();
  Groups ranks;
  for (int64_t group_index = 0; group_index < world / group_size; ++group_index) {
    auto gidx = decompose(group_index, unmasked_shape);
    std::vector<int64_t> rank;
    for (int64_t r = 0; r < group_size; ++r) {
      auto ridx = decompose(r, masked_shape);
      int64_t v = 0;
      for (size_t i = 0; i < ridx.size(); ++i) v += ridx[i] * masked_stride[i];
      for (size_t i = 0; i < gidx.size(); ++i) v += gidx[i] * unmasked_stride[i];
      rank.push_back(v);
    }
    ranks.push_back(rank);
  }
  return ranks;
}

// RankGenerator(tp, ep, dp, pp, cp, order).get_ranks(token), literally.
Groups MegatronGetRanks(int64_t tp, int64_t ep, int64_t dp, int64_t pp, int64_t cp,
                        std::string order, const std::string& token) {
  std::vector<std::pair<std::string, int64_t>> name_to_size = {
      {"tp", tp}, {"pp", pp}, {"dp", dp}, {"ep", ep}, {"cp", cp}};
  for (auto& [name, size] : name_to_size) {
    if (order.find(name) == std::string::npos) order += "-" + name;
  }
  std::vector<std::string> ordered;
  std::stringstream ss(order);
  for (std::string t; std::getline(ss, t, '-');) ordered.push_back(t);
  std::vector<int64_t> sizes;
  for (const auto& t : ordered) {
    for (auto& [name, size] : name_to_size) {
      if (name == t) sizes.push_back(size);
    }
  }
  std::vector<bool> mask(ordered.size(), false);
  std::stringstream ts(token);
  for (std::string t; std::getline(ts, t, '-');) {
    for (size_t i = 0; i < ordered.size(); ++i) {
      if (ordered[i] == t) mask[i] = true;
    }
  }
  return MegatronGroups(sizes, mask);
}

TEST_CASE("default order, W=16 TP=2 PP=4: the reference's hand-derived groups") {
  Layout l = Build(/*tp=*/2, /*cp=*/1, /*dp=*/2, /*pp=*/4, /*ep=*/1, /*etp=*/2);
  CHECK(l.world_size() == 16);
  CHECK(ListOf(l, GroupKind::kTp) ==
        Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(ListOf(l, GroupKind::kDp) ==
        Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(ListOf(l, GroupKind::kPp) ==
        Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(ListOf(l, GroupKind::kTpPp) ==
        Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}});
  CHECK(ListOf(l, GroupKind::kEmbd) == Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}});
  CHECK(ListOf(l, GroupKind::kPosEmbd) == Groups{{0}, {1}, {2}, {3}});
  CHECK(ListOf(l, GroupKind::kCp).size() == 16);  // singletons
  CHECK(ListOf(l, GroupKind::kDpCp) == ListOf(l, GroupKind::kDp));
  CHECK(ListOf(l, GroupKind::kTpDp) ==
        Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  // Expert mesh with etp = tp and ep = 1 mirrors the dense one.
  CHECK(l.edp() == 2);
  CHECK(ListOf(l, GroupKind::kEtp) == ListOf(l, GroupKind::kTp));
  CHECK(ListOf(l, GroupKind::kEdp) == ListOf(l, GroupKind::kDp));
  CHECK(ListOf(l, GroupKind::kEtpEpPp) == ListOf(l, GroupKind::kTpPp));

  RankCoordinates c = l.Coordinates(13);  // 13 = 1 + 2·(0 + 2·3)... tp 1, dp 0, pp 3
  CHECK(c.tp == 1);
  CHECK(c.dp == 0);
  CHECK(c.pp == 3);
  CHECK(c.node == 1);
  CHECK(c.local == 5);
  CHECK(l.GroupIndexOf(GroupKind::kEmbd, 5) == -1);  // pp stage 1 of 4 holds no embedding
  CHECK(l.GroupOf(GroupKind::kEmbd, 13).size() == 2);
  CHECK(l.NextPipelineRank(5) == 9);
  CHECK(l.PrevPipelineRank(5) == 1);
  CHECK(l.NextPipelineRank(13) == -1);
}

TEST_CASE("order tp-cp-ep-pp-dp puts the pipeline inside the data-parallel replica") {
  Layout l = Build(2, 1, 2, 4, 1, 2, "tp-cp-ep-pp-dp");
  // rank = tp + 2·(pp + 4·dp)
  CHECK(ListOf(l, GroupKind::kPp) ==
        Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(ListOf(l, GroupKind::kDp) ==
        Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK(ListOf(l, GroupKind::kTp)[3] == std::vector<int64_t>{6, 7});
  CHECK(ListOf(l, GroupKind::kTpPp) ==
        Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}});
  CHECK(ListOf(l, GroupKind::kEmbd) == Groups{{0, 6}, {1, 7}, {8, 14}, {9, 15}});
  RankCoordinates c = l.Coordinates(13);  // 13 = 1 + 2·(2 + 4·1)
  CHECK(c.tp == 1);
  CHECK(c.pp == 2);
  CHECK(c.dp == 1);
}

TEST_CASE("context parallel: cp, dp_cp, tp_cp, tp_dp, tp_dp_cp (W=16 TP=2 CP=2 DP=4)") {
  Layout l = Build(2, 2, 4, 1, 1, 2);
  // rank = tp + 2·(cp + 2·dp)
  CHECK(ListOf(l, GroupKind::kCp) ==
        Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(ListOf(l, GroupKind::kDp) ==
        Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(ListOf(l, GroupKind::kDpCp) ==
        Groups{{0, 2, 4, 6, 8, 10, 12, 14}, {1, 3, 5, 7, 9, 11, 13, 15}});
  CHECK(ListOf(l, GroupKind::kTpCp) ==
        Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  CHECK(ListOf(l, GroupKind::kTpDp) ==
        Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}});
  CHECK(ListOf(l, GroupKind::kTpDpCp).size() == 1);
  CHECK(ListOf(l, GroupKind::kEmbd) == ListOf(l, GroupKind::kPosEmbd));  // pp = 1: first only
  CHECK(ListOf(l, GroupKind::kEmbd).size() == 16);
}

TEST_CASE("expert mesh with etp != tp: W=16 TP=2 CP=2 DP=4 EP=8 ETP=1 (edp = 2)") {
  Layout l = Build(2, 2, 4, 1, 8, 1);
  CHECK(l.edp() == 2);
  // expert rank = ep + 8·edp
  CHECK(ListOf(l, GroupKind::kEp) ==
        Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}});
  CHECK(ListOf(l, GroupKind::kEtp).size() == 16);
  CHECK(ListOf(l, GroupKind::kEtp)[5] == std::vector<int64_t>{5});
  CHECK(ListOf(l, GroupKind::kEdp) ==
        Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK(ListOf(l, GroupKind::kEtpEp) == ListOf(l, GroupKind::kEp));
  CHECK(ListOf(l, GroupKind::kEtpEpPp) == ListOf(l, GroupKind::kEp));
  RankCoordinates c = l.Coordinates(11);  // dense: tp 1, cp 1, dp 2; expert: ep 3, edp 1
  CHECK(c.tp == 1);
  CHECK(c.cp == 1);
  CHECK(c.dp == 2);
  CHECK(c.etp == 0);
  CHECK(c.ep == 3);
  CHECK(c.edp == 1);
}

TEST_CASE("expert mesh with pp, pp-last order: W=16 TP=2 DP=4 PP=2 EP=4 ETP=1") {
  Layout l = Build(2, 1, 4, 2, 4, 1);
  CHECK(l.edp() == 2);
  // expert rank = ep + 4·(edp + 2·pp); dense rank = tp + 2·(dp + 4·pp)
  CHECK(ListOf(l, GroupKind::kEp) ==
        Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  CHECK(ListOf(l, GroupKind::kEdp) ==
        Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(ListOf(l, GroupKind::kEtpEpPp) ==
        Groups{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}});
  CHECK(ListOf(l, GroupKind::kPp)[0] == std::vector<int64_t>{0, 8});
}

TEST_CASE("order tp-cp-ep-pp-dp with experts needs edp == dp") {
  Layout l = Build(2, 1, 4, 2, 2, 1, "tp-cp-ep-pp-dp");
  CHECK(l.edp() == 4);
  // expert rank = ep + 2·(pp + 2·edp)
  CHECK(ListOf(l, GroupKind::kEp)[1] == std::vector<int64_t>{2, 3});
  CHECK(ListOf(l, GroupKind::kEdp) == ListOf(l, GroupKind::kDp));
  CHECK(ListOf(l, GroupKind::kEdp)[0] == std::vector<int64_t>{0, 4, 8, 12});

  std::string error;
  MeshSizes bad{2, 1, 4, 2, /*ep=*/2, /*etp=*/2, "tp-cp-ep-pp-dp", 8};  // edp = 2 != dp = 4
  CHECK_FALSE(BuildLayout(bad, &error).has_value());
  CHECK(error.find("expert data-parallel size (2) must equal the data-parallel size (4)") !=
        std::string::npos);
}

TEST_CASE("bad sizes and order strings are refused with a message") {
  std::string error;
  CHECK_FALSE(BuildLayout(MeshSizes{4, 1, 2, 4, 32, 4, "tp-cp-ep-dp-pp", 8}, &error).has_value());
  CHECK(error.find("not divisible by expert_tensor_model_pipeline_parallel") != std::string::npos);
  error.clear();
  CHECK_FALSE(BuildLayout(MeshSizes{2, 1, 2, 1, 1, 2, "tp-pp", 8}, &error).has_value());
  CHECK(error.find("the size of `dp` is 2") != std::string::npos);
  error.clear();
  CHECK_FALSE(BuildLayout(MeshSizes{2, 1, 2, 1, 1, 2, "tp-xp-dp", 8}, &error).has_value());
  CHECK(error.find("unknown axis `xp`") != std::string::npos);
  error.clear();
  CHECK_FALSE(BuildLayout(MeshSizes{2, 1, 2, 1, 1, 2, "tp-dp-tp", 8}, &error).has_value());
  CHECK(error.find("twice") != std::string::npos);
  error.clear();
  CHECK_FALSE(BuildLayout(MeshSizes{0, 1, 2, 1, 1, 2, "tp-cp-ep-dp-pp", 8}, &error).has_value());
  error.clear();
  CHECK_FALSE(BuildLayout(MeshSizes{1 << 20, 1, 1 << 20, 1, 1, 1, "tp-cp-ep-dp-pp", 8}, &error)
                  .has_value());
}

TEST_CASE("every kind equals Megatron's get_ranks over many sizes and both orders") {
  const std::map<GroupKind, std::pair<bool, std::string>> tokens = {
      {GroupKind::kTp, {false, "tp"}},           {GroupKind::kPp, {false, "pp"}},
      {GroupKind::kDp, {false, "dp"}},           {GroupKind::kCp, {false, "cp"}},
      {GroupKind::kDpCp, {false, "dp-cp"}},      {GroupKind::kTpPp, {false, "tp-pp"}},
      {GroupKind::kTpDp, {false, "tp-dp"}},      {GroupKind::kTpDpCp, {false, "tp-dp-cp"}},
      {GroupKind::kTpCp, {false, "tp-cp"}},      {GroupKind::kEp, {true, "ep"}},
      {GroupKind::kEtp, {true, "tp"}},           {GroupKind::kEtpEp, {true, "tp-ep"}},
      {GroupKind::kEtpEpPp, {true, "tp-ep-pp"}}, {GroupKind::kEdp, {true, "dp"}},
  };
  int checked = 0;
  for (std::string order :
       {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-dp-cp-ep-pp", "pp-dp-ep-cp-tp"}) {
    for (int64_t tp : {1, 2, 4}) {
      for (int64_t cp : {1, 2}) {
        for (int64_t dp : {1, 2, 6}) {
          for (int64_t pp : {1, 3, 4}) {
            for (int64_t ep : {1, 2, 4}) {
              for (int64_t etp : {1, 2}) {
                int64_t world = tp * cp * dp * pp;
                if (world % (etp * ep * pp) != 0) continue;
                int64_t edp = world / (etp * ep * pp);
                bool pp_last = order.size() >= 2 && order.substr(order.size() - 2) == "pp";
                MeshSizes s{tp, cp, dp, pp, ep, etp, order, 4};
                std::string error;
                auto l = BuildLayout(s, &error);
                if (!pp_last && pp > 1 && edp != dp) {
                  CHECK_FALSE(l.has_value());
                  continue;
                }
                REQUIRE_MESSAGE(l.has_value(), error);
                REQUIRE(l->Verify().empty());
                for (const auto& token : tokens) {
                  const auto& kind = token.first;  // not a binding: doctest captures it
                  const auto& spec = token.second;
                  Groups want = spec.first
                                    ? MegatronGetRanks(etp, ep, edp, pp, 1, order, spec.second)
                                    : MegatronGetRanks(tp, 1, dp, pp, cp, order, spec.second);
                  CHECK_MESSAGE(ListOf(*l, kind) == want, order, " ", GroupKindName(kind));
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("group kinds have stable names") {
  CHECK(GroupKindName(GroupKind::kEtpEp) == "etp_ep");
  CHECK(GroupKindFromName("pos_embd") == GroupKind::kPosEmbd);
  CHECK_FALSE(GroupKindFromName("nope").has_value());
  CHECK(AllGroupKinds().size() == kGroupKindCount);
  CHECK(IsExpertGroupKind(GroupKind::kEdp));
  CHECK_FALSE(IsExpertGroupKind(GroupKind::kDp));
}

TEST_CASE("16,384 ranks: Llama 3 405B layout (TP 8, PP 16, DP 128)") {
  Layout l = Build(8, 1, 128, 16, 1, 8);
  CHECK(l.world_size() == 16384);
  CHECK(l.Groups(GroupKind::kTp).group_count() == 2048);
  CHECK(l.Groups(GroupKind::kPp).Group(0)[1] == 1024);
  CHECK(l.Groups(GroupKind::kDp).Group(1)[1] == 9);
  CHECK(l.nodes() == 2048);
}

}  // namespace
}  // namespace paraplan
