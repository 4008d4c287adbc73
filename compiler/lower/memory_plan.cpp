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

// Live ranges of the body-scoped buffers: Scratch buffers (one body) and transient buckets
// (ZeRO: a bucket and its views, in every body that touches them). One range per (buffer, body).
struct Interval {
  int32_t buffer;
  int32_t body;
  int32_t first;
  int32_t last;
};

std::vector<Interval> BodyIntervals(const Role& role, const std::vector<uint8_t>& transient) {
  std::vector<Interval> out;
  const size_t n = role.buffers.size();
  std::vector<int32_t> root(n, -1);  // the body-scoped buffer a buffer stands for
  for (size_t b = 0; b < n; ++b) {
    const Buffer& buf = role.buffers[b];
    if (buf.kind == BufferKind::Scratch || transient[b])
      root[b] = static_cast<int32_t>(b);
    else if (buf.view_of >= 0 && transient[buf.view_of])
      root[b] = buf.view_of;
  }
  for (int32_t bi = 0; bi < static_cast<int32_t>(role.bodies.size()); ++bi) {
    const Body& body = role.bodies[bi];
    std::vector<int32_t> index(n, -1);
    for (int32_t oi = 0; oi < static_cast<int32_t>(body.ops.size()); ++oi) {
      const Op& op = body.ops[oi];
      auto touch = [&](int32_t x) {
        if (x < 0 || static_cast<size_t>(x) >= n || root[x] < 0) return;
        const int32_t b = root[x];
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
    if (b.kind == BufferKind::Param || (b.kind == BufferKind::Bucket && !grad_bucket[bi]))
      slot = &pl.exact.params;
    if (b.kind == BufferKind::Grad || (b.kind == BufferKind::Bucket && grad_bucket[bi]))
      slot = &pl.exact.grads;
    if (b.kind == BufferKind::Optimizer) slot = &pl.exact.optimizer;
    *slot += n;
  }
  // Stash region: per chunk a frame of its stash buffers, repeated `slots` times.
  const std::vector<int32_t> stash_chunk = StashChunks(role);
  for (const Chunk& c : role.chunks) {
    int64_t frame = 0, exact = 0;
    std::vector<int32_t> members;
    for (int32_t i = 0; i < static_cast<int32_t>(role.buffers.size()); ++i) {
      Buffer& b = role.buffers[i];
      if (b.kind != BufferKind::Stash || stash_chunk[i] != c.index) continue;
      int64_t n = bytes_of(b);
      set(b, cursor + frame, n, 0);
      frame = Align(frame + n);
      exact += n;
      members.push_back(i);
    }
    for (int32_t i : members) {
      Buffer& b = role.buffers[i];
      b.slots = c.slots;
      if (fp32)
        b.fp32_slot_stride = frame;
      else
        b.slot_stride = frame;
    }
    cursor += frame * c.slots;
    pl.exact.stash += exact * c.slots;
  }
  // Scratch region: Scratch buffers and transient buckets, first fit by live range. Bodies run
  // one at a time, so only ranges in the same body conflict; a transient bucket (live in several
  // bodies, never across a body's end) must fit beside everything it meets in any of them.
  int64_t scratch_base = cursor;
  int64_t scratch_size = 0;
  std::vector<Interval> intervals = BodyIntervals(role, transient);
  std::vector<std::vector<int32_t>> ranges_of(role.buffers.size());
  std::vector<int32_t> order;
  for (int32_t k = 0; k < static_cast<int32_t>(intervals.size()); ++k) {
    int32_t b = intervals[k].buffer;
    if (ranges_of[b].empty()) order.push_back(b);
    ranges_of[b].push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_of(role.buffers[a]) > bytes_of(role.buffers[b]);
  });
  struct Placed {
    int64_t begin, end;
    int32_t buffer;
  };
  std::vector<std::vector<Placed>> placed_in_body(role.bodies.size());
  std::vector<std::pair<int64_t, int64_t>> blocked;
  for (int32_t b : order) {
    const int64_t n = Align(bytes_of(role.buffers[b]));
    blocked.clear();
    for (int32_t k : ranges_of[b]) {
      const Interval& iv = intervals[k];
      for (const Placed& p : placed_in_body[iv.body]) {
        for (int32_t j : ranges_of[p.buffer]) {
          const Interval& other = intervals[j];
          if (other.body == iv.body && !(other.last < iv.first || iv.last < other.first)) {
            blocked.push_back({p.begin, p.end});
            break;
          }
        }
      }
    }
    std::sort(blocked.begin(), blocked.end());
    int64_t at = 0;
    for (const auto& [begin, end] : blocked) {
      if (at + n <= begin) break;
      at = std::max(at, end);
    }
    for (int32_t k : ranges_of[b]) placed_in_body[intervals[k].body].push_back({at, at + n, b});
    set(role.buffers[b], scratch_base + at, bytes_of(role.buffers[b]), 0);
    scratch_size = std::max(scratch_size, at + n);
  }
  // Exact high-water marks per body: Scratch alone, gathered params, full grads, and together.
  {
    std::vector<std::vector<int64_t>> delta(role.bodies.size());
    for (size_t bi = 0; bi < role.bodies.size(); ++bi)
      delta[bi].assign(role.bodies[bi].ops.size() + 1, 0);
    auto high = [&](int which) {  // 0 scratch, 1 params, 2 grads, 3 all
      int64_t best = 0;
      for (size_t bi = 0; bi < role.bodies.size(); ++bi)
        std::fill(delta[bi].begin(), delta[bi].end(), 0);
      for (const Interval& iv : intervals) {
        const int kind =
            role.buffers[iv.buffer].kind == BufferKind::Scratch ? 0 : transient[iv.buffer];
        if (which != 3 && kind != which) continue;
        const int64_t n = bytes_of(role.buffers[iv.buffer]);
        delta[iv.body][iv.first] += n;
        delta[iv.body][iv.last + 1] -= n;
      }
      for (const auto& d : delta) {
        int64_t live = 0;
        for (int64_t x : d) best = std::max(best, live += x);
      }
      return best;
    };
    pl.exact.scratch = high(0);
    pl.exact.gathered_params = high(1);
    pl.exact.full_grads = high(2);
    pl.exact.body_peak = high(3);
  }
  // Body-scoped buffers no body touches (none today) still get a valid placement.
  for (size_t bi = 0; bi < role.buffers.size(); ++bi) {
    Buffer& b = role.buffers[bi];
    if ((b.kind == BufferKind::Scratch || transient[bi]) && ranges_of[bi].empty() &&
        b.Elements() > 0) {
      int64_t n = bytes_of(b);
      set(b, scratch_base, n, 0);
      scratch_size = std::max(scratch_size, Align(n));
    }
  }
  // Views last: their parents (buckets, persistent or transient) are placed.
  for (Buffer& b : role.buffers) {
    if (b.view_of < 0) continue;
    const Buffer& parent = role.buffers[b.view_of];
    int64_t base = fp32 ? parent.fp32_offset : parent.offset;
    set(b, base + b.view_offset * ElementBytes(b.dtype, fp32), bytes_of(b), 0);
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
