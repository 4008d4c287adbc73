// Every input of the parser fuzz corpus goes through the whole front end without a crash, and
// is either evaluated or refused with a diagnostic on a valid range.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace paraplan {
bool CheckFuzzInput(std::string_view text);
}

TEST_CASE("the parser fuzz corpus replays without a crash or a broken invariant") {
  const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
  REQUIRE(root != nullptr);
  std::filesystem::path dir = std::filesystem::path(root) / "tests/fuzz/parse_corpus";
  int inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    INFO(entry.path().filename().string());
    CHECK(paraplan::CheckFuzzInput(ss.str()));
    ++inputs;
  }
  CHECK(inputs >= 20);
}
