// The CUDA execution model on the CPU: a launch runs its blocks in order; the threads of a block
// are fibers on the calling OS thread, switched cooperatively (hand-written context switch on
// x86-64, ucontext elsewhere). A fiber runs until it blocks in a barrier or warp operation or
// ends; the scheduler then runs the next runnable fiber in thread order, so the interleaving is
// deterministic. Checks of what the hardware would punish raise a Fault (device.h).
#include <signal.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include "tests/cuda_emulation/emulator.h"

__thread uint3 threadIdx;
__thread uint3 blockIdx;
__thread uint3 blockDim;
__thread uint3 gridDim;

namespace cudaemu {
namespace {

constexpr size_t kStackBytes = size_t{128} * 1024;
constexpr size_t kGuardBytes = 4096;
constexpr size_t kSharedSlack =
    size_t{64} * 1024;  // inaccessible bytes around the dynamic shared memory

// ---- Context switching ------------------------------------------------------------------------
#if defined(__x86_64__)
// paraplan_cudaemu_switch(save, load): saves the callee-saved registers on the current stack,
// stores the stack pointer in *save, and resumes the context saved at load. Kernels never change
// the floating-point control state, so MXCSR and the x87 control word are shared by all fibers.
// Assembly symbols: C linkage, names that cannot clash with anything else in the program.
// NOLINTBEGIN(readability-identifier-naming)
extern "C" void paraplan_cudaemu_switch(void** save, void* load);
extern "C" void paraplan_cudaemu_trampoline();
// NOLINTEND(readability-identifier-naming)
asm(R"(
  .text
  .globl paraplan_cudaemu_switch
  .type paraplan_cudaemu_switch,@function
paraplan_cudaemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size paraplan_cudaemu_switch, .-paraplan_cudaemu_switch
  .globl paraplan_cudaemu_trampoline
  .type paraplan_cudaemu_trampoline,@function
paraplan_cudaemu_trampoline:
  movq %rbx, %rdi
  callq *%r12
  ud2
  .size paraplan_cudaemu_trampoline, .-paraplan_cudaemu_trampoline
)");

struct Context {
  void* sp = nullptr;
};

void MakeContext(Context& c, void* stack_top, void (*entry)(void*), void* arg) {
  auto top = reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t{15};
  auto* s = reinterpret_cast<uint64_t*>(top - 16 - 64);
  s[0] = 0;                                  // alignment slot
  s[1] = 0;                                  // r15
  s[2] = 0;                                  // r14
  s[3] = 0;                                  // r13
  s[4] = reinterpret_cast<uint64_t>(entry);  // r12
  s[5] = reinterpret_cast<uint64_t>(arg);    // rbx
  s[6] = 0;                                  // rbp
  s[7] = reinterpret_cast<uint64_t>(&paraplan_cudaemu_trampoline);
  c.sp = s;
}

void Switch(Context& from, Context& to) { paraplan_cudaemu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};

void MakeContext(Context& c, void* stack_top, void (*entry)(void*), void* arg) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = static_cast<char*>(stack_top) - (kStackBytes - kGuardBytes);
  c.uc.uc_stack.ss_size = kStackBytes - kGuardBytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, reinterpret_cast<void (*)()>(entry), 1, arg);
}

void Switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- Fiber stacks (per OS thread, reused across blocks) -----------------------------------------
struct StackPool {
  std::vector<char*> stacks;
  ~StackPool() {
    for (char* s : stacks) munmap(s, kStackBytes);
  }
  void* Top(size_t i) {
    while (stacks.size() <= i) {
      void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw Fault("cannot map a fiber stack for an emulated thread");
      mprotect(p, kGuardBytes, PROT_NONE);  // an overflow faults instead of corrupting a neighbour
      stacks.push_back(static_cast<char*>(p));
    }
    return stacks[i] + kStackBytes;
  }
};

