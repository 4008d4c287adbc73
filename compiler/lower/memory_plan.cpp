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
         k == BufferKind::Persistent || k == BufferKind::Bucket || k == BufferKind::State;
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

// Places every buffer of a role for one element width (the program's precision, or f32 for the
// host backend) and measures the exact breakdown.
class ArenaPlacer {
 public:
  ArenaPlacer(Role& role, bool fp32)
      : role_(role),
        fp32_(fp32),
        transient_(role.buffers.size(), 0),
        grad_bucket_(role.buffers.size(), 0) {
    // ZeRO-3 gathered param buckets and ZeRO-2/3 full grad buckets: live only around one chunk
    // body.
    for (const Bucket& k : role_.buckets) {
      grad_bucket_[k.grads] = 1;
      if (k.param_shard >= 0) transient_[k.params] = 1;
      if (k.grad_shard >= 0) transient_[k.grads] = 2;
    }
  }

  Placement Place() {
    PlacePersistent();
    PlaceStash();
    // Scratch region: Scratch buffers and transient buckets, first fit by live range.
    scratch_base_ = cursor_;
    PlaceScratch(CollectIntervals());
    MeasureHighWaterMarks();
    PlaceUntouched();
    PlaceViews();
    pl_.arena = Align(scratch_base_ + scratch_size_);
    return pl_;
  }

 private:
  void Set(Buffer& b, int64_t offset, int64_t bytes) const {
    if (fp32_) {
      b.fp32_offset = offset, b.fp32_bytes = bytes, b.fp32_slot_stride = 0;
    } else {
      b.offset = offset, b.bytes = bytes, b.slot_stride = 0;
    }
  }
  int64_t BytesOf(const Buffer& b) const { return b.Elements() * ElementBytes(b.dtype, fp32_); }

  // Persistent region (views are placed after their parents).
  void PlacePersistent() {
    for (size_t bi = 0; bi < role_.buffers.size(); ++bi) {
      Buffer& b = role_.buffers[bi];
      if (!IsPersistentKind(b.kind) || b.view_of >= 0 || transient_[bi]) continue;
      const int64_t n = BytesOf(b);
      Set(b, cursor_, n);
      cursor_ = Align(cursor_ + n);
      int64_t* slot = &pl_.exact.other;
      if (b.kind == BufferKind::Param || (b.kind == BufferKind::Bucket && !grad_bucket_[bi]))
        slot = &pl_.exact.params;
      if (b.kind == BufferKind::Grad || (b.kind == BufferKind::Bucket && grad_bucket_[bi]))
        slot = &pl_.exact.grads;
      if (b.kind == BufferKind::Optimizer) slot = &pl_.exact.optimizer;
      *slot += n;
    }
  }

  // Stash region: per chunk a frame of its stash buffers, repeated `slots` times; the chunks of
  // a pool share one run of slots as large as the largest member's frame.
  void PlaceStash() {
    const std::vector<int32_t> stash_chunk = StashChunks(role_);
    std::vector<bool> placed(role_.chunks.size(), false);
    for (const Chunk& c : role_.chunks) {
      if (placed[c.index]) continue;
      int64_t stride = 0, exact = 0;
      std::vector<int32_t> members;
      for (const Chunk& m : role_.chunks) {
        if (m.index != c.index && (c.pool < 0 || m.pool != c.pool)) continue;
        placed[m.index] = true;
        int64_t frame = 0, bytes = 0;
        for (int32_t i = 0; i < static_cast<int32_t>(role_.buffers.size()); ++i) {
          Buffer& b = role_.buffers[i];
          if (b.kind != BufferKind::Stash || stash_chunk[i] != m.index) continue;
          const int64_t n = BytesOf(b);
          Set(b, cursor_ + frame, n);
          frame = Align(frame + n);
          bytes += n;
          members.push_back(i);
        }
        stride = std::max(stride, frame);
        exact = std::max(exact, bytes);
      }
      for (int32_t i : members) {
        Buffer& b = role_.buffers[i];
        b.slots = c.slots;
        if (fp32_)
          b.fp32_slot_stride = stride;
        else
          b.slot_stride = stride;
      }
      cursor_ += stride * c.slots;
      pl_.exact.stash += exact * c.slots;
    }
  }

  // The live ranges of the body-scoped buffers; returns those buffers in order of first use.
  std::vector<int32_t> CollectIntervals() {
    intervals_ = BodyIntervals(role_, transient_);
    ranges_of_.assign(role_.buffers.size(), {});
    std::vector<int32_t> order;
    for (int32_t k = 0; k < static_cast<int32_t>(intervals_.size()); ++k) {
      const int32_t b = intervals_[k].buffer;
      if (ranges_of_[b].empty()) order.push_back(b);
      ranges_of_[b].push_back(k);
    }
    return order;
  }

