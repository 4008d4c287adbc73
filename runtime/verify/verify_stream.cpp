// The verifier's stream model (verify_stream.h): reading schedule ops, the landing-buffer rule,
// and WorldVerifier's building of each role's stream (verify_world.h).
#include "runtime/verify/verify_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "runtime/format/ops.h"
#include "runtime/format/program_model.h"
#include "runtime/verify/verify_world.h"

namespace paraplan::verify::detail {

StepView ViewOf(const prog::ScheduleStep& s) {
  StepView v;
  v.kind = s.kind();
  v.comm = s.comm();
  const bool p2p = IsP2p(v.kind);
  if (p2p || v.kind == OpKind::Forward || v.kind == OpKind::Backward) {
    v.microbatch = s.microbatch(), v.chunk = s.chunk(), v.slot = s.slot();
    if (p2p) v.peer = s.peer(), v.group = s.group(), v.operand = s.operand(), v.one_operand = true;
  }
  if (v.kind == OpKind::ZeroGrads || v.kind == OpKind::ReduceGrads ||
      v.kind == OpKind::OptimizerStep || v.kind == OpKind::GatherParams)
    v.body = s.operand();
  return v;
}

StepView ViewOf(const Op& op) {
  StepView v;
  const prog::StepAttrs a = prog::DecodeStepAttrs(op);
  v.kind = op.kind;
  v.comm = op.comm;
  v.microbatch = a.microbatch, v.chunk = a.chunk, v.slot = a.slot, v.peer = a.peer,
  v.group = a.group;
  v.body = prog::StepBody(op);
  if (IsP2p(op.kind)) {
    const auto& operands = IsSend(op.kind) ? op.inputs : op.outputs;
    v.operand = operands.empty() ? -1 : operands[0];
    v.one_operand = operands.size() == 1;
  }
  return v;
}

StepView StepAt(const Role& role, size_t i) {
  return role.steps.empty() ? ViewOf(role.schedule[i]) : ViewOf(role.steps[i]);
}

std::string DescribeStep(const StepView& s) {
  switch (s.kind) {
    case OpKind::Forward:
    case OpKind::Backward:
      return fmt::format("{}(microbatch {}, chunk {})", OpName(s.kind), s.microbatch, s.chunk);
    case OpKind::SendActivation:
    case OpKind::RecvActivation:
    case OpKind::SendGrad:
    case OpKind::RecvGrad:
      return fmt::format("{}(microbatch {}, chunk {}, peer {})", OpName(s.kind), s.microbatch,
                         s.chunk, s.peer);
    default:
      return std::string(OpName(s.kind));
  }
}

// --- context parallelism ---
bool IsGroupCall(const Op& op) {
  return IsCollective(op.kind) ||
         ((op.kind == OpKind::RingAttention || op.kind == OpKind::RingAttentionBackward) &&
          op.comm == CommKind::Cp);
}
// --- end context parallelism ---

int64_t CollectiveArgument(const Op& op) {
  switch (op.kind) {
    case OpKind::AllReduce:
      return static_cast<int64_t>(prog::DecodeAttrs<prog::attrs::AllReduce>(op).reduce_op);
    case OpKind::ReduceScatter:
      return static_cast<int64_t>(prog::DecodeAttrs<prog::attrs::ReduceScatter>(op).reduce_op);
    case OpKind::Broadcast:
      return prog::DecodeAttrs<prog::attrs::Broadcast>(op).root;
    default:
      return -1;
  }
}

StepView StepOf(const Role& role, const RoleStream::At& a) {
  StepView v = StepAt(role, static_cast<size_t>(a.item->schedule_op));
  if (a.iteration > 0 && v.microbatch >= 0) {
    v.microbatch += a.iteration * a.seg->microbatch_stride;
    const int32_t slots = v.chunk >= 0 && v.chunk < static_cast<int64_t>(role.chunks.size())
                              ? role.chunks[static_cast<size_t>(v.chunk)].slots
                              : 1;
    if (slots > 0) v.slot = (v.slot + a.iteration * a.seg->slot_stride) % slots;
  }
  return v;
}

const Op& OpOf(const Role& role, const Item& it) {
  return role.bodies[StepAt(role, it.schedule_op).body].ops[it.body_op];
}

int64_t ItemBytes(const Role& role, const Item& it) {
  if (it.type == ItemType::kP2p) {
    const int32_t b = StepAt(role, it.schedule_op).operand;
    return b < 0 ? 0 : role.buffers[b].bytes;
  }
  if (it.type != ItemType::kCollective) return 0;
  const Op& op = OpOf(role, it);
  return op.inputs.empty() ? 0 : role.buffers[op.inputs[0]].bytes;
}

std::string LandingTracker::Step(const StepView& op) {
  const auto c = static_cast<size_t>(op.chunk);
  if (buffer_[c] < 0) return {};
  std::string error;
  if (op.kind == OpKind::Forward) {
    if (landed_[c] != op.microbatch)
      error = landed_[c] < 0
                  ? "the chunk's landing buffer holds no received activation"
                  : fmt::format("the chunk's landing buffer holds microbatch {}", landed_[c]);
    landed_[c] = -1;
  } else if (op.kind == OpKind::RecvActivation) {
    if (landed_[c] >= 0)
      error = fmt::format(
          "overwrites the chunk's landing buffer before microbatch {} is read by its forward",
          landed_[c]);
    landed_[c] = op.microbatch;
  }
  return error;
}

SlotTracker::SlotTracker(const Role& role) {
  std::map<int32_t, int32_t> pools;
  for (const Chunk& c : role.chunks) {
    int32_t region = static_cast<int32_t>(slots_.size());
    if (c.pool >= 0) {
      auto [it, added] = pools.try_emplace(c.pool, region);
      region = it->second;
      if (added) slots_.emplace_back();
    } else {
      slots_.emplace_back();
    }
    auto& v = slots_[static_cast<size_t>(region)];
    v.resize(std::max<size_t>(v.size(), static_cast<size_t>(std::max(c.slots, 1))));
    region_.push_back(region);
    landing_.push_back(LandingBuffer(role, c) >= 0);
    first_stage_.push_back(c.stage == 0);
  }
}

void SlotTracker::Flush() {
  for (auto [region, slot] : freed_) {
    Holder& h = slots_[static_cast<size_t>(region)][static_cast<size_t>(slot)];
    if (h.state == 2) h = Holder{};
  }
  freed_.clear();
}

std::string SlotTracker::Step(const StepView& op) {
  const bool p2p = IsP2p(op.kind);
  const int64_t group = p2p ? op.group : 0;
  if (!p2p || group == 0 || group != group_) Flush();
  group_ = group;
  if (!p2p && op.kind != OpKind::Forward && op.kind != OpKind::Backward) return {};
  const auto c = static_cast<size_t>(op.chunk);
  if (op.kind == OpKind::RecvActivation && landing_[c]) return {};
  const auto key = std::make_pair(op.microbatch, op.chunk);
  const int32_t region = region_[c];
  auto& slots = slots_[static_cast<size_t>(region)];
  if (op.slot < 0 || op.slot >= static_cast<int64_t>(slots.size()))
    return fmt::format("slot {} outside the chunk's {} slots", op.slot, slots.size());
  Holder& h = slots[static_cast<size_t>(op.slot)];
  if (auto it = held_.find(key); it != held_.end()) {
    if (it->second != op.slot)
      return fmt::format("names slot {}, where its microbatch holds slot {}", op.slot, it->second);
  } else {
    const bool reuse = h.state == 2 && op.kind == OpKind::RecvActivation && h.chunk == op.chunk;
    if (h.state != 0 && !reuse)
      return fmt::format(
          "takes slot {}, which microbatch {} of chunk {} still holds{}", op.slot, h.microbatch,
          h.chunk,
          h.state == 2 ? " (freed in this transfer group, for its own chunk's receive)" : "");
    h = Holder{op.microbatch, op.chunk, 1};
    held_[key] = op.slot;
  }
  const bool last_use =
      op.kind == OpKind::SendGrad || (op.kind == OpKind::Backward && first_stage_[c]);
  if (last_use) {
    held_.erase(key);
    h.state = 2;
    freed_.emplace_back(region, op.slot);
    if (!p2p || group == 0) Flush();
  }
  return {};
}

BoundaryTracker::BoundaryTracker(const Role& role) {
  const size_t n = role.chunks.size();
  auto single = [&](int32_t b) {
    return b >= 0 && b < static_cast<int32_t>(role.buffers.size()) &&
           role.buffers[b].kind != BufferKind::Stash;
  };
  for (const Chunk& c : role.chunks) {
    output_single_.push_back(single(c.output));
    grad_single_.push_back(single(c.grad));
    receives_.push_back(!c.has_loss);
    sends_.push_back(c.stage > 0);
    landing_.push_back(GradLandingBuffer(role, c));
  }
  output_.assign(n, -1);
  landed_.assign(n, -1);
  received_.assign(n, -1);
  computed_.assign(n, -1);
}

std::string BoundaryTracker::Step(const StepView& op) {
  const auto c = static_cast<size_t>(op.chunk);
  const int64_t mb = op.microbatch;
  auto holds = [](int64_t x) {
    return x < 0 ? std::string("nothing") : fmt::format("microbatch {}", x);
  };
  // The op reads `what` for its microbatch and frees it: an error unless it held that one.
  auto release = [&](int64_t& held, const char* what) -> std::string {
    const int64_t was = held;
    held = -1;
    if (was == mb) return {};
    return fmt::format("the chunk's {} holds {}", what, holds(was));
  };
  switch (op.kind) {
    case OpKind::Forward:
      if (!output_single_[c]) return {};
      if (output_[c] >= 0)
        return fmt::format("overwrites the chunk's output before microbatch {} is sent",
                           output_[c]);
      output_[c] = mb;
      return {};
    case OpKind::SendActivation:
      if (!output_single_[c]) return {};
      return release(output_[c], "output");
    case OpKind::RecvGrad:
      if (!grad_single_[c]) return {};
      if (landing_[c] >= 0) {
        if (landed_[c] >= 0)
          return fmt::format(
              "overwrites the chunk's grad landing buffer before microbatch {}'s backward reads it",
              landed_[c]);
        landed_[c] = mb;
        return {};
      }
      if (received_[c] >= 0 || computed_[c] >= 0)
        return fmt::format("receives into the chunk's grad while it holds {}",
                           holds(std::max(received_[c], computed_[c])));
      received_[c] = mb;
      return {};
    case OpKind::Backward: {
      if (!grad_single_[c]) return {};
      std::string error;
      if (landing_[c] >= 0)
        error = release(landed_[c], "grad landing buffer");
      else if (receives_[c])
        error = release(received_[c], "grad");
      if (computed_[c] >= 0 && error.empty())
        error =
            fmt::format("overwrites the chunk's grad before microbatch {} is sent", computed_[c]);
      computed_[c] = sends_[c] ? mb : -1;
      return error;
    }
    case OpKind::SendGrad:
      if (!grad_single_[c]) return {};
      return release(computed_[c], "grad");
    default:
      return {};
  }
}

void WorldVerifier::AppendItems(const Role& role, int32_t i, std::map<int, int64_t>& coll_seq,
                                std::map<std::pair<int32_t, bool>, int64_t>& p2p_seq,
                                RoleStream& st) {
  const StepView op = StepAt(role, static_cast<size_t>(i));
  if (IsP2p(op.kind)) {
    Item it;
    it.type = ItemType::kP2p;
    it.schedule_op = i;
    it.send = IsSend(op.kind);
    it.peer = static_cast<int32_t>(op.peer);
    it.seq = static_cast<int32_t>(p2p_seq[{it.peer, it.send}]++);
    if (std::find(st.peers.begin(), st.peers.end(), it.peer) == st.peers.end())
      st.peers.push_back(it.peer);
    st.items.push_back(it);
    return;
  }
  if (op.body >= 0) {
    const Body& b = role.bodies[op.body];
    for (int32_t j = 0; j < static_cast<int32_t>(b.ops.size()); ++j) {
      const Op& bop = b.ops[j];
      if (!IsGroupCall(bop)) continue;
      Item it;
      it.type = ItemType::kCollective;
      it.schedule_op = i;
      it.body_op = j;
      it.comm = bop.comm;
      it.seq = static_cast<int32_t>(coll_seq[static_cast<int>(bop.comm)]++);
      st.items.push_back(it);
    }
    return;
  }
  Item it;
  it.type = ItemType::kCompute;
  it.schedule_op = i;
  st.items.push_back(it);
}

void WorldVerifier::MarkGroups(const Role& role, int32_t begin, int32_t end, RoleStream& st) {
  for (int32_t i = begin; i < end;) {
    Item& head = st.items[static_cast<size_t>(i)];
    if (head.type != ItemType::kP2p) {
      head.group_end = i + 1;
      ++i;
      continue;
    }
    const int64_t g = StepAt(role, static_cast<size_t>(head.schedule_op)).group;
    int32_t j = i + 1;
    auto group_of = [&](int32_t k) {
      return StepAt(role, static_cast<size_t>(st.items[static_cast<size_t>(k)].schedule_op)).group;
    };
    if (g != 0)
      while (j < end && st.items[static_cast<size_t>(j)].type == ItemType::kP2p && group_of(j) == g)
        ++j;
    for (int32_t k = i; k < j; ++k) st.items[static_cast<size_t>(k)].group_end = j;
    i = j;
  }
}

void WorldVerifier::BuildStreams() {
  streams_.resize(p_.roles.size());
  for (size_t ri = 0; ri < p_.roles.size(); ++ri) {
    const Role& role = p_.roles[ri];
    RoleStream& st = streams_[ri];
    std::map<int, int64_t> coll_seq;
    std::map<std::pair<int32_t, bool>, int64_t> p2p_seq;
    const auto listed = static_cast<int32_t>(ScheduleSize(role));
    const std::vector<prog::ScheduleLoop> none;
    const std::vector<prog::ScheduleLoop>& loops = role.steps.empty() ? none : role.loops;
    st.loops = !loops.empty();
    int64_t vpos = 0, op_vpos = 0;
    auto add_segment = [&](int32_t op_begin, int32_t op_end, int32_t loop) {
      if (op_end <= op_begin) return;
      Segment seg;
      seg.vbegin = vpos;
      seg.op_vbegin = op_vpos;
      seg.op_begin = op_begin;
      seg.op_len = op_end - op_begin;
      seg.item_begin = static_cast<int32_t>(st.items.size());
      seg.loop = loop;
      if (loop >= 0) {
        const prog::ScheduleLoop& l = loops[static_cast<size_t>(loop)];
        seg.count = l.count();
        seg.microbatch_stride = l.microbatch_stride();
        seg.slot_stride = l.slot_stride();
      }
      const auto before_p2p = p2p_seq;
      const auto before_coll = coll_seq;
      for (int32_t i = op_begin; i < op_end; ++i) AppendItems(role, i, coll_seq, p2p_seq, st);
      seg.item_len = static_cast<int32_t>(st.items.size()) - seg.item_begin;
      if (seg.item_len == 0) {  // step bodies without collectives
        op_vpos += int64_t{seg.op_len} * seg.count;
        return;
      }
      // Per-iteration advances, the runs of each direction, and the counters past the loop.
      for (auto& [key, n] : p2p_seq) {
        auto f = before_p2p.find(key);
        const int64_t start = f == before_p2p.end() ? 0 : f->second;
        const int64_t per = n - start;
        if (per == 0) continue;
        seg.per_iteration[key] = static_cast<int32_t>(per);
        P2pRun run;
        run.seq_begin = start;
        run.segment = static_cast<int32_t>(st.segments.size());
        n = start + per * seg.count;
        st.Runs(key).push_back(std::move(run));
      }
      for (auto& [kind, n] : coll_seq) {
        auto f = before_coll.find(kind);
        const int64_t start = f == before_coll.end() ? 0 : f->second;
        if (n - start > 0 && seg.count > 1) seg.collectives = true;
        n = start + (n - start) * seg.count;
      }
      for (int32_t k = seg.item_begin; k < seg.item_begin + seg.item_len; ++k) {
        Item& it = st.items[static_cast<size_t>(k)];
        if (it.type == ItemType::kP2p) {
          it.seq_stride = seg.per_iteration[{it.peer, it.send}];
          for (P2pRun& run : st.Runs({it.peer, it.send}))
            if (run.segment == static_cast<int32_t>(st.segments.size())) run.items.push_back(k);
        } else if (it.type == ItemType::kCollective && seg.count > 1) {
          int32_t per = 0;
          for (int32_t j = seg.item_begin; j < seg.item_begin + seg.item_len; ++j)
            per += st.items[static_cast<size_t>(j)].type == ItemType::kCollective &&
                   st.items[static_cast<size_t>(j)].comm == it.comm;
          it.seq_stride = per;
        }
      }
      MarkGroups(role, seg.item_begin, seg.item_begin + seg.item_len, st);
      vpos += int64_t{seg.item_len} * seg.count;
      op_vpos += int64_t{seg.op_len} * seg.count;
      st.segments.push_back(std::move(seg));
    };
    int32_t at = 0;
    for (size_t k = 0; k < loops.size(); ++k) {
      const prog::ScheduleLoop& l = loops[k];
      add_segment(at, l.begin(), -1);
      add_segment(l.begin(), l.begin() + l.length(), static_cast<int32_t>(k));
      at = l.begin() + l.length();
    }
    add_segment(at, listed, -1);
    st.length = vpos;
    st.p2p_count = p2p_seq;
    if (st.segments.empty()) st.segments.push_back(Segment{});
  }
}

}  // namespace paraplan::verify::detail