// The block's dynamic shared memory ends at a page boundary followed by inaccessible pages, and
// starts after inaccessible pages: an access past either end faults (SIGSEGV), and the handler
// turns the fault into a launch fault of the thread that made it.
struct SharedBuffer {
  static constexpr size_t kUsable = (kMaxDynamicShared + 4095) / 4096 * 4096;
  unsigned char* region = nullptr;
  unsigned char* Get(size_t size) {
    if (region == nullptr) {
      void* p = mmap(nullptr, kUsable + 2 * kSharedSlack, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw Fault("cannot map the emulated shared memory");
      region = static_cast<unsigned char*>(p);
      mprotect(region + kSharedSlack, kUsable, PROT_READ | PROT_WRITE);
    }
    return region + kSharedSlack + kUsable - (size + 127) / 128 * 128;
  }
  bool InGuard(const void* addr) const {
    const auto* a = static_cast<const unsigned char*>(addr);
    return region != nullptr && a >= region && a < region + kUsable + 2 * kSharedSlack &&
           (a < region + kSharedSlack || a >= region + kSharedSlack + kUsable);
  }
  ~SharedBuffer() {
    if (region != nullptr) munmap(region, kUsable + 2 * kSharedSlack);
  }
};

thread_local StackPool t_stacks;
thread_local SharedBuffer t_shared;

// ---- Block state
// ---------------------------------------------------------------------------------
enum class State { kRunnable, kWarpWait, kBarrierWait, kExited };

struct Lane {
  WarpOp op{};
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = 32;
  const char* file = "";
  int line = 0;
  uint64_t result = 0;
  void* d = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  MmaCompute compute = nullptr;
};

struct Fiber {
  Context ctx;
  int stack = -1;
  uint3 tid{};
  State state = State::kRunnable;
  int predicate = 0;
  int block_result = 0;
};

struct Block {
  const KernelLaunch* launch = nullptr;
  int threads = 0;
  std::vector<Fiber> fibers;
  std::vector<Lane> lanes;
  std::vector<unsigned> warp_waiting;     // lanes waiting at a warp operation
  std::vector<unsigned> warp_exited;      // lanes that have exited
  std::vector<unsigned> warp_at_barrier;  // lanes waiting at __syncthreads
  std::deque<int> runnable;
  std::vector<int> free_stacks;
  int stacks_used = 0;
  int current = -1;
  int exited = 0;
  int arrived = 0;
  BlockOp barrier_op = BlockOp::kSync;
  const char* barrier_file = "";
  int barrier_line = 0;
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
  std::string fault;
  Context scheduler;
};

thread_local Block* t_block = nullptr;

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kSync:
      return "__syncwarp";
    case WarpOp::kShfl:
      return "__shfl_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAll:
      return "__all_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kWmmaLoad:
      return "wmma::load_matrix_sync";
    case WarpOp::kWmmaStore:
      return "wmma::store_matrix_sync";
    case WarpOp::kWmmaMma:
      return "wmma::mma_sync";
  }
  return "?";
}

