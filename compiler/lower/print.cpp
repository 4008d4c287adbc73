// Text dumps (see print.h).
#include "compiler/lower/print.h"

#include <fmt/format.h>

#include <map>

#include "compiler/lower/memory_plan.h"
#include "runtime/format/ops.h"
#include "runtime/verify/verify.h"

namespace paraplan::lower {

namespace {

std::string Bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string ShortSchedule(const Role& role) {
  std::string out;
  for (const Op& op : prog::mem::ScheduleOps(role)) {
    std::string t;
    const prog::StepAttrs s = prog::DecodeStepAttrs(op);
    switch (op.kind) {
      case OpKind::Forward:
        t = fmt::format("F{}{}", s.microbatch, std::string(s.chunk, '\''));
        break;
      case OpKind::Backward:
        t = fmt::format("B{}{}", s.microbatch, std::string(s.chunk, '\''));
        break;
      case OpKind::SendActivation:
        t = fmt::format("sa{}", s.microbatch);
        break;
      case OpKind::RecvActivation:
        t = fmt::format("ra{}", s.microbatch);
        break;
      case OpKind::SendGrad:
        t = fmt::format("sg{}", s.microbatch);
        break;
      case OpKind::RecvGrad:
        t = fmt::format("rg{}", s.microbatch);
        break;
      case OpKind::GatherParams:
      case OpKind::ReleaseParams:
        continue;
      default:
        t = std::string(OpName(op.kind));
        break;
    }
    out += (out.empty() ? "" : " ") + t;
  }
  return out;
}

}  // namespace

std::string PrintOp(const Role& role, const Op& op) {
  auto names = [&](const std::vector<int32_t>& v) {
    std::string s;
    for (int32_t b : v)
      s += (s.empty() ? "" : ", ") +
           (b >= 0 && b < static_cast<int32_t>(role.buffers.size()) ? role.buffers[b].name : "?");
    return s;
  };
  std::string out = fmt::format("{}({})", OpName(op.kind), names(op.inputs));
  if (!op.outputs.empty()) out += " -> " + names(op.outputs);
  if (op.comm != CommKind::None) out += fmt::format(" [{}]", CommName(op.comm));
  if (prog::FindOp(op.kind)) {  // attributes by the registry's names: "what=labels"
    if (std::string attrs = prog::FormatAttrs(op); !attrs.empty()) out += " " + attrs;
    return out;
  }
  if (!op.ints.empty()) out += fmt::format(" ints={}", Shape(op.ints));
  if (!op.floats.empty()) {
    out += " floats=[";
    for (size_t i = 0; i < op.floats.size(); ++i)
      out += fmt::format("{}{:g}", i ? ", " : "", op.floats[i]);
    out += "]";
  }
  return out;
}

std::string PrintProgram(const Program& p) {
  std::string out;
  const ModelConfig& m = p.model;
  const ParallelConfig& q = p.parallel;
  out += fmt::format("program '{}' (format {}, {}), world size {}\n", p.plan_name, p.format_version,
                     p.producer, p.world_size);
  out += fmt::format(
      "model {}: layers {}, hidden {}, ffn {}, heads {}/{} kv, head_dim {}, vocab {} (padded {}), "
      "seq {}, micro {}, {} {} {}{}{}\n",
      m.name, m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.head_dim, m.vocab,
      m.vocab_padded, m.seq_len, m.micro_batch, prog::EnumNameNormKind(m.norm),
      prog::EnumNameActivationKind(m.activation), prog::EnumNamePositionKind(m.position),
      m.tied_embeddings ? " tied" : "", m.qk_norm ? " qk_norm" : "");
  if (m.kv_lora_rank > 0)
    out += fmt::format(
        "latent attention: q_lora_rank {}, kv_lora_rank {}, qk_nope {}, qk_rope {}, v {}\n",
        m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
  if (m.mtp_layers > 0)
    out += fmt::format("multi-token prediction: {} modules, loss weight {}\n", m.mtp_layers,
                       m.mtp_loss_scale);
  out += fmt::format(
      "parallel tp {} pp {} vpp {} cp {} ep {} dp {} sp {} zero {} schedule {} order {}\n", q.tp,
      q.pp, q.vpp, q.cp, q.ep, q.dp, q.sp, q.zero, prog::EnumNameScheduleKind(q.schedule), q.order);
  const TrainConfig& t = p.train;
  out += fmt::format(
      "train steps {} seed {} global {} microbatches {} precision {} {} lr {:g} (min {:g}, warmup "
      "{}) wd {:g} betas {:g} {:g} eps {:g} clip {:g}\n",
      t.steps, t.seed, t.global_batch, t.microbatches, prog::EnumNamePrecision(t.precision),
      t.optimizer, t.lr, t.min_lr, t.warmup_steps, t.weight_decay, t.beta1, t.beta2, t.eps,
      t.clip_grad);
  std::map<std::string_view, int> counts;
  for (const Communicator& c : p.communicators) counts[CommName(c.kind)]++;
  out += "communicators:";
  for (const auto& [k, n] : counts) out += fmt::format(" {} x{}", k, n);
  out += "\n";
  for (size_t ri = 0; ri < p.roles.size(); ++ri) {
    const Role& r = p.roles[ri];
    const size_t schedule_ops =
        r.loops.empty() ? r.schedule.size() + r.steps.size() : prog::mem::ScheduleOps(r).size();
    int64_t ranks = 0;
    for (const Rank& rank : p.ranks) ranks += rank.role == static_cast<int32_t>(ri);
    out += fmt::format(
        "role {} (pipeline rank {}, {} ranks): {} buffers, {} params, {} bodies, {} schedule ops; "
        "arena {} ({} f32), peak {}\n",
        r.name, r.pipeline_rank, ranks, r.buffers.size(), r.params.size(), r.bodies.size(),
        schedule_ops, Bytes(r.arena_bytes), Bytes(r.fp32_arena_bytes), Bytes(r.peak_bytes));
    const MemoryBreakdown m = MeasureMemory(r);
    out +=
        fmt::format("  memory: params {}, grads {}, optimizer {}, other {}, stash {}, scratch {}",
                    Bytes(m.params), Bytes(m.grads), Bytes(m.optimizer), Bytes(m.other),
                    Bytes(m.stash), Bytes(m.scratch));
    if (m.gathered_params > 0) out += fmt::format(", gathered params {}", Bytes(m.gathered_params));
    if (m.full_grads > 0) out += fmt::format(", full grads {}", Bytes(m.full_grads));
    out += "\n";
    for (const Chunk& c : r.chunks)
      out += fmt::format("  chunk {} (stage {}): layers [{}, {}){}{}, {} slots{}\n", c.index,
                         c.stage, c.first_layer, c.first_layer + c.layers,
                         c.has_embedding ? " +embedding" : "", c.has_loss ? " +loss" : "", c.slots,
                         c.pool >= 0 ? fmt::format(" (pool {})", c.pool) : "");
    out += "  schedule: " + ShortSchedule(r) + "\n";
  }
  return out;
}

std::string PrintRank(const Program& p, int32_t rank) {
  const Rank& rk = p.ranks[rank];
  const Role& r = p.roles[rk.role];
  std::string out =
      fmt::format("rank {}: role {}, coordinates tp {} cp {} ep {} dp {} pp {}\n", rank, r.name,
                  rk.coords.tp, rk.coords.cp, rk.coords.ep, rk.coords.dp, rk.coords.pp);
  for (int k = 1; k < prog::kCommKinds; ++k) {
    int32_t c = rk.comms[k];
    if (c < 0) continue;
    out += fmt::format("  {} communicator {}: {}\n", CommName(static_cast<CommKind>(k)), c,
                       Shape(std::vector<int64_t>(p.communicators[c].members.begin(),
                                                  p.communicators[c].members.end())));
  }
  const std::vector<Op> schedule = prog::mem::ScheduleOps(r);
  out += fmt::format("schedule ({} ops):\n", schedule.size());
  for (size_t i = 0; i < schedule.size(); ++i) {
    const Op& op = schedule[i];
    std::string line = DescribeOp(op);
    const prog::StepAttrs s = prog::DecodeStepAttrs(op);
    if (IsP2p(op.kind))
      line = fmt::format("{}(microbatch {}, chunk {}, slot {}, peer rank {}{})", OpName(op.kind),
                         s.microbatch, s.chunk, s.slot, p.MemberOf(rank, CommKind::Pp, s.peer),
                         s.group ? fmt::format(", group {}", s.group) : "");
    else if (op.kind == OpKind::Forward || op.kind == OpKind::Backward)
      line = fmt::format("{}(microbatch {}, chunk {}, slot {})", OpName(op.kind), s.microbatch,
                         s.chunk, s.slot);
    out += fmt::format("  #{} {}\n", i, line);
  }
  out += "buffers:\n";
  for (const Buffer& b : r.buffers)
    out += fmt::format("  {} {} {} {} @{} {}{}\n", b.name, prog::EnumNameBufferKind(b.kind),
                       prog::EnumNameDType(b.dtype), Shape(b.shape), b.offset, Bytes(b.bytes),
                       b.slots > 1 ? fmt::format(" x{} slots", b.slots) : "");
  for (const Body& body : r.bodies) {
    out += fmt::format("body {} ({} ops):\n", body.name, body.ops.size());
    for (const Op& op : body.ops) out += "  " + PrintOp(r, op) + "\n";
  }
  return out;
}

}  // namespace paraplan::lower
