// Static memory plan (see memory_plan.h).
#include "compiler/lower/memory_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

namespace paraplan::lower {

namespace {

int64_t Align(int64_t x) { return (x + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

int64_t ElementBytes(DType t, bool fp32) {
  if (fp32 && (t == DType::Bf16 || t == DType::F16)) return 4;
  return prog::DTypeBytes(t);
}

bool IsPersistentKind(BufferKind k) {
  return k == BufferKind::Param || k == BufferKind::Grad || k == BufferKind::Optimizer ||
         k == BufferKind::Persistent || k == BufferKind::Bucket;
}

// Live ranges of the scratch buffers of every body: body index, first and last op.
struct Interval {
  int32_t buffer;
  int32_t body;
  int32_t first;
  int32_t last;
};

std::vector<Interval> ScratchIntervals(const Role& role) {
  std::vector<Interval> out;
  std::vector<int32_t> index(role.buffers.size(), -1);
  for (int32_t bi = 0; bi < static_cast<int32_t>(role.bodies.size()); ++bi) {
    const Body& body = role.bodies[bi];
    for (int32_t oi = 0; oi < static_cast<int32_t>(body.ops.size()); ++oi) {
      const Op& op = body.ops[oi];
      auto touch = [&](int32_t b) {
        if (role.buffers[b].kind != BufferKind::Scratch) return;
        if (index[b] < 0) {
          index[b] = static_cast<int32_t>(out.size());
          out.push_back({b, bi, oi, oi});
        } else {
          out[index[b]].last = oi;
        }
      };
      for (int32_t b : op.inputs) touch(b);
      for (int32_t b : op.outputs) touch(b);
    }
  }
  return out;
}

struct Placement {
  int64_t arena = 0;
  MemoryBreakdown exact;
};

Placement Place(Role& role, bool fp32) {
  Placement pl;
  auto set = [&](Buffer& b, int64_t offset, int64_t bytes, int64_t stride) {
    if (fp32) {
      b.fp32_offset = offset, b.fp32_bytes = bytes, b.fp32_slot_stride = stride;
    } else {
      b.offset = offset, b.bytes = bytes, b.slot_stride = stride;
    }
  };
  auto bytes_of = [&](const Buffer& b) { return b.Elements() * ElementBytes(b.dtype, fp32); };
  int64_t cursor = 0;
  // ZeRO-3 gathered param buckets and ZeRO-2/3 full grad buckets: live only around one chunk body.
  std::vector<uint8_t> transient(role.buffers.size(), 0);  // 1 params, 2 grads
  std::vector<uint8_t> grad_bucket(role.buffers.size(), 0);
  for (const Bucket& k : role.buckets) {
    grad_bucket[k.grads] = 1;
    if (k.param_shard >= 0) transient[k.params] = 1;
    if (k.grad_shard >= 0) transient[k.grads] = 2;
  }
  // Persistent region (views are placed after their parents).
  for (size_t bi = 0; bi < role.buffers.size(); ++bi) {
    Buffer& b = role.buffers[bi];
    if (!IsPersistentKind(b.kind) || b.view_of >= 0 || transient[bi]) continue;
    int64_t n = bytes_of(b);
    set(b, cursor, n, 0);
    cursor = Align(cursor + n);
    int64_t* slot = &pl.exact.other;
    if (b.kind == BufferKind::Param || (b.kind == BufferKind::Bucket && !grad_bucket[bi])) slot = &pl.exact.params;
    if (b.kind == BufferKind::Grad || (b.kind == BufferKind::Bucket && grad_bucket[bi])) slot = &pl.exact.grads;
    if (b.kind == BufferKind::Optimizer) slot = &pl.exact.optimizer;
    *slot += n;
  }
  // Transient region: one chunk body runs at a time, so the chunks share it: the chunk's param
  // buckets from its start, its grad buckets after the largest chunk's param buckets.
  {
    std::map<int32_t, int64_t> param_end, grad_end;  // per chunk
    for (const Bucket& k : role.buckets) {
      if (transient[k.params]) param_end[k.chunk] += Align(bytes_of(role.buffers[k.params]));
      if (transient[k.grads]) grad_end[k.chunk] += Align(bytes_of(role.buffers[k.grads]));
    }
    int64_t params_size = 0, grads_size = 0;
    for (auto& [c, n] : param_end) params_size = std::max(params_size, n);
    for (auto& [c, n] : grad_end) grads_size = std::max(grads_size, n);
    std::map<int32_t, int64_t> param_at, grad_at;
    for (const Bucket& k : role.buckets) {
      if (transient[k.params]) {
        Buffer& b = role.buffers[k.params];
        set(b, cursor + param_at[k.chunk], bytes_of(b), 0);
        param_at[k.chunk] += Align(bytes_of(b));
      }
      if (transient[k.grads]) {
        Buffer& b = role.buffers[k.grads];
        set(b, cursor + params_size + grad_at[k.chunk], bytes_of(b), 0);
        grad_at[k.chunk] += Align(bytes_of(b));
      }
    }
    int64_t exact = 0;
    for (auto& [c, n] : param_end) {
      int64_t e = 0;
      for (const Bucket& k : role.buckets)
        if (k.chunk == c) e += (transient[k.params] ? bytes_of(role.buffers[k.params]) : 0);
      exact = std::max(exact, e);
    }
    pl.exact.gathered_params = exact;
    exact = 0;
    for (auto& [c, n] : grad_end) {
      int64_t e = 0;
      for (const Bucket& k : role.buckets)
        if (k.chunk == c) e += (transient[k.grads] ? bytes_of(role.buffers[k.grads]) : 0);
      exact = std::max(exact, e);
    }
    pl.exact.full_grads = exact;
    cursor += params_size + grads_size;
  }
  for (Buffer& b : role.buffers) {
    if (b.view_of < 0) continue;
    const Buffer& parent = role.buffers[b.view_of];
    int64_t base = fp32 ? parent.fp32_offset : parent.offset;
    set(b, base + b.view_offset * ElementBytes(b.dtype, fp32), bytes_of(b), 0);
  }
  // Stash region: per chunk a frame of its stash buffers, repeated `slots` times.
  for (const Chunk& c : role.chunks) {
    int64_t frame = 0, exact = 0;
    std::vector<int32_t> members;
    for (int32_t i = 0; i < static_cast<int32_t>(role.buffers.size()); ++i) {
      Buffer& b = role.buffers[i];
      if (b.kind != BufferKind::Stash || b.chunk != c.index) continue;
      int64_t n = bytes_of(b);
      set(b, cursor + frame, n, 0);
      frame = Align(frame + n);
      exact += n;
      members.push_back(i);
    }
    for (int32_t i : members) {
      Buffer& b = role.buffers[i];
      b.slots = c.slots;
      if (fp32) b.fp32_slot_stride = frame; else b.slot_stride = frame;
    }
    cursor += frame * c.slots;
    pl.exact.stash += exact * c.slots;
  }
  // Scratch region: first fit by live range inside each body; bodies share the region.
  int64_t scratch_base = cursor;
  int64_t scratch_size = 0;
  std::vector<Interval> intervals = ScratchIntervals(role);
  std::stable_sort(intervals.begin(), intervals.end(), [&](const Interval& a, const Interval& b) {
    if (a.body != b.body) return a.body < b.body;
    return bytes_of(role.buffers[a.buffer]) > bytes_of(role.buffers[b.buffer]);
  });
  size_t i = 0;
  while (i < intervals.size()) {
    size_t j = i;
    while (j < intervals.size() && intervals[j].body == intervals[i].body) ++j;
    struct Placed {
      int64_t begin, end;
      int32_t first, last;
    };
    std::vector<Placed> placed;
    for (size_t k = i; k < j; ++k) {
      const Interval& iv = intervals[k];
      int64_t n = Align(bytes_of(role.buffers[iv.buffer]));
      // Candidate offsets: 0 and the end of every overlapping placed buffer; take the lowest that fits.
      std::vector<Placed> live;
      for (const Placed& p : placed)
        if (!(p.last < iv.first || iv.last < p.first)) live.push_back(p);
      std::sort(live.begin(), live.end(), [](const Placed& a, const Placed& b) { return a.begin < b.begin; });
      int64_t at = 0;
      for (const Placed& p : live) {
        if (at + n <= p.begin) break;
        at = std::max(at, p.end);
      }
      placed.push_back({at, at + n, iv.first, iv.last});
      set(role.buffers[iv.buffer], scratch_base + at, bytes_of(role.buffers[iv.buffer]), 0);
      scratch_size = std::max(scratch_size, at + n);
    }
    // Exact high-water mark of this body: the largest sum of bytes live at one op.
    int32_t ops = static_cast<int32_t>(role.bodies[intervals[i].body].ops.size());
    std::vector<int64_t> delta(ops + 1, 0);
    for (size_t k = i; k < j; ++k) {
      int64_t n = bytes_of(role.buffers[intervals[k].buffer]);
      delta[intervals[k].first] += n;
      delta[intervals[k].last + 1] -= n;
    }
    int64_t live = 0, high = 0;
    for (int64_t d : delta) high = std::max(high, live += d);
    pl.exact.scratch = std::max(pl.exact.scratch, high);
    i = j;
  }
  // Scratch buffers no body touches (none today) still get a valid placement.
  for (Buffer& b : role.buffers)
    if (b.kind == BufferKind::Scratch && (fp32 ? b.fp32_bytes : b.bytes) == 0 && b.Elements() > 0) {
      int64_t n = bytes_of(b);
      set(b, scratch_base, n, 0);
      scratch_size = std::max(scratch_size, Align(n));
    }
  pl.arena = Align(scratch_base + scratch_size);
  return pl;
}

}  // namespace

MemoryBreakdown PlanMemory(Role& role) {
  Placement wide = Place(role, /*fp32=*/true);
  role.fp32_arena_bytes = wide.arena;
  Placement real = Place(role, /*fp32=*/false);
  role.arena_bytes = real.arena;
  role.peak_bytes = real.exact.Total();
  return real.exact;
}

MemoryBreakdown MeasureMemory(const Role& role) {
  Role copy = role;
  return PlanMemory(copy);
}

}  // namespace paraplan::lower
