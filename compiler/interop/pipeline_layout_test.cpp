// Megatron-Core's pipeline layout: the string and list forms, Megatron-Core's own checks, what a
// plan cannot place, and the text written back.
#include "compiler/interop/pipeline_layout.h"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

namespace paraplan::interop {
namespace {

std::vector<int64_t> Decoders(const ParsedLayout& p) {
  std::vector<int64_t> out;
  for (const LayoutStage& s : p.stages) out.push_back(s.decoder);
  return out;
}

std::string Refusal(std::string_view text) {
  ParsedLayout p = ParseLayoutString(text);
  return p.problem ? p.problem->message : std::string();
}

std::vector<int64_t> DeepSeekV3Split() {
  std::vector<int64_t> v{1};
  v.insert(v.end(), 30, 2);
  v.push_back(0);
  return v;
}

TEST_CASE("DeepSeek-V3's Megatron-Bridge H100 layout: 32 virtual stages, MTP with the loss") {
  ParsedLayout p = ParseLayoutString("Et|(tt|)*30mL");
  REQUIRE(!p.problem);
  REQUIRE(p.stages.size() == 32);
  CHECK(Decoders(p) == DeepSeekV3Split());
  CHECK(p.stages.front().embedding);
  CHECK(p.stages.back().loss);
  CHECK(p.stages.back().mtp == 1);
  CHECK(p.stages.back().decoder == 0);

  LayoutSplit split = SplitFromLayout(p.stages, {.pp = 8, .vpp = 4, .layers = 61, .mtp_layers = 1});
  REQUIRE(!split.problem);
  CHECK(split.vpp == 4);
  CHECK(split.stage_layers == DeepSeekV3Split());
  // vpp is derived when the file does not state it.
  split = SplitFromLayout(p.stages, {.pp = 8, .vpp = {}, .layers = 61, .mtp_layers = 1});
  REQUIRE(!split.problem);
  CHECK(split.vpp == 4);
}

TEST_CASE("the spellings Megatron-Core takes: commas, symbol counts, counts inside groups") {
  // Megatron-LM's documented example, MTP moved into the loss's stage.
  ParsedLayout p = ParseLayoutString("Et*3|(tt|)*29,t,mL");
  REQUIRE(!p.problem);
  CHECK(p.stages.size() == 31);
  CHECK(p.stages.front().decoder == 3);
  CHECK(p.stages.back().decoder == 1);
  CHECK(ParseLayoutString("E|(t|)*3,tL").stages.size() == 5);
  CHECK(Decoders(ParseLayoutString("E|(t|)*3,tL")) == std::vector<int64_t>{0, 1, 1, 1, 1});
  CHECK(Decoders(ParseLayoutString("E,t*2|(t*2|)*2t*2,L")) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(Decoders(ParseLayoutString("Et|t|*2tL")) == std::vector<int64_t>{1, 1, 0, 1});
  CHECK(Decoders(ParseLayoutString("E(tt|)*0tL")) == std::vector<int64_t>{1});
  CHECK(Decoders(ParseLayoutString("E||t|L")) == std::vector<int64_t>{0, 0, 1, 0});
}

TEST_CASE("Megatron-Bridge's list of lists") {
  std::vector<std::vector<std::string>> lists{
      {"embedding", "decoder", "decoder"}, {"Decoder", " decoder "}, {"decoder", "mtp", "LOSS"}};
  ParsedLayout p = ParseLayoutLists(lists);
  REQUIRE(!p.problem);
  CHECK(Decoders(p) == std::vector<int64_t>{2, 2, 1});
  CHECK(p.stages.back().mtp == 1);

  CHECK(ParseLayoutLists({}).problem);
  lists[1][0] = "attention";
  REQUIRE(ParseLayoutLists(lists).problem);
  CHECK(ParseLayoutLists(lists).problem->message ==
        "`attention` in virtual stage 1 is no layer type");
  lists[1][0] = "encoder";
  CHECK(ParseLayoutLists(lists).problem->message == "virtual stage 1 names an encoder layer");
  // Megatron-Bridge's standalone MTP stage.
  std::vector<std::vector<std::string>> standalone{
      {"embedding", "decoder"}, {"decoder"}, {"mtp"}, {"loss"}};
  REQUIRE(ParseLayoutLists(standalone).problem);
  CHECK(ParseLayoutLists(standalone).problem->message ==
        "the MTP modules are in virtual stage 2, the loss in stage 3");
}

TEST_CASE("malformed strings are refused, saying where") {
  CHECK(Refusal("") == "the layout is empty");
  CHECK(Refusal("Et|tx|L") == "`x` at character 5 is no layer symbol");
  CHECK(Refusal("Et|t |L") == "` ` at character 5 is no layer symbol");
  CHECK(Refusal("Et|(tt|*3L") == "the `(` at character 4 is never closed");
  CHECK(Refusal("Et|tt)*3|L") == "the `)` at character 6 closes no group");
  CHECK(Refusal("Et|((t|)*2)*3L") == "the group at character 4 holds another group");
  CHECK(Refusal("Et|()*3L") == "the group at character 4 is empty");
  CHECK(Refusal("Et|(tt|)L") == "the group `(tt|)` has no repeat count");
  CHECK(Refusal("E*t|L") == "the `*` at character 2 has no count");
  CHECK(Refusal("*3Et|L") == "the `*` at character 1 repeats nothing");
  CHECK(Refusal("Et|t*2*3|L") == "a second `*` follows the count at character 5");
  CHECK(Refusal("E(t|x)*2L") == "`x` at character 5 is no layer symbol");
}

TEST_CASE("huge repeat counts are refused before anything is expanded") {
  CHECK(Refusal("Et*99999999999999999999999L") ==
        "the repeat count at character 3 is more than 100000");
  CHECK(Refusal("E(t|)*60000(tt|)*60000L") ==
        "the layout names more than 100000 layers and stage ends");
  CHECK(!ParseLayoutString("E(t|)*1000L").problem);
}

TEST_CASE("Megatron-Core's placement rules, and a plan's") {
  CHECK(Refusal("tE|L") == "the embedding `E` is in virtual stage 0, not first in stage 0");
  CHECK(Refusal("|Et|L") == "the embedding `E` is in virtual stage 1, not first in stage 0");
  CHECK(Refusal("Et|EtL") == "the embedding `E` is in virtual stage 1, not first in stage 0");
  CHECK(Refusal("t|tL") == "the layout has no embedding `E`");
  CHECK(Refusal("Et|t") == "the layout has no loss `L`");
  CHECK(Refusal("Et|Lt") == "the loss `L` is in virtual stage 1, not last in stage 1");
  CHECK(Refusal("EtL|t") == "the loss `L` is in virtual stage 0, not last in stage 1");
  CHECK(Refusal("Et|mt|L") ==
        "a transformer layer `t` follows an MTP module `m` (virtual stage 1)");
  CHECK(Refusal("Et|tm|mL") == "the MTP modules are split over virtual stages 1 and 2");
  CHECK(Refusal("Et*3|(tt|)*29,m|L") ==
        "the MTP modules are in virtual stage 30, the loss in stage 31");
}

TEST_CASE("the layout against the pipeline and the model") {
  ParsedLayout p = ParseLayoutString("Et|(tt|)*30mL");
  REQUIRE(!p.problem);
  LayoutSplit s = SplitFromLayout(p.stages, {.pp = 5, .vpp = {}, .layers = 61, .mtp_layers = 1});
  REQUIRE(s.problem);
  CHECK(s.problem->message == "the layout has 32 virtual stages, not a multiple of pp = 5");
  s = SplitFromLayout(p.stages, {.pp = 8, .vpp = 2, .layers = 61, .mtp_layers = 1});
  REQUIRE(s.problem);
  CHECK(s.problem->message == "the layout has 32 virtual stages, but pp · vpp = 8 · 2 = 16");
  s = SplitFromLayout(p.stages, {.pp = 8, .vpp = 4, .layers = 60, .mtp_layers = 1});
  REQUIRE(s.problem);
  CHECK(s.problem->message == "the layout has 61 transformer layers, but the model has 60");
  CHECK(s.stage_layers.empty());
  s = SplitFromLayout(p.stages, {.pp = 8, .vpp = 4, .layers = 61, .mtp_layers = 0});
  REQUIRE(s.problem);
  CHECK(s.problem->message == "the layout has 1 MTP modules `m`, but the model has 0");
  // Without a stated layer count the plan's own check (P0406) compares the sum.
  s = SplitFromLayout(p.stages, {.pp = 8, .vpp = {}, .layers = {}, .mtp_layers = 1});
  CHECK(!s.problem);
}

TEST_CASE("the layout text of a split reads back as the same split") {
  const std::vector<int64_t> ds = DeepSeekV3Split();
  CHECK(LayoutText(ds, 1) == "Et|(tt|)*30mL");
  CHECK(LayoutText(std::vector<int64_t>{8, 8, 8, 8}, 0) == "Et*8|(t*8|)*2t*8L");
  CHECK(LayoutText(std::vector<int64_t>{3, 2, 3}, 0) == "Ettt|tt|tttL");
  CHECK(LayoutText(std::vector<int64_t>{4}, 2) == "Et*4mmL");
  for (const std::vector<int64_t>& split :
       {ds, std::vector<int64_t>{5, 0, 0, 4}, std::vector<int64_t>{1, 2, 2, 1, 1, 2}}) {
    ParsedLayout p = ParseLayoutString(LayoutText(split, 1));
    REQUIRE(!p.problem);
    CHECK(Decoders(p) == split);
  }
  CHECK(LayerListText(std::vector<int64_t>{1, 2, 0}) == "[1, 2, 0]");
}

// Every string of up to five symbols of the grammar (and a few outside it): refused with a
// message, or read into stages a plan can place, whose written text reads back the same.
TEST_CASE("every short string is refused or reads back through its layout text") {
  const std::string alphabet = "Etm|L()*9,x";
  int64_t accepted = 0;
  std::string text;
  std::function<void(size_t)> visit = [&](size_t depth) {
    ParsedLayout p = ParseLayoutString(text);
    if (p.problem) {
      CHECK(!p.problem->message.empty());
      CHECK(p.stages.empty());
    } else {
      ++accepted;
      REQUIRE(!p.stages.empty());
      CHECK(p.stages.front().embedding);
      CHECK(p.stages.back().loss);
      for (size_t i = 0; i + 1 < p.stages.size(); ++i) CHECK(p.stages[i].mtp == 0);
      const std::vector<int64_t> decoders = Decoders(p);
      ParsedLayout again = ParseLayoutString(LayoutText(decoders, p.stages.back().mtp));
      CAPTURE(text);
      REQUIRE(!again.problem);
      CHECK(Decoders(again) == decoders);
      CHECK(again.stages.back().mtp == p.stages.back().mtp);
    }
    if (depth == 5) return;
    for (char c : alphabet) {
      text.push_back(c);
      visit(depth + 1);
      text.pop_back();
    }
  };
  visit(0);
  CHECK(accepted > 100);
}

}  // namespace
}  // namespace paraplan::interop
