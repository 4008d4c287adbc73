#include "compiler/source/source.h"

#include <doctest/doctest.h>

namespace paraplan {

TEST_CASE("line and column lookup") {
  SourceManager sm;
  uint32_t id = sm.AddBuffer("a.plan", "ab\ncd\r\n\nef", BufferKind::kMemory);
  CHECK(sm.Position(id, 0).line == 1);
  CHECK(sm.Position(id, 3).line == 2);
  CHECK(sm.Position(id, 4).column == 2);
  CHECK(sm.Line(id, 2) == "cd");
  CHECK(sm.Line(id, 3) == "");
  CHECK(sm.Line(id, 4) == "ef");
  CHECK(sm.Line(id, 9) == "");
  CHECK(sm.LineCount(id) == 4);
  CHECK(sm.Slice({id, 3, 5}) == "cd");
  CHECK(sm.Slice({id, 5, 99}) == "");
  CHECK(sm.Slice({7, 0, 1}) == "");
  CHECK(sm.Position(id, 1000).line == 4);
}

}  // namespace paraplan
