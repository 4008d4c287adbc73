// Fuzz target for the renderers: arbitrary bytes become source buffers and diagnostics with
// arbitrary (often invalid) ranges, kinds and levels; every format must render without
// crashing, and json/sarif must stay valid JSON.
//
// Built with clang and -DPARAPLAN_FUZZ=ON as render_fuzz (libFuzzer) over the text and short
// forms, which need no LLVM header (LLVM 14's JSON.h does not compile with clang against GCC
// 12's standard library in C++20 mode); the corpus in compiler/diagnostics/fuzz_corpus/ is
// replayed over all four formats, JSON and SARIF parsed back, by the render_fuzz_replay test.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "compiler/diagnostics/render.h"
#include "compiler/diagnostics/render_internal.h"
#ifndef PARAPLAN_RENDER_FUZZ_TEXT_ONLY
#include "llvm/Support/JSON.h"
#endif

namespace {

struct Reader {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4 && pos < size; ++i) v |= static_cast<uint32_t>(data[pos++]) << (8 * i);
    return v;
  }
  uint8_t U8() { return pos < size ? data[pos++] : 0; }
  std::string Text(size_t max) {
    size_t want = U8() % (max + 1);
    size_t n = std::min<size_t>(want, size - pos);
    std::string s(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
    return s;
  }
  bool Done() const { return pos >= size; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paraplan;
  Reader r{data, size};
  SourceManager sm;
  int buffers = 1 + r.U8() % 3;
  for (int i = 0; i < buffers; ++i) {
    std::string text = r.Text(200);
    sm.AddBuffer(i == 1 ? "<command line>" : "f" + std::to_string(i) + ".plan", text,
                 static_cast<BufferKind>(r.U8() % 4));
  }
  auto range = [&]() {
    SourceRange s;
    s.buffer = r.U8() % (buffers + 2);
    s.begin = r.U8() % 2 ? r.U32() : r.U8();
    s.end = r.U8() % 2 ? r.U32() : s.begin + r.U8() % 40;
    return s;
  };
  std::vector<Diagnostic> diags;
  int count = 1 + r.U8() % 4;
  for (int i = 0; i < count && !r.Done(); ++i) {
    Diagnostic d;
    d.kind = static_cast<DiagKind>(r.U8() % (static_cast<unsigned>(DiagKind::kCount) + 2));
    d.level = static_cast<DiagLevel>(r.U8() % 4);
    d.message = r.Text(60);
    d.primary = range();
    d.primary_label = r.Text(20);
    int labels = r.U8() % 5;
    for (int k = 0; k < labels; ++k) d.labels.push_back({range(), r.Text(20)});
    if (r.U8() % 2) d.values.emplace_back(r.Text(10), r.Text(10));
    if (r.U8() % 2) d.notes.push_back(r.Text(30));
    if (r.U8() % 2) d.helps.push_back(r.Text(30));
    diags.push_back(std::move(d));
  }
  RenderOptions options;
  options.color = r.U8() % 2;
  options.ascii = r.U8() % 2;
#ifdef PARAPLAN_RENDER_FUZZ_TEXT_ONLY
  if (render_internal::RenderText(diags, sm, options).empty() && !diags.empty()) std::abort();
  if (render_internal::RenderShort(diags, sm, options).empty() && !diags.empty()) std::abort();
#else
  for (DiagFormat f :
       {DiagFormat::kText, DiagFormat::kShort, DiagFormat::kJson, DiagFormat::kSarif}) {
    std::string out = RenderDiagnostics(diags, sm, f, options);
    if ((f == DiagFormat::kJson || f == DiagFormat::kSarif) && !llvm::json::parse(out))
      std::abort();
  }
#endif
  return 0;
}
