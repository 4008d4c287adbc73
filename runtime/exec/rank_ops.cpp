// RankRunner::RunOp: the body ops of runtime/format/README.md section 4, one case each.
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>

#include "runtime/exec/rank_runner.h"
#include "runtime/format/checked_size.h"

namespace paraplan::exec {
namespace {

int64_t Last(const prog::mem::Buffer& b) { return b.shape.empty() ? 1 : b.shape.back(); }
int64_t First(const prog::mem::Buffer& b) { return b.shape.empty() ? 1 : b.shape.front(); }

}  // namespace

void RankRunner::RunOp(const prog::mem::Op& op, const Context& ctx, const std::string& body) {
  const auto& bufs = role_.buffers;
  auto in = [&](size_t i) { return F(op.inputs[i], ctx); };
  auto out = [&](size_t i) { return i < op.outputs.size() ? F(op.outputs[i], ctx) : nullptr; };
  auto n_in = [&](size_t i) { return Elements(op.inputs[i]); };
  auto fail = [&](const std::string& what) {
    return RunError(prog::EnumNameOpKind(op.kind) + std::string(" in body `") + body +
                    "` of role `" + role_.name + "`: " + what);
  };
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw fail(what);
  };
  // Sizes come from the program file: products are checked (a hostile attribute near 2^62 must
  // not wrap into a size that passes), and a divisor must be positive.
  auto mul = [&](std::initializer_list<int64_t> factors) {
    const std::optional<int64_t> r = CheckedProduct(factors);
    if (!r) throw fail("operand sizes overflow 64 bits");
    return *r;
  };
  auto div = [&](int64_t a, int64_t b) {
    if (b <= 0) throw fail("a dimension of " + std::to_string(b) + " elements");
    return a / b;
  };
  // Every operand a kernel reads or writes holds at least the elements it touches. The decoder
  // checked that operand indices name buffers or -1; -1 (no buffer) is accepted only where the
  // kernel takes a null pointer (`optional`).
  auto operand = [&](bool output, size_t i, int64_t n, bool optional) {
    const auto& list = output ? op.outputs : op.inputs;
    if (i >= list.size() || list[i] < 0) {
      need(optional,
           std::string(output ? "output " : "input ") + std::to_string(i) + " names no buffer");
      return;
    }
    need(Elements(list[i]) >= n, std::string(output ? "output " : "input ") + std::to_string(i) +
                                     " `" + bufs[list[i]].name + "` holds " +
                                     std::to_string(Elements(list[i])) +
                                     " elements; the op touches " + std::to_string(n));
  };
  auto input = [&](size_t i, int64_t n) { operand(false, i, n, false); };
  auto output = [&](size_t i, int64_t n, bool optional = false) { operand(true, i, n, optional); };
  {  // the operands every case below reads without checking: all inputs, and named outputs
    auto [nin, nout] = std::pair<size_t, size_t>{op.inputs.size(), op.outputs.size()};
    // The optimizer ops take -1 for the moments and the norm they do not use (checked there).
    const bool optimizer =
        op.kind == OpKind::AdamW || op.kind == OpKind::Sgd || op.kind == OpKind::GradNormSquare;
    for (size_t i = 0; i < nin && !optimizer; ++i) {
      const bool optional_bias = op.kind == OpKind::Linear && i == 2;
      if (!optional_bias) input(i, 0);
    }
    (void)nout;
  }
  const auto& model = program_.model;
  // Row offset of `op.comm` for a buffer with `rows` rows (0 without a communicator).
  auto row_offset = [&](int64_t rows) -> int64_t {
    if (op.comm == CommKind::None) return 0;
    return static_cast<int64_t>(comms_[static_cast<int>(op.comm)].index) * rows;
  };
  // dx_accumulate: compute into scratch, then add.
  auto grad_target = [&](float* dx, int64_t n, bool accumulate) -> float* {
    if (!accumulate || !dx) return dx;
    return Scratch(1, n);
  };
  auto grad_finish = [&](float* dx, int64_t n, bool accumulate) {
    if (accumulate && dx) backend_.Accumulate(dx, scratch_[1], n);
  };