std::string Hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string Site(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

std::string Triple(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

Block& Current() {
  if (t_block == nullptr || t_block->current < 0) {
    throw Fault("a device function was called outside a kernel launch");
  }
  return *t_block;
}

unsigned ValidLanes(const Block& b, int warp) {
  const int n = std::min(32, b.threads - warp * 32);
  return n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
}

void Suspend(Block& b) {
  Fiber& f = b.fibers[b.current];
  Switch(f.ctx, b.scheduler);
}

void Wake(Block& b, int t) {
  b.fibers[t].state = State::kRunnable;
  b.runnable.push_back(t);
}

// Lanes of thread t's warp that wait at a warp operation whose mask names t.
// `file` is null when t exits, else the __syncthreads t reached.
void CheckNoWarpWaitsFor(Block& b, int t, const char* file, int line) {
  const int warp = t / 32, lane = t % 32;
  for (unsigned waiting = b.warp_waiting[warp]; waiting != 0; waiting &= waiting - 1) {
    const int j = __builtin_ctz(waiting);
    const Lane& other = b.lanes[warp * 32 + j];
    if (other.mask >> lane & 1u) {
      const std::string doing =
          file == nullptr ? "exited" : "reached __syncthreads (" + Site(file, line) + ")";
      RaiseFault("lane " + std::to_string(lane) + " " + doing + " while lane " + std::to_string(j) +
                 " waits for it at " + OpName(other.op) + " (" + Site(other.file, other.line) +
                 ", mask " + Hex(other.mask) + "): the mask names a lane that is inactive there");
    }
  }
}

void CompleteWarp(Block& b, int warp, unsigned mask, WarpOp op) {
  Lane* lanes = &b.lanes[size_t{32} * warp];
  const Lane& first = lanes[__builtin_ctz(mask)];
  switch (op) {
    case WarpOp::kSync:
      break;
    case WarpOp::kShfl:
    case WarpOp::kShflXor:
    case WarpOp::kShflUp:
    case WarpOp::kShflDown:
      for (int j = 0; j < 32; ++j) {
        if (!(mask >> j & 1u)) continue;
        const int width = lanes[j].width, arg = lanes[j].arg;
        if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
          RaiseFault(std::string(OpName(op)) + ": width " + std::to_string(width) +
                     " is not a power of two up to 32");
        }
        const int base = j / width * width;
        int src = j;
        if (op == WarpOp::kShfl) src = base + ((arg % width) + width) % width;
        if (op == WarpOp::kShflXor) src = j ^ arg;
        if (op == WarpOp::kShflUp) src = j - arg;
        if (op == WarpOp::kShflDown) src = j + arg;
        if (src < base || src >= base + width)
          src = j;  // outside the segment: the lane's own value
        if (!(mask >> src & 1u)) {
          RaiseFault(std::string(OpName(op)) + " (" + Site(lanes[j].file, lanes[j].line) +
                     "): lane " + std::to_string(j) + " reads lane " + std::to_string(src) +
                     ", which is not in the mask " + Hex(mask));
        }
        lanes[j].result = lanes[src].value;
      }
      break;
    case WarpOp::kBallot:
    case WarpOp::kAll:
    case WarpOp::kAny: {
      unsigned ballot = 0;
      for (int j = 0; j < 32; ++j) {
        if (mask >> j & 1u && lanes[j].value) ballot |= 1u << j;
      }
      const uint64_t r = op == WarpOp::kBallot ? ballot
                         : op == WarpOp::kAll  ? (ballot == mask)
                                               : (ballot != 0);
      for (int j = 0; j < 32; ++j) {
        if (mask >> j & 1u) lanes[j].result = r;
      }
      break;
    }
    case WarpOp::kWmmaLoad:
    case WarpOp::kWmmaStore:
      for (int j = 0; j < 32; ++j) {
        if (lanes[j].value != first.value || lanes[j].arg != first.arg) {
          RaiseFault(std::string(OpName(op)) + " (" + Site(first.file, first.line) + "): lanes " +
                     std::to_string(__builtin_ctz(mask)) + " and " + std::to_string(j) +
                     " pass different pointers or leading dimensions");
        }
      }
      break;
    case WarpOp::kWmmaMma: {
      void* d[32];
      const void* a[32];
      const void* bb[32];
      const void* c[32];
      for (int j = 0; j < 32; ++j) {
        d[j] = lanes[j].d;
        a[j] = lanes[j].a;
        bb[j] = lanes[j].b;
        c[j] = lanes[j].c;
      }
      first.compute(d, a, bb, c);
      break;
    }
  }
}

void FiberMain(void* arg);

std::string DescribeDeadlock(const Block& b) {
  std::string s = "deadlock: no thread of the block can continue;";
  int shown = 0;
  for (int t = 0; t < b.threads && shown < 4; ++t) {
    const Fiber& f = b.fibers[t];
    if (f.state == State::kWarpWait) {
      s += " thread " + std::to_string(t) + " waits at " + OpName(b.lanes[t].op) + " (" +
           Site(b.lanes[t].file, b.lanes[t].line) + ", mask " + Hex(b.lanes[t].mask) + ");";
      ++shown;
    } else if (f.state == State::kBarrierWait) {
      s += " thread " + std::to_string(t) + " waits at __syncthreads (" +
           Site(b.barrier_file, b.barrier_line) + ");";
      ++shown;
    }
  }
  return s;
}

struct sigaction g_previous_segv;

// SIGSEGV in the guard pages of the running block's shared memory: a launch fault of the
// current thread (its fiber is abandoned); any other SIGSEGV goes to the previous handler.
void OnSegv(int sig, siginfo_t* info, void* context) {
  Block* b = t_block;
  if (b != nullptr && b->current >= 0 && t_shared.InGuard(info->si_addr)) {
    const auto offset = static_cast<const unsigned char*>(info->si_addr) - b->shared;
    b->fault = "thread " + Triple(b->fibers[b->current].tid) + ": access at byte " +
               std::to_string(offset) + " of the block's dynamic shared memory, which has " +
               std::to_string(b->shared_bytes) + " bytes (out of bounds)";
    b->fibers[b->current].state = State::kExited;
    Switch(b->fibers[b->current].ctx, b->scheduler);  // SA_NODEFER: SIGSEGV stays unblocked
  }
  if (g_previous_segv.sa_flags & SA_SIGINFO) {
    if (g_previous_segv.sa_sigaction != nullptr)
      return g_previous_segv.sa_sigaction(sig, info, context);
  } else if (g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN) {
    return g_previous_segv.sa_handler(sig);
  }
  signal(SIGSEGV, SIG_DFL);  // returning re-runs the access, which now ends the process
}

// Installed (again) whenever a launch uses dynamic shared memory: a test framework may have put
// its own handler in place since; that one is kept as the previous handler.
void InstallSharedFaultHandler() {
  struct sigaction current {};
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &OnSegv) return;
  struct sigaction action {};
  action.sa_sigaction = &OnSegv;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &g_previous_segv);
}