  // Bodies run one at a time, so only ranges in the same body conflict; a transient bucket (live
  // in several bodies, never across a body's end) must fit beside everything it meets in any of
  // them. Largest buffers first, each at the lowest offset that is free in all its ranges.
  void PlaceScratch(std::vector<int32_t> order) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return BytesOf(role_.buffers[a]) > BytesOf(role_.buffers[b]);
    });
    placed_in_body_.assign(role_.bodies.size(), {});
    for (int32_t b : order) {
      const int64_t n = Align(BytesOf(role_.buffers[b]));
      const int64_t at = FirstFit(b, n);
      for (int32_t k : ranges_of_[b])
        placed_in_body_[intervals_[k].body].push_back({at, at + n, b});
      Set(role_.buffers[b], scratch_base_ + at, BytesOf(role_.buffers[b]));
      scratch_size_ = std::max(scratch_size_, at + n);
    }
  }

  // The lowest scratch offset where n bytes of buffer b overlap no placed buffer whose live
  // range meets one of b's.
  int64_t FirstFit(int32_t b, int64_t n) const {
    std::vector<std::pair<int64_t, int64_t>> blocked;
    for (int32_t k : ranges_of_[b]) {
      const Interval& iv = intervals_[k];
      for (const Placed& p : placed_in_body_[iv.body]) {
        for (int32_t j : ranges_of_[p.buffer]) {
          const Interval& other = intervals_[j];
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
    return at;
  }

  // Exact high-water marks per body: Scratch alone, gathered params, full grads, and together.
  void MeasureHighWaterMarks() {
    pl_.exact.scratch = HighWaterMark(0);
    pl_.exact.gathered_params = HighWaterMark(1);
    pl_.exact.full_grads = HighWaterMark(2);
    pl_.exact.body_peak = HighWaterMark(3);
  }

  // The largest bytes live at one op of any body, of: 0 scratch, 1 params, 2 grads, 3 all.
  int64_t HighWaterMark(int which) const {
    std::vector<std::vector<int64_t>> delta(role_.bodies.size());
    for (size_t bi = 0; bi < role_.bodies.size(); ++bi)
      delta[bi].assign(role_.bodies[bi].ops.size() + 1, 0);
    for (const Interval& iv : intervals_) {
      const int kind =
          role_.buffers[iv.buffer].kind == BufferKind::Scratch ? 0 : transient_[iv.buffer];
      if (which != 3 && kind != which) continue;
      const int64_t n = BytesOf(role_.buffers[iv.buffer]);
      delta[iv.body][iv.first] += n;
      delta[iv.body][iv.last + 1] -= n;
    }
    int64_t best = 0;
    for (const auto& d : delta) {
      int64_t live = 0;
      for (int64_t x : d) best = std::max(best, live += x);
    }
    return best;
  }

  // Body-scoped buffers no body touches (none today) still get a valid placement.
  void PlaceUntouched() {
    for (size_t bi = 0; bi < role_.buffers.size(); ++bi) {
      Buffer& b = role_.buffers[bi];
      if ((b.kind == BufferKind::Scratch || transient_[bi]) && ranges_of_[bi].empty() &&
          b.Elements() > 0) {
        const int64_t n = BytesOf(b);
        Set(b, scratch_base_, n);
        scratch_size_ = std::max(scratch_size_, Align(n));
      }
    }
  }

  // Views last: their parents (buckets, persistent or transient) are placed.
  void PlaceViews() {
    for (Buffer& b : role_.buffers) {
      if (b.view_of < 0) continue;
      const Buffer& parent = role_.buffers[b.view_of];
      const int64_t base = fp32_ ? parent.fp32_offset : parent.offset;
      Set(b, base + b.view_offset * ElementBytes(b.dtype, fp32_), BytesOf(b));
    }
  }

  struct Placed {
    int64_t begin, end;
    int32_t buffer;
  };

  Role& role_;
  const bool fp32_;
  std::vector<uint8_t> transient_;  // 1 params, 2 grads
  std::vector<uint8_t> grad_bucket_;
  Placement pl_;
  int64_t cursor_ = 0;
  int64_t scratch_base_ = 0, scratch_size_ = 0;
  std::vector<Interval> intervals_;
  std::vector<std::vector<int32_t>> ranges_of_;  // buffer -> its intervals
  std::vector<std::vector<Placed>> placed_in_body_;
};

}  // namespace

MemoryBreakdown PlanMemory(Role& role) {
  Placement wide = ArenaPlacer(role, /*fp32=*/true).Place();
  role.fp32_arena_bytes = wide.arena;
  Placement real = ArenaPlacer(role, /*fp32=*/false).Place();
  role.arena_bytes = real.arena;
  role.peak_bytes = real.exact.Total();
  return real.exact;
}

std::vector<int64_t> StashFrames(const Role& role) {
  const std::vector<int32_t> stash_chunk = StashChunks(role);
  std::vector<int64_t> frames(role.chunks.size(), 0);
  for (size_t i = 0; i < role.buffers.size(); ++i) {
    const Buffer& b = role.buffers[i];
    if (b.kind == BufferKind::Stash && stash_chunk[i] >= 0)
      frames[stash_chunk[i]] += Align(b.Elements() * ElementBytes(b.dtype, false));
  }
  return frames;
}

MemoryBreakdown MeasureMemory(const Role& role) {
  Role copy = role;
  return PlanMemory(copy);
}

}  // namespace paraplan::lower
