// The body ops of runtime/format/README.md section 4 (data and model compute), one handler
// each, and the dispatch table from the op registry (runtime/format/ops.def).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "runtime/exec/rank_runner.h"
#include "runtime/format/checked_size.h"

namespace paraplan::exec {
namespace {

using prog::attrs::Attention;
using prog::attrs::AttentionBackward;

int64_t Last(const prog::mem::Buffer& b) { return b.shape.empty() ? 1 : b.shape.back(); }
int64_t First(const prog::mem::Buffer& b) { return b.shape.empty() ? 1 : b.shape.front(); }

}  // namespace

// ---- OpCall ---------------------------------------------------------------------------------

float* RankRunner::OpCall::Out(size_t i) const {
  return i < op.outputs.size() ? runner_.F(op.outputs[i], ctx) : nullptr;
}

const prog::mem::Buffer& RankRunner::OpCall::InBuf(size_t i) const {
  return runner_.role_.buffers[op.inputs[i]];
}

const prog::mem::Buffer& RankRunner::OpCall::OutBuf(size_t i) const {
  return runner_.role_.buffers[op.outputs[i]];
}

RunError RankRunner::OpCall::Fail(const std::string& what) const {
  return RunError(prog::EnumNameOpKind(op.kind) + std::string(" in body `") + body_ +
                  "` of role `" + runner_.role_.name + "`: " + what);
}

void RankRunner::OpCall::Need(bool ok, const std::string& what) const {
  if (!ok) throw Fail(what);
}

int64_t RankRunner::OpCall::Mul(std::initializer_list<int64_t> factors) const {
  const std::optional<int64_t> r = CheckedProduct(factors);
  if (!r) throw Fail("operand sizes overflow 64 bits");
  return *r;
}

int64_t RankRunner::OpCall::Div(int64_t a, int64_t b) const {
  if (b <= 0) throw Fail("a dimension of " + std::to_string(b) + " elements");
  return a / b;
}

void RankRunner::OpCall::Input(size_t i, int64_t n) const {
  if (i >= op.inputs.size() || op.inputs[i] < 0)
    throw Fail("input " + std::to_string(i) + " names no buffer");
  Need(InN(i) >= n, "input " + std::to_string(i) + " `" + InBuf(i).name + "` holds " +
                        std::to_string(InN(i)) + " elements; the op touches " + std::to_string(n));
}

void RankRunner::OpCall::Output(size_t i, int64_t n, bool optional) const {
  if (i >= op.outputs.size() || op.outputs[i] < 0) {
    Need(optional, "output " + std::to_string(i) + " names no buffer");
    return;
  }
  Need(OutN(i) >= n, "output " + std::to_string(i) + " `" + OutBuf(i).name + "` holds " +
                         std::to_string(OutN(i)) + " elements; the op touches " +
                         std::to_string(n));
}

int64_t RankRunner::OpCall::RowOffset(int64_t rows) const {
  if (op.comm == CommKind::None) return 0;
  return static_cast<int64_t>(runner_.comms_[static_cast<int>(op.comm)].index) * rows;
}

float* RankRunner::GradTarget(float* dx, int64_t n, bool accumulate) {
  return accumulate && dx ? Scratch(1, n) : dx;
}

void RankRunner::GradFinish(float* dx, int64_t n, bool accumulate) {
  if (accumulate && dx) backend_.Accumulate(dx, scratch_[1], n);
}

RankRunner::Handler RankRunner::HandlerOf(OpKind kind) {
  static const std::array<Handler, 256> kTable = [] {
    std::array<Handler, 256> h{};
#define PARAPLAN_HANDLER_kEmitted(cls, Kind) PARAPLAN_HANDLER_##cls(Kind)
#define PARAPLAN_HANDLER_kRuntimeOnly(cls, Kind) PARAPLAN_HANDLER_##cls(Kind)
#define PARAPLAN_HANDLER_kReserved(cls, Kind)
#define PARAPLAN_HANDLER_kSchedule(Kind)
#define PARAPLAN_HANDLER_kCollective(Kind) \
  h[static_cast<uint8_t>(OpKind::Kind)] = &RankRunner::Run##Kind;
#define PARAPLAN_HANDLER_kCompute(Kind) \
  h[static_cast<uint8_t>(OpKind::Kind)] = &RankRunner::Run##Kind;
#define PARAPLAN_OP(Kind, cls, status, in, out, comms, backend, fields) \
  PARAPLAN_HANDLER_##status(cls, Kind)
#include "runtime/format/ops.def"
#undef PARAPLAN_OP
#undef PARAPLAN_HANDLER_kEmitted
#undef PARAPLAN_HANDLER_kRuntimeOnly
#undef PARAPLAN_HANDLER_kReserved
#undef PARAPLAN_HANDLER_kSchedule
#undef PARAPLAN_HANDLER_kCollective
#undef PARAPLAN_HANDLER_kCompute
    return h;
  }();
  return kTable[static_cast<uint8_t>(kind)];
}

// ---- data -----------------------------------------------------------------------------------

void RankRunner::RunLoadBatch(const OpCall& call) {
  const auto& model = program_.model;
  const int64_t t = call.Mul({model.micro_batch, model.seq_len});
  // Over Cp (context parallelism) the rank keeps chunks r and 2·cp-1-r of each sequence.
  const bool cp = call.op.comm == CommKind::Cp;
  const int64_t cp_size = cp ? CommOf(CommKind::Cp, "LoadBatch").size : 1;
  const int64_t local = call.Div(t, cp_size);
  call.Need(call.OutN(0) == local && model.seq_len % (2 * cp_size) == 0,
            "the token buffer holds " + std::to_string(call.OutN(0)) + " ids, a microbatch has " +
                std::to_string(local) + " per rank of " + std::to_string(cp_size));
  tokens_in_.resize(t);
  tokens_out_.resize(t);
  sampler_->Microbatch(call.ctx.step, RankInfo().coords.dp, call.ctx.microbatch, tokens_in_.data(),
                       tokens_out_.data());
  const auto& attrs = call.Attrs<prog::attrs::LoadBatch>();
  const bool labels = attrs.what == prog::BatchPart::kLabels;
  std::vector<int32_t>& ids = labels ? tokens_out_ : tokens_in_;
  if (attrs.shift > 0) {
    // Multi-token prediction: position i takes the id of position i + shift of its sequence;
    // past the end an input is 0 and a label -1 (ignored by the cross-entropy).
    const int64_t seq = model.seq_len, shift = std::min(attrs.shift, seq);
    for (int64_t b = 0; b < model.micro_batch; ++b) {
      int32_t* sequence = ids.data() + b * seq;
      std::copy(sequence + shift, sequence + seq, sequence);
      std::fill(sequence + seq - shift, sequence + seq, labels ? -1 : 0);
    }
  }
  const int32_t* from = ids.data();
  std::vector<int32_t> mine;
  if (cp) {
    const int64_t r = IndexIn(CommKind::Cp), half = model.seq_len / (2 * cp_size);
    mine.resize(static_cast<size_t>(local));
    for (int64_t b = 0; b < model.micro_batch; ++b) {
      const int32_t* sequence = ids.data() + b * model.seq_len;
      int32_t* to = mine.data() + b * 2 * half;
      std::copy(sequence + r * half, sequence + (r + 1) * half, to);
      std::copy(sequence + (2 * cp_size - 1 - r) * half, sequence + (2 * cp_size - r) * half,
                to + half);
    }
    from = mine.data();
  }
  backend_.CopyToDevice(I(call.op.outputs[0], call.ctx), from, local * 4);
}

void RankRunner::RunFill(const OpCall& call) {
  const float value = static_cast<float>(call.Attrs<prog::attrs::Fill>().value);
  for (int32_t o : call.op.outputs) {
    for (int32_t s = 0; s < role_.buffers[o].slots; ++s)
      backend_.Fill(F(o, Context{call.ctx.step, call.ctx.microbatch, s}), Elements(o), value);
  }
}

void RankRunner::RunCopy(const OpCall& call) {
  call.Need(call.InN(0) == call.OutN(0), "sizes differ");
  backend_.Copy(call.Out(0), call.In(0), call.InN(0));
}

// ---- embeddings -----------------------------------------------------------------------------

void RankRunner::RunEmbedding(const OpCall& call) {
  const auto& w = call.InBuf(1);
  const int64_t h = Last(w), vloc = First(w), t = call.InN(0);
  call.Input(1, call.Mul({vloc, h}));
  call.Need(call.OutN(0) == call.Mul({t, h}), "output size");
  backend_.EmbeddingForward(call.Out(0), call.Ids(0), call.In(1), t, h, call.RowOffset(vloc), vloc);
}

void RankRunner::RunEmbeddingBackward(const OpCall& call) {
  const auto& dw = call.OutBuf(0);
  const int64_t h = Last(dw), vloc = First(dw), t = call.InN(1);
  call.Output(0, call.Mul({vloc, h}));
  call.Need(call.InN(0) == call.Mul({t, h}), "gradient size");
  backend_.EmbeddingBackward(call.Out(0), call.In(0), call.Ids(1), t, h, call.RowOffset(vloc),
                             vloc);
}

// --- context parallelism ---
// Over Cp a rank's tokens of each sequence are chunks r and 2·cp-1-r of seq/(2·cp) positions
// each (and under sequence parallelism the rank holds rows [tp index · rows, +rows) of them):
// calls `fn(row, position, count)` for each run of rows with consecutive positions.
template <typename Fn>
void RankRunner::ForEachCpPositionRun(const OpCall& call, int64_t rows, int64_t seq,
                                      const Fn& fn) const {
  const int64_t cp_size = CommOf(CommKind::Cp, "AddPosition").size;
  const int64_t local = call.Div(seq, cp_size), half = local / 2;
  const int64_t tokens = program_.model.micro_batch * local;
  int64_t t0 = 0;
  if (rows != tokens) {  // sequence parallel: the rank's rows of the Cp rank's tokens
    const Comm& tp = comms_[static_cast<int>(CommKind::Tp)];
    call.Need(tp.comm != nullptr && rows * tp.size == tokens,
              std::to_string(rows) + " rows are neither the rank's " + std::to_string(tokens) +
                  " tokens nor a Tp part of them");
    t0 = tp.index * rows;
  }
  call.Need(seq % (2 * cp_size) == 0, "the sequence does not cut into 2 · cp chunks");
  const int64_t r = IndexIn(CommKind::Cp);
  for (int64_t row = 0; row < rows;) {
    const int64_t j = (t0 + row) % local;  // index within the rank's part of one sequence
    const int64_t chunk = j < half ? r : 2 * cp_size - 1 - r;
    const int64_t in_chunk = j % half;
    const int64_t count = std::min(half - in_chunk, rows - row);
    fn(row, chunk * half + in_chunk, count);
    row += count;
  }
}
// --- end context parallelism ---

void RankRunner::RunAddPosition(const OpCall& call) {
  const auto& p = call.InBuf(1);
  const int64_t h = Last(p), seq = First(p), rows = call.Div(call.InN(0), h);
  call.Input(1, call.Mul({seq, h}));
  call.Need(call.OutN(0) == call.InN(0) && seq > 0, "sizes");
  if (call.op.comm == CommKind::Cp) {
    float* y = call.Out(0);
    const float* x = call.In(0);
    const float* table = call.In(1);
    ForEachCpPositionRun(call, rows, seq, [&](int64_t row, int64_t position, int64_t count) {
      backend_.AddPosition(y + row * h, x + row * h, table + position * h, count, h, 0, count);
    });
    return;
  }
  backend_.AddPosition(call.Out(0), call.In(0), call.In(1), rows, h, call.RowOffset(rows), seq);
}

void RankRunner::RunAddPositionBackward(const OpCall& call) {
  const auto& p = call.OutBuf(0);
  const int64_t h = Last(p), seq = First(p), rows = call.Div(call.InN(0), h);
  call.Need(seq > 0, "sizes");
  call.Output(0, call.Mul({seq, h}));
  if (call.op.comm == CommKind::Cp) {
    float* dpos = call.Out(0);
    const float* dy = call.In(0);
    ForEachCpPositionRun(call, rows, seq, [&](int64_t row, int64_t position, int64_t count) {
      backend_.AddPositionBackward(dpos + position * h, dy + row * h, count, h, 0, count);
    });
    return;
  }
  backend_.AddPositionBackward(call.Out(0), call.In(0), rows, h, call.RowOffset(rows), seq);
}

// ---- norms ----------------------------------------------------------------------------------

void RankRunner::RunRmsNorm(const OpCall& call) {
  const int64_t h = call.InN(1), rows = call.Div(call.InN(0), h);
  call.Need(call.OutN(1) == rows && call.OutN(0) == call.InN(0), "sizes");
  const double eps = call.Attrs<prog::attrs::RmsNorm>().eps.value_or(program_.model.norm_eps);
  backend_.RmsNormForward(call.Out(0), call.Out(1), call.In(0), call.In(1), rows, h,
                          static_cast<float>(eps));
}

void RankRunner::RunRmsNormBackward(const OpCall& call) {
  const int64_t h = call.InN(2), rows = call.Div(call.InN(1), h);
  call.Input(0, rows * h);
  call.Input(3, rows);
  call.Output(0, rows * h, true);
  call.Output(1, h, true);
  const bool acc = call.Attrs<prog::attrs::RmsNormBackward>().dx_accumulate;
  float* dx = GradTarget(call.Out(0), rows * h, acc);
  backend_.RmsNormBackward(dx, call.Out(1), call.In(0), call.In(1), call.In(2), call.In(3), rows,
                           h);
  GradFinish(call.Out(0), rows * h, acc);
}

void RankRunner::RunLayerNorm(const OpCall& call) {
  const int64_t h = call.InN(1), rows = call.Div(call.InN(0), h);
  call.Input(2, h);
  call.Output(0, rows * h);
  call.Output(1, rows);
  call.Output(2, rows);
  call.Need(call.OutN(1) == rows, "sizes");
  const double eps = call.Attrs<prog::attrs::LayerNorm>().eps.value_or(program_.model.norm_eps);
  backend_.LayerNormForward(call.Out(0), call.Out(1), call.Out(2), call.In(0), call.In(1),
                            call.In(2), rows, h, static_cast<float>(eps));
}

void RankRunner::RunLayerNormBackward(const OpCall& call) {
  const int64_t h = call.InN(2), rows = call.Div(call.InN(1), h);
  call.Input(0, rows * h);
  call.Input(3, rows);
  call.Input(4, rows);
  call.Output(0, rows * h, true);
  call.Output(1, h, true);
  call.Output(2, h, true);
  const bool acc = call.Attrs<prog::attrs::LayerNormBackward>().dx_accumulate;
  float* dx = GradTarget(call.Out(0), rows * h, acc);
  backend_.LayerNormBackward(dx, call.Out(1), call.Out(2), call.In(0), call.In(1), call.In(2),
                             call.In(3), call.In(4), rows, h);
  GradFinish(call.Out(0), rows * h, acc);
}

// ---- linear layers --------------------------------------------------------------------------

void RankRunner::RunLinear(const OpCall& call) {
  const auto& w = call.InBuf(1);
  const int64_t fan_in = Last(w), fan_out = First(w), rows = call.Div(call.InN(0), fan_in);
  call.Input(1, call.Mul({fan_in, fan_out}));
  const bool has_bias = call.op.inputs.size() > 2 && call.op.inputs[2] >= 0;
  if (has_bias) call.Input(2, fan_out);
  call.Need(rows * fan_in == call.InN(0) && call.OutN(0) == call.Mul({rows, fan_out}),
            "x has " + std::to_string(call.InN(0)) + " elements, W is " + std::to_string(fan_out) +
                "x" + std::to_string(fan_in) + ", y has " + std::to_string(call.OutN(0)));
  backend_.LinearForward(call.Out(0), call.In(0), call.In(1), has_bias ? call.In(2) : nullptr, rows,
                         fan_in, fan_out);
}

void RankRunner::RunLinearBackward(const OpCall& call) {
  const auto& w = call.InBuf(2);
  const int64_t fan_in = Last(w), fan_out = First(w), rows = call.Div(call.InN(0), fan_out);
  call.Input(2, call.Mul({fan_in, fan_out}));
  call.Output(0, call.Mul({rows, fan_in}), true);
  call.Output(1, call.Mul({fan_in, fan_out}), true);
  call.Output(2, fan_out, true);
  call.Need(rows * fan_out == call.InN(0) && call.InN(1) == call.Mul({rows, fan_in}), "sizes");
  backend_.LinearBackward(call.Out(0), call.Out(1), call.Out(2), call.In(0), call.In(1), call.In(2),
                          rows, fan_in, fan_out,
                          call.Attrs<prog::attrs::LinearBackward>().dx_accumulate);
}

void RankRunner::RunAddBias(const OpCall& call) {
  const int64_t n = call.InN(1), rows = call.Div(call.InN(0), n);
  call.Output(0, call.InN(0));
  float* y = call.Out(0);
  if (y != call.In(0)) backend_.Copy(y, call.In(0), call.InN(0));
  for (int64_t r = 0; r < rows; ++r) backend_.Accumulate(y + r * n, call.In(1), n);
}

void RankRunner::RunAddBiasBackward(const OpCall& call) {
  const int64_t n = call.OutN(0), rows = call.Div(call.InN(0), n);
  for (int64_t r = 0; r < rows; ++r) backend_.Accumulate(call.Out(0), call.In(0) + r * n, n);
}

// ---- attention ------------------------------------------------------------------------------

void RankRunner::RunRopeOp(const OpCall& call, const prog::attrs::Rope& a, bool forward) {
  const int64_t heads = a.heads, hd = a.head_dim;
  const auto& model = program_.model;
  // Over Cp each sequence holds two chunks of seq/(2·cp) positions: r and 2·cp-1-r.
  const bool cp = call.op.comm == CommKind::Cp;
  const int64_t cp_size = cp ? CommOf(CommKind::Cp, forward ? "Rope" : "RopeBackward").size : 1;
  const int64_t local = call.Div(model.seq_len, cp_size);
  call.Need(heads > 0 && hd > 0 && hd % 2 == 0,
            "rope with " + std::to_string(heads) + " heads of " + std::to_string(hd));
  const int64_t rows = call.Div(call.InN(0), call.Mul({heads, hd}));
  call.Need(
      rows * heads * hd == call.InN(0) && rows % local == 0 && model.seq_len % (2 * cp_size) == 0,
      "rope over " + std::to_string(call.InN(0)) + " elements with " + std::to_string(heads) +
          " heads of " + std::to_string(hd));
  call.Output(0, call.InN(0));
  float* y = call.Out(0);
  if (y != call.In(0)) backend_.Copy(y, call.In(0), call.InN(0));
  const float theta = static_cast<float>(a.theta.value_or(model.rope_theta));
  auto rotate = [&](float* x, const host::TokenLayout& layout) {
    if (forward)
      backend_.RopeForward(x, layout, heads, hd, theta);
    else
      backend_.RopeBackward(x, layout, heads, hd, theta);
  };
  if (!cp) {
    rotate(y, host::TokenLayout::BatchMajor(model.seq_len, rows / model.seq_len));
    return;
  }
  const int64_t r = IndexIn(CommKind::Cp), half = local / 2;
  for (const int64_t chunk : {r, 2 * cp_size - 1 - r}) {
    host::TokenLayout layout{half, rows / local, 1, local, chunk * half};
    rotate(y + (chunk == r ? 0 : half * heads * hd), layout);
  }
}

void RankRunner::RunRope(const OpCall& call) {
  RunRopeOp(call, call.Attrs<prog::attrs::Rope>(), true);
}

void RankRunner::RunRopeBackward(const OpCall& call) {
  const auto b = call.Attrs<prog::attrs::RopeBackward>();  // the forward's attributes
  RunRopeOp(call, prog::attrs::Rope{b.heads, b.head_dim, b.theta}, false);
}

void RankRunner::RunAttentionOp(const OpCall& call, const Attention& a, bool forward) {
  const int64_t micro = a.micro, seq = a.seq, heads = a.heads, groups = a.kv_heads, hd = a.head_dim;
  call.Need(micro > 0 && seq > 0 && heads > 0 && groups > 0 && heads % groups == 0 && hd > 0,
            "bad attention shape");
  const auto layout = host::TokenLayout::BatchMajor(seq, micro);
  const float scale =
      static_cast<float>(a.scale.value_or(1.0 / std::sqrt(static_cast<double>(hd))));
  const int64_t t = call.Mul({micro, seq}), q_elements = call.Mul({t, heads, hd}),
                kv_elements = call.Mul({t, groups, hd});
  if (forward) {
    call.Output(0, q_elements);
    call.Need(call.InN(0) == q_elements && call.InN(1) == kv_elements &&
                  call.InN(2) == kv_elements && call.OutN(1) == call.Mul({micro, heads, seq}),
              "operand sizes do not match [micro, seq, H, G, hd]");
    backend_.AttentionForward(call.Out(0), call.Out(1), call.In(0), call.In(1), call.In(2), layout,
                              heads, groups, hd, scale, a.window);
    return;
  }
  call.Input(1, q_elements);
  call.Input(2, kv_elements);
  call.Input(3, kv_elements);
  call.Input(4, q_elements);
  call.Input(5, call.Mul({micro, heads, seq}));
  call.Output(0, q_elements);
  call.Output(2, kv_elements);
  call.Need(call.InN(0) == q_elements && call.InN(2) == kv_elements && call.OutN(1) == kv_elements,
            "operand sizes do not match [micro, seq, H, G, hd]");
  backend_.AttentionBackward(call.Out(0), call.Out(1), call.Out(2), call.In(0), call.In(4),
                             call.In(5), call.In(1), call.In(2), call.In(3), layout, heads, groups,
                             hd, scale, a.window);
}

void RankRunner::RunAttention(const OpCall& call) {
  RunAttentionOp(call, call.Attrs<Attention>(), true);
}

void RankRunner::RunAttentionBackward(const OpCall& call) {
  const auto b = call.Attrs<AttentionBackward>();  // the forward's attributes
  RunAttentionOp(
      call, Attention{b.micro, b.seq, b.heads, b.kv_heads, b.head_dim, b.scale, b.window}, false);
}

// ---- ring attention (context parallelism) ---------------------------------------------------

namespace {

// The shape a ring attention op's attributes give (both ops carry the forward's attributes).
template <typename A>
RingAttentionShape RingShapeOf(const A& a) {
  RingAttentionShape s;
  s.micro = a.micro, s.seq = a.seq, s.heads = a.heads, s.kv_heads = a.kv_heads;
  s.head_dim = a.head_dim;
  s.scale = static_cast<float>(a.scale.value_or(1.0 / std::sqrt(static_cast<double>(a.head_dim))));
  s.window = a.window;
  return s;
}

}  // namespace

void RankRunner::RunRingAttentionOp(const OpCall& call, const RingAttentionShape& s, bool forward) {
  const Comm& c = CommOf(call.op.comm, forward ? "RingAttention" : "RingAttentionBackward");
  const int64_t cp = c.size;
  call.Need(s.heads % s.kv_heads == 0, "heads must be a multiple of kv_heads");
  call.Need(s.seq % (2 * cp) == 0,
            "the sequence of " + std::to_string(s.seq) +
                " tokens does not cut into 2 · cp = " + std::to_string(2 * cp) + " equal chunks");
  const int64_t local = call.Div(s.seq, cp), rows = call.Mul({s.micro, local});
  const int64_t q_n = call.Mul({rows, s.heads, s.head_dim}),
                kv_n = call.Mul({rows, s.kv_heads, s.head_dim}), lse_n = call.Mul({rows, s.heads});
  if (forward) {
    call.Input(0, q_n);
    call.Input(1, kv_n);
    call.Input(2, kv_n);
    call.Output(0, q_n);
    call.Output(1, lse_n);
    call.Output(2, call.Mul({4, kv_n}));
    call.Output(3, q_n);
    call.Output(4, lse_n);
    RingAttentionForward(backend_, *c.comm, s, call.Out(0), call.Out(1), call.In(0), call.In(1),
                         call.In(2), call.Out(2), call.Out(3), call.Out(4));
    return;
  }
  call.Input(0, q_n);
  call.Input(1, q_n);
  call.Input(2, kv_n);
  call.Input(3, kv_n);
  call.Input(4, q_n);
  call.Input(5, lse_n);
  call.Output(0, q_n);
  call.Output(1, kv_n);
  call.Output(2, kv_n);
  call.Output(3, call.Mul({8, kv_n}));
  RingAttentionBackward(backend_, *c.comm, s, call.Out(0), call.Out(1), call.Out(2), call.In(0),
                        call.In(4), call.In(5), call.In(1), call.In(2), call.In(3), call.Out(3));
}

void RankRunner::RunRingAttention(const OpCall& call) {
  RunRingAttentionOp(call, RingShapeOf(call.Attrs<prog::attrs::RingAttention>()), true);
}

void RankRunner::RunRingAttentionBackward(const OpCall& call) {
  RunRingAttentionOp(call, RingShapeOf(call.Attrs<prog::attrs::RingAttentionBackward>()), false);
}

// ---- activations and the residual -----------------------------------------------------------

void RankRunner::RunSwiGlu(const OpCall& call) {
  call.Need(call.InN(0) == call.InN(1), "gate and up sizes differ");
  call.Output(0, call.InN(0));
  backend_.SwiGluForward(call.Out(0), call.In(0), call.In(1), call.InN(0));
}

void RankRunner::RunSwiGluBackward(const OpCall& call) {
  call.Input(1, call.InN(0));
  call.Input(2, call.InN(0));
  call.Output(0, call.InN(0), true);
  call.Output(1, call.InN(0));
  backend_.SwiGluBackward(call.Out(0), call.Out(1), call.In(0), call.In(1), call.In(2),
                          call.InN(0));
}

void RankRunner::RunGelu(const OpCall& call) {
  call.Output(0, call.InN(0));
  backend_.GeluForward(call.Out(0), call.In(0), call.InN(0));
}

void RankRunner::RunGeluBackward(const OpCall& call) {
  call.Input(1, call.InN(0));
  call.Output(0, call.InN(0));
  backend_.GeluBackward(call.Out(0), call.In(0), call.In(1), call.InN(0));
}

// The squared-ReLU MLP's activation: the sizes as GELU's.
void RankRunner::RunSquaredRelu(const OpCall& call) {
  call.Output(0, call.InN(0));
  backend_.SquaredReluForward(call.Out(0), call.In(0), call.InN(0));
}

void RankRunner::RunSquaredReluBackward(const OpCall& call) {
  call.Input(1, call.InN(0));
  call.Output(0, call.InN(0));
  backend_.SquaredReluBackward(call.Out(0), call.In(0), call.In(1), call.InN(0));
}

void RankRunner::RunAdd(const OpCall& call) {
  call.Need(call.InN(0) == call.InN(1) && call.OutN(0) == call.InN(0), "sizes differ");
  backend_.Add(call.Out(0), call.In(0), call.In(1), call.InN(0));
}

// ---- multi-head latent attention ------------------------------------------------------------

void RankRunner::RunCopyColumns(const OpCall& call) {
  const auto a = call.Attrs<prog::attrs::CopyColumns>();
  const host::ColumnMap map{a.groups,   a.width,  a.x_cols,   a.x_stride,
                            a.x_offset, a.y_cols, a.y_stride, a.y_offset};
  const int64_t rows = call.Div(call.InN(0), map.x_cols);
  call.Need(rows * map.x_cols == call.InN(0), "x is not rows of `x_cols` columns");
  call.Output(0, call.Mul({rows, map.y_cols}));
  // The last group's columns lie inside the row on both sides, and groups of y do not overlap
  // (one column of y is written by one group, or by every group when y_stride = 0).
  const int64_t last = map.groups - 1;
  call.Need(call.Mul({last, map.x_stride}) + map.x_offset + map.width <= map.x_cols &&
                call.Mul({last, map.y_stride}) + map.y_offset + map.width <= map.y_cols,
            "the copied columns run past the end of a row");
  call.Need(map.groups == 1 || map.y_stride == 0 || map.y_stride >= map.width,
            "groups of y overlap (0 < y_stride < width)");
  call.Need(call.In(0) != call.Out(0), "x and y must be different buffers");
  backend_.CopyColumns(call.Out(0), call.In(0), rows, map, a.accumulate);
}

// ---- cross-entropy --------------------------------------------------------------------------

void RankRunner::RunCrossEntropyMax(const OpCall& call) {
  const int64_t vloc = Last(call.InBuf(0)), rows = call.Div(call.InN(0), vloc);
  call.Output(0, rows);
  backend_.CrossEntropyRowMax(call.Out(0), call.In(0), rows, vloc);
}

void RankRunner::RunCrossEntropySumExp(const OpCall& call) {
  const int64_t vloc = Last(call.InBuf(0)), rows = call.Div(call.InN(0), vloc);
  call.Input(1, rows);
  call.Need(call.OutN(0) == 2 * rows && call.InN(2) == rows, "sizes");
  backend_.CrossEntropySumExp(call.Out(0), call.In(0), call.In(1), call.Ids(2), rows, vloc,
                              call.RowOffset(vloc), program_.model.vocab);
}

void RankRunner::RunCrossEntropyLoss(const OpCall& call) {
  const int64_t rows = call.InN(0);
  call.Input(1, call.Mul({rows, 2}));
  call.Output(0, 1);
  backend_.CrossEntropyLoss(call.Out(0), call.In(0), call.In(1), rows,
                            static_cast<float>(call.Attrs<prog::attrs::CrossEntropyLoss>().scale));
}

void RankRunner::RunCrossEntropyBackward(const OpCall& call) {
  const int64_t vloc = Last(call.InBuf(0)), rows = call.Div(call.InN(0), vloc);
  call.Input(1, rows);
  call.Input(2, call.Mul({rows, 2}));
  call.Input(3, rows);
  call.Output(0, call.InN(0));
  const double grad_scale = call.Attrs<prog::attrs::CrossEntropyBackward>().grad_scale;
  backend_.CrossEntropyBackward(call.Out(0), call.In(0), call.In(1), call.In(2), call.Ids(3), rows,
                                vloc, call.RowOffset(vloc), program_.model.vocab,
                                static_cast<float>(grad_scale));
}

// ---- mixture of experts ---------------------------------------------------------------------

namespace {

host::MoeRouterConfig RouterConfig(int64_t experts, int64_t topk, int64_t score, bool normalize,
                                   std::optional<double> scale) {
  return {.experts = experts,
          .topk = topk,
          .score = static_cast<host::RouterScore>(score),
          .normalize = normalize,
          .scale = static_cast<float>(scale.value_or(1.0))};
}

}  // namespace

void RankRunner::RunMoeRouter(const OpCall& call) {
  const auto a = call.Attrs<prog::attrs::MoeRouter>();
  call.Need(a.topk <= a.experts, "topk exceeds the experts");
  call.Need(a.experts % a.groups == 0, "the groups do not divide the experts");
  call.Need(a.group_topk <= a.groups && a.group_topk <= a.topk,
            "group_topk exceeds the groups or topk");
  call.Need(a.topk <= a.group_topk * (a.experts / a.groups),
            "topk exceeds the experts of the kept groups");
  const int64_t rows = call.Div(call.InN(0), a.experts);
  call.Need(rows * a.experts == call.InN(0), "the logits are not rows of `experts` columns");
  const bool has_bias = call.op.inputs.size() > 1 && call.op.inputs[1] >= 0;
  if (has_bias) call.Input(1, a.experts);
  call.Output(0, call.Mul({rows, a.topk}));
  call.Output(1, call.Mul({rows, a.topk}));
  call.Output(2, call.Mul({rows, a.experts}));
  call.Output(3, a.experts);
  host::MoeRouterConfig config = RouterConfig(a.experts, a.topk, a.score, a.normalize, a.scale);
  config.groups = a.groups;
  config.group_topk = a.group_topk;
  backend_.MoeRouterForward(call.Out(0), call.OutIds(1), call.Out(2), call.Out(3), call.In(0),
                            has_bias ? call.In(1) : nullptr, rows, config);
}

void RankRunner::RunMoeExpertLoad(const OpCall& call) {
  call.Need(call.InN(0) == call.OutN(0), "the counts and the load differ in size");
  backend_.Accumulate(call.Out(0), call.In(0), call.InN(0));
}

void RankRunner::RunMoeExpertBiasUpdate(const OpCall& call) {
  const auto a = call.Attrs<prog::attrs::MoeExpertBiasUpdate>();
  call.Input(0, a.experts);
  call.Input(1, a.experts);
  call.Need(call.op.outputs[0] == call.op.inputs[0] && call.op.outputs[1] == call.op.inputs[1],
            "updates the bias and the load in place");
  backend_.MoeExpertBiasUpdate(call.Out(0), call.Out(1), a.experts, static_cast<float>(a.rate));
}

void RankRunner::RunMoeCapacity(const OpCall& call) {
  const auto a = call.Attrs<prog::attrs::MoeCapacity>();
  const int64_t rows = call.Div(call.InN(0), a.topk);
  call.Need(rows * a.topk == call.InN(0), "the weights are not rows of `topk` columns");
  call.Need(rows % a.segments == 0, "the rows are not `segments` runs of equal length");
  call.Input(1, call.Mul({rows, a.topk}));
  call.Output(0, call.Mul({rows, a.topk}));
  call.Output(1, call.Mul({rows, a.topk}));
  backend_.MoeCapacityForward(call.Out(0), call.Out(1), call.In(0), call.Ids(1), rows, a.experts,
                              a.topk, a.capacity, a.position, a.segments);
}

void RankRunner::RunMoeCapacityBackward(const OpCall& call) {
  const int64_t n = call.InN(0);
  call.Input(1, n);
  call.Output(0, n);
  backend_.MoeCapacityBackward(call.Out(0), call.In(0), call.In(1), n);
}

void RankRunner::RunMoeRouterBackward(const OpCall& call) {
  const auto a = call.Attrs<prog::attrs::MoeRouterBackward>();
  const int64_t rows = call.Div(call.InN(0), a.topk);
  call.Need(a.topk <= a.experts && rows * a.topk == call.InN(0), "sizes");
  call.Input(1, call.Mul({rows, a.topk}));
  call.Input(2, call.Mul({rows, a.experts}));
  call.Input(3, a.experts);
  call.Output(0, call.Mul({rows, a.experts}));
  host::MoeRouterConfig config = RouterConfig(a.experts, a.topk, a.score, a.normalize, a.scale);
  config.aux_coeff = static_cast<float>(a.aux_coeff);
  config.aux_rows = a.aux_rows;
  backend_.MoeRouterBackward(call.Out(0), call.In(0), call.Ids(1), call.In(2), call.In(3), rows,
                             config, static_cast<float>(a.aux_grad_scale));
}

void RankRunner::RunMoePermute(const OpCall& call) {
  const auto a = call.Attrs<prog::attrs::MoePermute>();
  const int64_t pairs = call.InN(1), rows = call.Div(pairs, a.topk);
  const int64_t dim = call.Div(call.InN(0), rows);
  call.Need(rows * a.topk == pairs && rows * dim == call.InN(0), "sizes");
  call.Output(1, pairs);
  call.Output(2, a.experts);
  if (call.op.inputs.size() <= 2 || call.op.inputs[2] < 0) {
    call.Output(0, call.Mul({pairs, dim}));
    backend_.MoePermute(call.Out(0), call.OutIds(1), call.OutIds(2), call.In(0), call.Ids(1), rows,
                        dim, a.experts, a.topk);
    return;
  }
  // Only the kept pairs: y holds as many rows as the capacity allows, not one per pair.
  call.Input(2, pairs);
  const int64_t out_rows = call.Div(call.OutN(0), dim);
  call.Need(out_rows * dim == call.OutN(0), "the permuted rows are not rows of x's width");
  backend_.MoePermuteKept(call.Out(0), call.OutIds(1), call.OutIds(2), call.In(0), call.Ids(1),
                          call.In(2), rows, dim, a.experts, a.topk, out_rows);
  std::vector<int32_t> counts(static_cast<size_t>(a.experts));
  backend_.CopyToHost(counts.data(), call.OutIds(2), a.experts * 4);
  int64_t kept = 0;
  for (int32_t n : counts) kept += n;
  call.Need(kept <= out_rows, std::to_string(kept) + " kept pairs exceed the " +
                                  std::to_string(out_rows) + " rows the permuted buffer reserves");
  if (kept < out_rows) backend_.Fill(call.Out(0) + kept * dim, (out_rows - kept) * dim, 0.0f);
}

// x's rows are those row_map names: one per pair, or fewer when MoePermute dropped pairs.
void RankRunner::RunMoeUnpermute(const OpCall& call) {
  const int64_t topk = call.Attrs<prog::attrs::MoeUnpermute>().topk;
  const int64_t pairs = call.InN(1), rows = call.Div(pairs, topk);
  const int64_t dim = Last(call.OutBuf(0));
  call.Need(rows * topk == pairs && call.InN(0) % std::max<int64_t>(dim, 1) == 0, "sizes");
  const bool weighted = call.op.inputs.size() > 2 && call.op.inputs[2] >= 0;
  if (weighted) call.Input(2, pairs);
  call.Output(0, call.Mul({rows, dim}));
  backend_.MoeUnpermute(call.Out(0), call.In(0), call.Ids(1), weighted ? call.In(2) : nullptr, rows,
                        dim, topk);
}

void RankRunner::RunMoeUnpermuteBackward(const OpCall& call) {
  const int64_t topk = call.Attrs<prog::attrs::MoeUnpermuteBackward>().topk;
  const int64_t pairs = call.InN(2), rows = call.Div(pairs, topk);
  const int64_t dim = call.Div(call.InN(0), rows);
  call.Need(rows * topk == pairs && rows * dim == call.InN(0), "sizes");
  call.Need(call.InN(1) % std::max<int64_t>(dim, 1) == 0 &&
                call.OutN(0) % std::max<int64_t>(dim, 1) == 0 && call.InN(1) <= call.OutN(0),
            "x and dx are not rows of dy's width");
  const bool weighted = call.op.inputs.size() > 3 && call.op.inputs[3] >= 0;
  if (weighted) call.Input(3, pairs);
  call.Output(1, pairs, true);
  backend_.MoeUnpermuteBackward(call.Out(0), call.Out(1), call.In(0), call.In(1), call.Ids(2),
                                weighted ? call.In(3) : nullptr, rows, dim, topk);
}

void RankRunner::RunGroupedLinear(const OpCall& call) {
  const int64_t groups = call.Attrs<prog::attrs::GroupedLinear>().groups;
  const auto& w = call.InBuf(1);
  call.Need(w.shape.size() == 3 && w.shape[0] == groups, "W is not [groups, out, in]");
  const int64_t fan_in = w.shape[2], fan_out = w.shape[1], rows = call.Div(call.InN(0), fan_in);
  call.Input(1, call.Mul({groups, fan_out, fan_in}));
  call.Input(2, groups);
  call.Need(rows * fan_in == call.InN(0), "x is not rows of W's inputs");
  call.Output(0, call.Mul({rows, fan_out}));
  backend_.GroupedLinearForward(call.Out(0), call.In(0), call.In(1), call.Ids(2), groups, fan_in,
                                fan_out);
}

void RankRunner::RunGroupedLinearBackward(const OpCall& call) {
  const auto a = call.Attrs<prog::attrs::GroupedLinearBackward>();
  const auto& w = call.InBuf(2);
  call.Need(w.shape.size() == 3 && w.shape[0] == a.groups, "W is not [groups, out, in]");
  const int64_t fan_in = w.shape[2], fan_out = w.shape[1], rows = call.Div(call.InN(0), fan_out);
  call.Need(rows * fan_out == call.InN(0), "dy is not rows of W's outputs");
  call.Input(1, call.Mul({rows, fan_in}));
  call.Input(2, call.Mul({a.groups, fan_out, fan_in}));
  call.Input(3, a.groups);
  call.Output(0, call.Mul({rows, fan_in}), true);
  call.Output(1, call.Mul({a.groups, fan_out, fan_in}), true);
  backend_.GroupedLinearBackward(call.Out(0), call.Out(1), call.In(0), call.In(1), call.In(2),
                                 call.Ids(3), a.groups, fan_in, fan_out, a.dx_accumulate);
}

// ---- expert parallelism: token dispatch over the Ep group ------------------------------------
// Rank r of the Ep group (size n) holds experts r·L .. (r+1)·L-1, L = experts / n. `split`
// [n, L]: split[s·L + l] rows that peer s sends this rank for its local expert l. Received rows
// are kept in local-expert order (l, then peer s), the order GroupedLinear reads.

namespace {

// The expert layout of one dispatch op, read back to the host: every peer's counts.
struct EpCounts {
  int64_t peers = 1, local = 1;
  std::vector<int32_t> counts;  // [experts]: this rank's rows per global expert
  std::vector<int32_t> split;   // [peers, local]
  int64_t SendRows(int64_t p) const {
    int64_t n = 0;
    for (int64_t l = 0; l < local; ++l) n += counts[p * local + l];
    return n;
  }
  int64_t RecvRows(int64_t s) const {
    int64_t n = 0;
    for (int64_t l = 0; l < local; ++l) n += split[s * local + l];
    return n;
  }
};

}  // namespace

void RankRunner::RunMoeExchangeCounts(const OpCall& call) {
  const int64_t experts = call.Attrs<prog::attrs::MoeExchangeCounts>().experts;
  const Comm& c = CommOf(call.op.comm, "MoeExchangeCounts");
  call.Need(experts % c.size == 0, "experts = " + std::to_string(experts) +
                                       " do not split over an Ep group of " +
                                       std::to_string(c.size));
  const int64_t local = experts / c.size;
  call.Input(0, experts);
  call.Output(0, experts);
  call.Output(1, local);
  // The counts are I32; the all-to-all moves them as 4-byte elements.
  if (c.size == 1)
    backend_.CopyOnDevice(call.Out(0), call.In(0), experts * 4);
  else
    c.comm->AllToAll(call.In(0), call.Out(0), local, comm::DType::kF32);
  std::vector<int32_t> split(static_cast<size_t>(experts)), sums(static_cast<size_t>(local), 0);
  backend_.CopyToHost(split.data(), call.Out(0), experts * 4);
  for (int64_t s = 0; s < c.size; ++s)
    for (int64_t l = 0; l < local; ++l) sums[l] += split[s * local + l];
  backend_.CopyToDevice(call.OutIds(1), sums.data(), local * 4);
}

namespace {

// Reads counts and split (inputs 1 and 2 of MoeDispatch / MoeCombine) to the host.
template <typename Call, typename Backend>
EpCounts ReadEpCounts(const Call& call, Backend& backend, int64_t experts, int64_t peers) {
  call.Need(experts % peers == 0, "experts = " + std::to_string(experts) +
                                      " do not split over an Ep group of " + std::to_string(peers));
  EpCounts e;
  e.peers = peers;
  e.local = experts / peers;
  call.Input(1, experts);
  call.Input(2, experts);
  e.counts.resize(static_cast<size_t>(experts));
  e.split.resize(static_cast<size_t>(experts));
  backend.CopyToHost(e.counts.data(), call.Ids(1), experts * 4);
  backend.CopyToHost(e.split.data(), call.Ids(2), experts * 4);
  for (size_t i = 0; i < e.counts.size(); ++i)
    call.Need(e.counts[i] >= 0 && e.split[i] >= 0, "a negative row count");
  return e;
}

// Elements each Ep peer is sent and sends back: the dispatch's rows, or (`back`) the combine's,
// which return them.
struct EpTransfer {
  std::vector<int64_t> send, recv;
  int64_t sent = 0, received = 0;
};
template <typename Call>
EpTransfer EpTransferOf(const Call& call, const EpCounts& e, int64_t peers, int64_t dim,
                        bool back) {
  EpTransfer t;
  t.send.resize(static_cast<size_t>(peers));
  t.recv.resize(static_cast<size_t>(peers));
  for (int64_t p = 0; p < peers; ++p) {
    t.send[p] = call.Mul({back ? e.RecvRows(p) : e.SendRows(p), dim});
    t.recv[p] = call.Mul({back ? e.SendRows(p) : e.RecvRows(p), dim});
    t.sent += t.send[p];
    t.received += t.recv[p];
  }
  return t;
}

}  // namespace

void RankRunner::RunMoeDispatch(const OpCall& call) {
  const int64_t experts = call.Attrs<prog::attrs::MoeDispatch>().experts;
  const Comm& c = CommOf(call.op.comm, "MoeDispatch");
  const EpCounts e = ReadEpCounts(call, backend_, experts, c.size);
  const int64_t dim = Last(call.OutBuf(0));
  const auto [send, recv, sent, received] = EpTransferOf(call, e, c.size, dim, false);
  call.Input(0, sent);
  if (received > call.OutN(0)) {
    // The reserve is the plan's moe.imbalance times the balanced load (or the capacity bound).
    char more[32];
    std::snprintf(
        more, sizeof more, "%.2f",
        static_cast<double>(received) / static_cast<double>(std::max<int64_t>(call.OutN(0), 1)));
    call.Need(false, std::to_string(received / std::max<int64_t>(dim, 1)) +
                         " rows routed to this rank's experts exceed the " +
                         std::to_string(call.OutN(0) / std::max<int64_t>(dim, 1)) +
                         " rows its receive buffer reserves: the routing is more imbalanced than "
                         "the plan's moe.imbalance states (this step needed " +
                         more +
                         " times it); compile with a larger moe.imbalance, or with a "
                         "moe.capacity_factor, which bounds the rows an expert receives");
  }
  // Received in peer order, then moved into local-expert order.
  float* staged = Scratch(0, std::max<int64_t>(received, 1));
  if (c.size == 1)
    backend_.Copy(staged, call.In(0), sent);
  else
    c.comm->AllToAllV(call.In(0), send.data(), staged, recv.data(), comm::DType::kF32);
  float* y = call.Out(0);
  int64_t at = 0;
  for (int64_t l = 0; l < e.local; ++l) {
    for (int64_t s = 0, from = 0; s < c.size; from += recv[s], ++s) {
      int64_t before = 0;
      for (int64_t k = 0; k < l; ++k) before += e.split[s * e.local + k];
      const int64_t n = e.split[s * e.local + l] * dim;
      if (n > 0) backend_.Copy(y + at, staged + from + before * dim, n);
      at += n;
    }
  }
  if (at < call.OutN(0)) backend_.Fill(y + at, call.OutN(0) - at, 0.0f);  // rows nobody sent
}

void RankRunner::RunMoeCombine(const OpCall& call) {
  const int64_t experts = call.Attrs<prog::attrs::MoeCombine>().experts;
  const Comm& c = CommOf(call.op.comm, "MoeCombine");
  const EpCounts e = ReadEpCounts(call, backend_, experts, c.size);
  const int64_t dim = Last(call.InBuf(0));
  // Back to where the dispatch's rows came from.
  const auto [send, recv, sent, received] = EpTransferOf(call, e, c.size, dim, true);
  call.Input(0, sent);
  call.Output(0, received);
  // From local-expert order (l, then peer s) into peer order (s, then l), then sent back.
  float* staged = Scratch(0, std::max<int64_t>(sent, 1));
  const float* x = call.In(0);
  std::vector<int64_t> from(static_cast<size_t>(c.size), 0);
  for (int64_t s = 1; s < c.size; ++s) from[s] = from[s - 1] + send[s - 1];
  int64_t at = 0;
  for (int64_t l = 0; l < e.local; ++l) {
    for (int64_t s = 0; s < c.size; ++s) {
      const int64_t n = e.split[s * e.local + l] * dim;
      if (n > 0) backend_.Copy(staged + from[s], x + at, n);
      from[s] += n;
      at += n;
    }
  }
  if (c.size == 1)
    backend_.Copy(call.Out(0), staged, sent);
  else
    c.comm->AllToAllV(staged, send.data(), call.Out(0), recv.data(), comm::DType::kF32);
}

// ---- end mixture of experts -----------------------------------------------------------------

}  // namespace paraplan::exec