thread_local Block t_block_state;  // reused block after block, so its arrays keep their memory

std::string RunBlock(const KernelLaunch& launch, uint3 block_idx) {
  Block& b = t_block_state;
  b.launch = &launch;
  b.threads = static_cast<int>(launch.block.x * launch.block.y * launch.block.z);
  const int warps = (b.threads + 31) / 32;
  b.fibers.assign(b.threads, Fiber{});
  if (static_cast<int>(b.lanes.size()) < b.threads) b.lanes.resize(b.threads);
  b.warp_waiting.assign(warps, 0u);
  b.warp_exited.assign(warps, 0u);
  b.warp_at_barrier.assign(warps, 0u);
  b.runnable.clear();
  b.free_stacks.clear();
  b.stacks_used = 0;
  b.current = -1;
  b.exited = 0;
  b.arrived = 0;
  b.fault.clear();
  b.shared_bytes = launch.shared_bytes;
  b.shared = t_shared.Get(launch.shared_bytes);
  // Shared memory starts as garbage on a GPU: all-ones bytes read as NaN floats.
  if (launch.shared_bytes > 0) {
    std::memset(b.shared, 0xff, launch.shared_bytes);
  }
  const unsigned bx = launch.block.x, by = launch.block.y;
  for (int t = 0; t < b.threads; ++t) {
    b.fibers[t].tid = uint3{t % bx, (t / bx) % by, t / (bx * by)};
    b.runnable.push_back(t);
  }
  t_block = &b;
  blockIdx = block_idx;
  while (!b.runnable.empty() && b.fault.empty()) {
    const int t = b.runnable.front();
    b.runnable.pop_front();
    Fiber& f = b.fibers[t];
    if (f.stack < 0) {
      // A stack only when the thread starts; threads that ran to the end give theirs back, so a
      // kernel without barriers runs every thread on the same (cache-warm) stack.
      if (b.free_stacks.empty()) {
        f.stack = b.stacks_used++;
      } else {
        f.stack = b.free_stacks.back();
        b.free_stacks.pop_back();
      }
      MakeContext(f.ctx, t_stacks.Top(f.stack), &FiberMain,
                  reinterpret_cast<void*>(static_cast<intptr_t>(t)));
    }
    b.current = t;
    threadIdx = f.tid;
    Switch(b.scheduler, f.ctx);
    if (f.state == State::kExited) b.free_stacks.push_back(f.stack);
  }
  b.current = -1;
  t_block = nullptr;
  if (b.fault.empty() && b.exited != b.threads) b.fault = DescribeDeadlock(b);
  if (!b.fault.empty()) {
    return "kernel " + std::string(launch.name) + ", block " + Triple(block_idx) + ": " + b.fault;
  }
  return "";
}