  switch (op.kind) {
    case OpKind::AllReduce:
    case OpKind::ReduceScatter:
    case OpKind::AllGather:
    case OpKind::Broadcast:
      RunCollective(op, ctx);
      return;
    case OpKind::GradNormSquare:
    case OpKind::AdamW:
    case OpKind::Sgd:
      RunOptimizer(op, ctx);
      return;

    case OpKind::LoadBatch: {
      const int64_t t = mul({model.micro_batch, model.seq_len});
      output(0, 0);
      need(Elements(op.outputs[0]) == t, "the token buffer holds " +
                                             std::to_string(Elements(op.outputs[0])) +
                                             " ids, a microbatch has " + std::to_string(t));
      tokens_in_.resize(t);
      tokens_out_.resize(t);
      sampler_->Microbatch(ctx.step, RankInfo().coords.dp, ctx.microbatch, tokens_in_.data(),
                           tokens_out_.data());
      backend_.CopyToDevice(I(op.outputs[0], ctx),
                            op.Int(0, 0) == 1 ? tokens_out_.data() : tokens_in_.data(), t * 4);
      return;
    }
    case OpKind::Fill: {
      const float value = static_cast<float>(op.Float(0));
      for (int32_t o : op.outputs) {
        if (o < 0) continue;
        for (int32_t s = 0; s < bufs[o].slots; ++s) {
          backend_.Fill(F(o, Context{ctx.step, ctx.microbatch, s}), Elements(o), value);
        }
      }
      return;
    }
    case OpKind::Copy:
      output(0, 0);
      need(n_in(0) == Elements(op.outputs[0]), "sizes differ");
      backend_.Copy(out(0), in(0), n_in(0));
      return;

    case OpKind::Embedding: {
      const auto& w = bufs[op.inputs[1]];
      const int64_t h = Last(w), vloc = First(w), t = n_in(0);
      input(1, mul({vloc, h}));
      output(0, 0);
      need(Elements(op.outputs[0]) == mul({t, h}), "output size");
      backend_.EmbeddingForward(out(0), I(op.inputs[0], ctx), in(1), t, h, row_offset(vloc), vloc);
      return;
    }
    case OpKind::EmbeddingBackward: {
      output(0, 0);
      const auto& dw = bufs[op.outputs[0]];
      const int64_t h = Last(dw), vloc = First(dw), t = n_in(1);
      output(0, mul({vloc, h}));
      need(n_in(0) == mul({t, h}), "gradient size");
      backend_.EmbeddingBackward(out(0), in(0), I(op.inputs[1], ctx), t, h, row_offset(vloc), vloc);
      return;
    }
    case OpKind::AddPosition: {
      const auto& p = bufs[op.inputs[1]];
      const int64_t h = Last(p), seq = First(p), rows = div(n_in(0), h);
      input(1, mul({seq, h}));
      output(0, 0);
      need(Elements(op.outputs[0]) == n_in(0) && seq > 0, "sizes");
      backend_.AddPosition(out(0), in(0), in(1), rows, h, row_offset(rows), seq);
      return;
    }
    case OpKind::AddPositionBackward: {
      output(0, 0);
      const auto& p = bufs[op.outputs[0]];
      const int64_t h = Last(p), seq = First(p), rows = div(n_in(0), h);
      need(seq > 0, "sizes");
      output(0, mul({seq, h}));
      backend_.AddPositionBackward(out(0), in(0), rows, h, row_offset(rows), seq);
      return;
    }
    case OpKind::RmsNorm: {
      const int64_t h = n_in(1), rows = div(n_in(0), h);
      output(0, 0);
      output(1, 0);
      need(Elements(op.outputs[1]) == rows && Elements(op.outputs[0]) == n_in(0), "sizes");
      backend_.RmsNormForward(out(0), out(1), in(0), in(1), rows, h,
                              static_cast<float>(op.Float(0, model.norm_eps)));
      return;
    }
    case OpKind::RmsNormBackward: {
      const int64_t h = n_in(2), rows = div(n_in(1), h);
      input(0, rows * h);
      input(3, rows);
      output(0, rows * h, true);
      output(1, h, true);
      const bool acc = op.Int(0, 0) == 1;
      float* dx = grad_target(out(0), rows * h, acc);
      backend_.RmsNormBackward(dx, out(1), in(0), in(1), in(2), in(3), rows, h);
      grad_finish(out(0), rows * h, acc);
      return;
    }
    case OpKind::LayerNorm: {
      const int64_t h = n_in(1), rows = div(n_in(0), h);
      input(2, h);
      output(0, rows * h);
      output(1, rows);
      output(2, rows);
      need(op.outputs.size() >= 3 && Elements(op.outputs[1]) == rows, "sizes");
      backend_.LayerNormForward(out(0), out(1), out(2), in(0), in(1), in(2), rows, h,
                                static_cast<float>(op.Float(0, model.norm_eps)));
      return;
    }
    case OpKind::LayerNormBackward: {
      const int64_t h = n_in(2), rows = div(n_in(1), h);
      input(0, rows * h);
      input(3, rows);
      input(4, rows);
      output(0, rows * h, true);
      output(1, h, true);
      output(2, h, true);
      const bool acc = op.Int(0, 0) == 1;
      float* dx = grad_target(out(0), rows * h, acc);
      backend_.LayerNormBackward(dx, out(1), out(2), in(0), in(1), in(2), in(3), in(4), rows, h);
      grad_finish(out(0), rows * h, acc);
      return;
    }
    case OpKind::Linear: {
      const auto& w = bufs[op.inputs[1]];
      const int64_t fan_in = Last(w), fan_out = First(w), rows = div(n_in(0), fan_in);
      input(1, mul({fan_in, fan_out}));
      if (op.inputs.size() > 2 && op.inputs[2] >= 0) input(2, fan_out);
      output(0, 0);
      need(rows * fan_in == n_in(0) && Elements(op.outputs[0]) == mul({rows, fan_out}),
           "x has " + std::to_string(n_in(0)) + " elements, W is " + std::to_string(fan_out) + "x" +
               std::to_string(fan_in) + ", y has " + std::to_string(Elements(op.outputs[0])));
      const float* bias = op.inputs.size() > 2 && op.inputs[2] >= 0 ? in(2) : nullptr;
      backend_.LinearForward(out(0), in(0), in(1), bias, rows, fan_in, fan_out);
      return;
    }
    case OpKind::LinearBackward: {
      const auto& w = bufs[op.inputs[2]];
      const int64_t fan_in = Last(w), fan_out = First(w), rows = div(n_in(0), fan_out);
      input(2, mul({fan_in, fan_out}));
      output(0, mul({rows, fan_in}), true);
      output(1, mul({fan_in, fan_out}), true);
      output(2, fan_out, true);
      need(rows * fan_out == n_in(0) && n_in(1) == mul({rows, fan_in}), "sizes");
      float* db = op.outputs.size() > 2 ? out(2) : nullptr;
      backend_.LinearBackward(out(0), out(1), db, in(0), in(1), in(2), rows, fan_in, fan_out,
                              op.Int(0, 0) == 1);
      return;
    }
    case OpKind::AddBias: {
      const int64_t n = n_in(1), rows = div(n_in(0), n);
      output(0, n_in(0));
      float* y = out(0);
      if (y != in(0)) backend_.Copy(y, in(0), n_in(0));
      for (int64_t r = 0; r < rows; ++r) backend_.Accumulate(y + r * n, in(1), n);
      return;
    }
    case OpKind::AddBiasBackward: {
      output(0, 0);
      const int64_t n = Elements(op.outputs[0]), rows = div(n_in(0), n);
      for (int64_t r = 0; r < rows; ++r) backend_.Accumulate(out(0), in(0) + r * n, n);
      return;
    }
    case OpKind::Rope:
    case OpKind::RopeBackward: {
      const int64_t heads = op.Int(0, 0), hd = op.Int(1, 0);
      need(heads > 0 && hd > 0 && hd % 2 == 0,
           "rope with " + std::to_string(heads) + " heads of " + std::to_string(hd));
      const int64_t rows = div(n_in(0), mul({heads, hd}));
      need(rows * heads * hd == n_in(0) && rows % model.seq_len == 0,
           "rope over " + std::to_string(n_in(0)) + " elements with " + std::to_string(heads) +
               " heads of " + std::to_string(hd));
      output(0, n_in(0));
      float* y = out(0);
      if (y != in(0)) backend_.Copy(y, in(0), n_in(0));
      const auto layout = host::TokenLayout::BatchMajor(model.seq_len, rows / model.seq_len);
      const float theta = static_cast<float>(op.Float(0, model.rope_theta));
      if (op.kind == OpKind::Rope)
        backend_.RopeForward(y, layout, heads, hd, theta);
      else
        backend_.RopeBackward(y, layout, heads, hd, theta);
      return;
    }
    case OpKind::Attention:
    case OpKind::AttentionBackward: {
      const int64_t micro = op.Int(0, 0), seq = op.Int(1, 0), heads = op.Int(2, 0),
                    groups = op.Int(3, 0), hd = op.Int(4, 0);
      need(micro > 0 && seq > 0 && heads > 0 && groups > 0 && heads % groups == 0 && hd > 0,
           "bad attention shape");
      const auto layout = host::TokenLayout::BatchMajor(seq, micro);
      const float scale = static_cast<float>(op.Float(0, 1.0 / std::sqrt(static_cast<double>(hd))));
      const int64_t t = mul({micro, seq}), q_elements = mul({t, heads, hd}),
                    kv_elements = mul({t, groups, hd});
      if (op.kind == OpKind::Attention) {
        output(0, q_elements);
        output(1, 0);
        need(n_in(0) == q_elements && n_in(1) == kv_elements && n_in(2) == kv_elements &&
                 Elements(op.outputs[1]) == mul({micro, heads, seq}),
             "operand sizes do not match [micro, seq, H, G, hd]");
        backend_.AttentionForward(out(0), out(1), in(0), in(1), in(2), layout, heads, groups, hd,
                                  scale);
      } else {
        input(1, q_elements);
        input(2, kv_elements);
        input(3, kv_elements);
        input(4, q_elements);
        input(5, mul({micro, heads, seq}));
        output(0, q_elements);
        output(1, 0);
        output(2, kv_elements);
        need(n_in(0) == q_elements && n_in(2) == kv_elements &&
                 Elements(op.outputs[1]) == kv_elements,
             "operand sizes do not match [micro, seq, H, G, hd]");
        backend_.AttentionBackward(out(0), out(1), out(2), in(0), in(4), in(5), in(1), in(2), in(3),
                                   layout, heads, groups, hd, scale);
      }
      return;
    }
    case OpKind::SwiGlu:
      need(n_in(0) == n_in(1), "gate and up sizes differ");
      output(0, n_in(0));
      backend_.SwiGluForward(out(0), in(0), in(1), n_in(0));
      return;
    case OpKind::SwiGluBackward:
      input(1, n_in(0));
      input(2, n_in(0));
      output(0, n_in(0), true);
      output(1, n_in(0));
      backend_.SwiGluBackward(out(0), out(1), in(0), in(1), in(2), n_in(0));
      return;
    case OpKind::Gelu:
      output(0, n_in(0));
      backend_.GeluForward(out(0), in(0), n_in(0));
      return;
    case OpKind::GeluBackward:
      input(1, n_in(0));
      output(0, n_in(0));
      backend_.GeluBackward(out(0), in(0), in(1), n_in(0));
      return;
    case OpKind::Add:
      output(0, 0);
      need(n_in(0) == n_in(1) && Elements(op.outputs[0]) == n_in(0), "sizes differ");
      backend_.Add(out(0), in(0), in(1), n_in(0));
      return;
    case OpKind::CrossEntropyMax: {
      const int64_t vloc = Last(bufs[op.inputs[0]]), rows = div(n_in(0), vloc);
      output(0, rows);
      backend_.CrossEntropyRowMax(out(0), in(0), rows, vloc);
      return;
    }
    case OpKind::CrossEntropySumExp: {
      const int64_t vloc = Last(bufs[op.inputs[0]]), rows = div(n_in(0), vloc);
      input(1, rows);
      output(0, 0);
      need(Elements(op.outputs[0]) == 2 * rows && n_in(2) == rows, "sizes");
      backend_.CrossEntropySumExp(out(0), in(0), in(1), I(op.inputs[2], ctx), rows, vloc,
                                  row_offset(vloc), model.vocab);
      return;
    }
    case OpKind::CrossEntropyLoss: {
      const int64_t rows = n_in(0);
      input(1, mul({rows, 2}));
      output(0, 1);
      backend_.CrossEntropyLoss(out(0), in(0), in(1), rows, static_cast<float>(op.Float(0, 1.0)));
      return;
    }
    case OpKind::CrossEntropyBackward: {
      const int64_t vloc = Last(bufs[op.inputs[0]]), rows = div(n_in(0), vloc);
      input(1, rows);
      input(2, mul({rows, 2}));
      input(3, rows);
      output(0, n_in(0));
      backend_.CrossEntropyBackward(out(0), in(0), in(1), in(2), I(op.inputs[3], ctx), rows, vloc,
                                    row_offset(vloc), model.vocab,
                                    static_cast<float>(op.Float(0, 1.0)));
      return;
    }
    default:
      throw fail("not supported by this runtime");
  }
}

}  // namespace paraplan::exec