void OnExit(Block& b, int t) {
  CheckNoWarpWaitsFor(b, t, nullptr, 0);
  if (b.arrived > 0) {
    RaiseFault("__syncthreads (" + Site(b.barrier_file, b.barrier_line) +
               ") is not reached by every thread of the block: this thread exited while " +
               std::to_string(b.arrived) + " threads wait there");
  }
}

void FiberMain(void* arg) {
  const int t = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  Block& b = *t_block;
  try {
    b.launch->body();
    OnExit(b, t);
  } catch (const Fault& f) {
    b.fault = "thread " + Triple(b.fibers[t].tid) + ": " + f.what();
  } catch (const std::exception& e) {
    b.fault = "thread " + Triple(b.fibers[t].tid) + ": " + e.what();
  }
  b.fibers[t].state = State::kExited;
  b.warp_waiting[t / 32] &= ~(1u << (t % 32));
  b.warp_exited[t / 32] |= 1u << (t % 32);
  ++b.exited;
  Switch(b.fibers[t].ctx, b.scheduler);
  __builtin_trap();  // never resumed
}

}  // namespace

void RaiseFault(const std::string& what) { throw Fault(what); }

int LaneId() { return Current().current % 32; }

unsigned char* DynamicShared() { return Current().shared; }
size_t DynamicSharedBytes() { return Current().shared_bytes; }

void CheckSharedRange(const void* lo, const void* hi, const char* what) {
  Block& b = Current();
  const auto* l = static_cast<const unsigned char*>(lo);
  const auto* h = static_cast<const unsigned char*>(hi);
  const unsigned char* begin = b.shared;
  const unsigned char* end = b.shared + b.shared_bytes;
  const bool near = h > begin - kSharedSlack / 2 && l < end + kSharedSlack / 2;
  if (near && (l < begin || h > end)) {
    RaiseFault(std::string(what) + ": the tile spans bytes [" + std::to_string(l - begin) + ", " +
               std::to_string(h - begin) + ") of the block's dynamic shared memory, which has " +
               std::to_string(b.shared_bytes) + " bytes");
  }
}

uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                        const char* file, int line) {
  Block& b = Current();
  const int t = b.current, warp = t / 32, lane = t % 32;
  auto where = [&] {
    return std::string(OpName(op)) + " (" + Site(file, line) + ", mask " + Hex(mask) + ")";
  };
  if (!(mask >> lane & 1u))
    RaiseFault(where() + ": the mask does not include the calling lane " + std::to_string(lane));
  const unsigned valid = ValidLanes(b, warp);
  if (mask & ~valid) {
    RaiseFault(where() + ": the mask names lanes that do not exist (the warp has " +
               std::to_string(__builtin_popcount(valid)) + " threads)");
  }
  Lane& me = b.lanes[t];
  me.op = op;
  me.mask = mask;
  me.value = value;
  me.arg = arg;
  me.width = width;
  me.file = file;
  me.line = line;
  const unsigned others = mask & ~(1u << lane);
  if (const unsigned gone = others & b.warp_exited[warp]) {
    RaiseFault(where() + ": lane " + std::to_string(__builtin_ctz(gone)) +
               " of the mask has exited: the mask names an inactive lane");
  }
  if (const unsigned held = others & b.warp_at_barrier[warp]) {
    RaiseFault(where() + ": lane " + std::to_string(__builtin_ctz(held)) +
               " of the mask waits at __syncthreads (" + Site(b.barrier_file, b.barrier_line) +
               ") instead");
  }
  // Lanes already waiting agree with each other (each was compared on arrival): compare with one.
  const unsigned waiting = others & b.warp_waiting[warp];
  if (waiting != 0) {
    const int j = __builtin_ctz(waiting);
    const Lane& other = b.lanes[warp * 32 + j];
    if (other.op != op || other.mask != mask) {
      RaiseFault(where() + ": lane " + std::to_string(j) + " of the mask waits at " +
                 OpName(other.op) + " (" + Site(other.file, other.line) + ", mask " +
                 Hex(other.mask) + ") instead");
    }
  }
  const bool pending = (others & ~waiting) != 0;
  b.warp_waiting[warp] |= 1u << lane;
  if (pending) {
    b.fibers[t].state = State::kWarpWait;
    Suspend(b);
    return me.result;
  }
  CompleteWarp(b, warp, mask, op);
  b.warp_waiting[warp] &= ~mask;
  for (unsigned rest = others; rest != 0; rest &= rest - 1)
    Wake(b, warp * 32 + __builtin_ctz(rest));
  return me.result;
}

// d = a * b + c, in the order of CUDA's mma_sync.
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
void WarpMma(unsigned mask, void* d, const void* a, const void* b, const void* c,
             MmaCompute compute, const char* file, int line) {
  Block& blk = Current();
  if (ValidLanes(blk, blk.current / 32) != 0xffffffffu)
    RaiseFault("wmma::mma_sync needs a full warp of 32 threads");
  Lane& me = blk.lanes[blk.current];
  me.d = d;
  me.a = a;
  me.b = b;
  me.c = c;
  me.compute = compute;
  WarpCollective(WarpOp::kWmmaMma, mask, 0, 0, 32, file, line);
}

int BlockBarrier(BlockOp op, int predicate, const char* file, int line) {
  Block& b = Current();
  const int t = b.current;
  CheckNoWarpWaitsFor(b, t, file, line);
  if (b.exited > 0) {
    RaiseFault("__syncthreads (" + Site(file, line) +
               ") is not reached by every thread of the block: " + std::to_string(b.exited) +
               " threads have exited");
  }
  if (b.arrived == 0) {
    b.barrier_op = op;
    b.barrier_file = file;
    b.barrier_line = line;
  } else if (b.barrier_line != line || std::strcmp(b.barrier_file, file) != 0 ||
             b.barrier_op != op) {
    RaiseFault("threads of the block wait at different barriers: this thread at " +
               Site(file, line) + ", " + std::to_string(b.arrived) + " others at " +
               Site(b.barrier_file, b.barrier_line));
  }
  b.fibers[t].predicate = predicate;
  if (++b.arrived < b.threads) {
    b.fibers[t].state = State::kBarrierWait;
    b.warp_at_barrier[t / 32] |= 1u << (t % 32);
    Suspend(b);
    return b.fibers[t].block_result;
  }
  std::fill(b.warp_at_barrier.begin(), b.warp_at_barrier.end(), 0u);
  int count = 0;
  for (const Fiber& f : b.fibers) count += f.predicate != 0;
  const int result = op == BlockOp::kOr    ? count > 0
                     : op == BlockOp::kAnd ? count == b.threads
                                           : count;
  b.arrived = 0;
  for (int j = 0; j < b.threads; ++j) {
    b.fibers[j].block_result = result;
    if (j != t) Wake(b, j);
  }
  return result;
}

std::string RunKernel(const KernelLaunch& launch) {
  if (launch.shared_bytes > 0) InstallSharedFaultHandler();
  gridDim = uint3{launch.grid.x, launch.grid.y, launch.grid.z};
  blockDim = uint3{launch.block.x, launch.block.y, launch.block.z};
  for (unsigned z = 0; z < launch.grid.z; ++z) {
    for (unsigned y = 0; y < launch.grid.y; ++y) {
      for (unsigned x = 0; x < launch.grid.x; ++x) {
        std::string fault = RunBlock(launch, uint3{x, y, z});
        if (!fault.empty()) return fault;
      }
    }
  }
  return "";
}

}  // namespace cudaemu
