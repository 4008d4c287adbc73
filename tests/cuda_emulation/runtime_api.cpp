// The CUDA runtime entry points the backend calls, as a reference implementation on the CPU:
// device memory is host memory, and streams are queues executed lazily, in stream order, when
// something waits for them (a synchronisation, a device-to-host copy, an event query, or
// another stream's cudaStreamWaitEvent). Work never runs before its stream order and its event
// dependencies allow, so a missing wait shows up as stale data rather than passing by luck.
// The legacy default stream (0) synchronises with blocking streams, as documented. One
// operation runs at a time (the device lock), on whichever host thread drains the queue.
//
// A kernel fault is sticky, as on a GPU: every later synchronising call returns
// cudaErrorLaunchFailure, and cudaGetErrorString names the kernel, block, thread and check.
// cudaDeviceReset clears it (and drops queued work; allocations stay valid).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/cuda_emulation/emulator.h"

struct CUstream_st {
  bool blocking = true;
  struct Op {
    uint64_t seq;
    std::function<void()> run;
    std::vector<std::pair<CUstream_st*, uint64_t>> deps;
  };
  std::deque<Op> queue;
  uint64_t enqueued = 0;
  uint64_t executed = 0;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  uint64_t seq = 0;
};

struct CUmemPoolHandle_st {
  uint64_t release_threshold = 0;
};

namespace cudaemu {
namespace {

std::recursive_mutex& DeviceLock() {
  static std::recursive_mutex m;
  return m;
}
CUstream_st g_legacy;
std::set<CUstream_st*> g_streams{&g_legacy};
std::map<uintptr_t, size_t> g_allocations;
std::map<const void*, int> g_max_dynamic_shared;
CUmemPoolHandle_st g_pool;
cudaError_t g_sticky = cudaSuccess;
std::map<int, std::string> g_messages;  // the latest detailed message per error code
thread_local cudaError_t t_last_error = cudaSuccess;

using Lock = std::lock_guard<std::recursive_mutex>;

CUstream_st* Resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g_legacy;
  return s;
}

cudaError_t Fail(cudaError_t e, const std::string& message) {
  g_messages[e] = std::string(cudaGetErrorName(e)) + " (emulated): " + message;
  t_last_error = e;
  return e;
}

uint64_t Enqueue(CUstream_st* s, std::function<void()> run,
                 std::vector<std::pair<CUstream_st*, uint64_t>> deps = {}) {
  if (s == &g_legacy) {
    for (CUstream_st* other : g_streams) {
      if (other != s && other->blocking && other->enqueued > other->executed)
        deps.emplace_back(other, other->enqueued);
    }
  } else if (s->blocking && g_legacy.enqueued > g_legacy.executed) {
    deps.emplace_back(&g_legacy, g_legacy.enqueued);
  }
  const uint64_t seq = ++s->enqueued;
  s->queue.push_back(CUstream_st::Op{seq, std::move(run), std::move(deps)});
  return seq;
}

void Drain(CUstream_st* s, uint64_t upto) {
  while (g_sticky == cudaSuccess && s->executed < upto && !s->queue.empty()) {
    CUstream_st::Op& front = s->queue.front();
    if (!front.deps.empty()) {
      // Run what the operation waits for first; that may drain this stream too.
      const uint64_t seq = front.seq;
      const auto deps = std::move(front.deps);
      front.deps.clear();
      for (const auto& [other, until] : deps) Drain(other, until);
      if (s->queue.empty() || s->queue.front().seq != seq) continue;
      if (g_sticky != cudaSuccess) return;
    }
    CUstream_st::Op op = std::move(s->queue.front());
    s->queue.pop_front();
    op.run();
    s->executed = op.seq;
  }
}

void DrainAll() {
  for (CUstream_st* s : std::vector<CUstream_st*>(g_streams.begin(), g_streams.end()))
    Drain(s, s->enqueued);
}

cudaError_t Status() { return g_sticky; }

// The allocation holding [p, p + bytes), if any.
bool IsDevice(const void* p, size_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocations.upper_bound(addr);
  if (it == g_allocations.begin()) return false;
  --it;
  return addr >= it->first && addr + bytes <= it->first + it->second;
}

cudaError_t CheckDevice(const void* p, size_t bytes, const char* what) {
  if (IsDevice(p, bytes)) return cudaSuccess;
  return Fail(cudaErrorInvalidValue,
              std::string(what) + ": " + std::to_string(bytes) +
                  " bytes at a pointer that is not inside one device allocation");
}

// The emulated device's memory: PARAPLAN_EMULATED_DEVICE_BYTES when set (a test of what a run
// does on a device too small for it), else unbounded but for the host's.
size_t DeviceCapacity() {
  static const size_t kCapacity = [] {
    const char* text = std::getenv("PARAPLAN_EMULATED_DEVICE_BYTES");
    return text ? static_cast<size_t>(std::strtoull(text, nullptr, 10)) : SIZE_MAX;
  }();
  return kCapacity;
}

void* AllocateDevice(size_t size) {
  const size_t rounded = (std::max<size_t>(size, 1) + 255) / 256 * 256;
  size_t used = 0;
  for (const auto& [address, bytes] : g_allocations) used += bytes;
  if (used > DeviceCapacity() || rounded > DeviceCapacity() - used) return nullptr;
  void* p = std::aligned_alloc(256, rounded);
  if (p != nullptr) g_allocations[reinterpret_cast<uintptr_t>(p)] = size;
  return p;
}

}  // namespace

void EnqueueKernel(KernelLaunch launch) {
  Lock lock(DeviceLock());
  const dim3 g = launch.grid, b = launch.block;
  const uint64_t threads = static_cast<uint64_t>(b.x) * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535 ||
      threads == 0 || threads > 1024 || b.z > 64) {
    Fail(cudaErrorInvalidConfiguration,
         std::string("launch of ") + launch.name + ": grid (" + std::to_string(g.x) + "," +
             std::to_string(g.y) + "," + std::to_string(g.z) + "), block (" + std::to_string(b.x) +
             "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")");
    return;
  }
  auto it = g_max_dynamic_shared.find(launch.func);
  const size_t limit =
      it != g_max_dynamic_shared.end() ? static_cast<size_t>(it->second) : kDefaultDynamicShared;
  if (launch.shared_bytes > limit) {
    Fail(cudaErrorInvalidValue, std::string("launch of ") + launch.name + " asks for " +
                                    std::to_string(launch.shared_bytes) +
                                    " bytes of dynamic shared memory; the kernel may use " +
                                    std::to_string(limit) +
                                    " (cudaFuncAttributeMaxDynamicSharedMemorySize)");
    return;
  }
  CUstream_st* s = Resolve(launch.stream);
  if (s != &g_legacy && g_streams.count(s) == 0) {
    Fail(cudaErrorInvalidResourceHandle,
         std::string("launch of ") + launch.name + " on a destroyed stream");
    return;
  }
  Enqueue(s, [launch = std::move(launch)] {
    const std::string fault = RunKernel(launch);
    if (!fault.empty()) {
      g_sticky = cudaErrorLaunchFailure;
      g_messages[cudaErrorLaunchFailure] = "unspecified launch failure (emulated): " + fault;
    }
  });
}

void EnqueueWork(cudaStream_t stream, std::function<void()> work) {
  Lock lock(DeviceLock());
  Enqueue(Resolve(stream), std::move(work));
}

bool IsDeviceRange(const void* p, size_t bytes) {
  Lock lock(DeviceLock());
  return IsDevice(p, bytes);
}

}  // namespace cudaemu

using namespace cudaemu;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice, "the emulation has one device, 0");
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  Lock lock(DeviceLock());
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e != cudaSuccess ? e : g_sticky;
}

cudaError_t cudaPeekAtLastError(void) {
  Lock lock(DeviceLock());
  return t_last_error != cudaSuccess ? t_last_error : g_sticky;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  Lock lock(DeviceLock());
  if (e == cudaSuccess) return "no error";
  auto it = g_messages.find(e);
  if (it != g_messages.end()) return it->second.c_str();
  return cudaGetErrorName(e);
}

cudaError_t cudaDeviceSynchronize(void) {
  Lock lock(DeviceLock());
  DrainAll();
  return Status();
}

cudaError_t cudaDeviceReset(void) {
  Lock lock(DeviceLock());
  for (CUstream_st* s : g_streams) {
    s->queue.clear();
    s->executed = s->enqueued;
  }
  g_sticky = cudaSuccess;
  t_last_error = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  Lock lock(DeviceLock());
  auto* s = new CUstream_st;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  g_streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(DeviceLock());
  CUstream_st* s = Resolve(stream);
  if (s == &g_legacy || g_streams.count(s) == 0)
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of an unknown stream");
  // Queued work still completes; the stream object stays readable for events recorded on it.
  Drain(s, s->enqueued);
  g_streams.erase(s);
  return Status();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(DeviceLock());
  CUstream_st* s = Resolve(stream);
  Drain(s, s->enqueued);
  return Status();
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Lock lock(DeviceLock());
  if (event == nullptr)
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent on a null event");
  if (event->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  Enqueue(Resolve(stream), [] {}, {{event->stream, event->seq}});
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (event == nullptr)
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventRecord of a null event");
  CUstream_st* s = Resolve(stream);
  // The event completes when everything queued on the stream so far has run.
  event->stream = s;
  event->seq = Enqueue(s, [] {});
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(DeviceLock());
  if (event->stream != nullptr) Drain(event->stream, event->seq);
  return Status();
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return cudaEventQuery(event); }

cudaError_t cudaMalloc(void** ptr, size_t size) {
  Lock lock(DeviceLock());
  *ptr = AllocateDevice(size);
  if (*ptr == nullptr)
    return Fail(cudaErrorMemoryAllocation,
                "out of device memory for " + std::to_string(size) + " bytes");
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  Lock lock(DeviceLock());
  if (ptr == nullptr) return cudaSuccess;
  DrainAll();  // cudaFree synchronises the device
  auto it = g_allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_allocations.end())
    return Fail(cudaErrorInvalidValue, "cudaFree of a pointer that cudaMalloc did not return");
  g_allocations.erase(it);
  std::free(ptr);
  return Status();
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  return cudaMalloc(ptr, size);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (ptr == nullptr) return cudaSuccess;
  if (g_allocations.count(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return Fail(cudaErrorInvalidValue, "cudaFreeAsync of a pointer that was not allocated");
  }
  Enqueue(Resolve(stream), [ptr] {
    g_allocations.erase(reinterpret_cast<uintptr_t>(ptr));
    std::free(ptr);
  });
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice, "the emulation has one device, 0");
  *pool = &g_pool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void* value) {
  if (attr == cudaMemPoolAttrReleaseThreshold)
    pool->release_threshold = *static_cast<uint64_t*>(value);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  Lock lock(DeviceLock());
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > kMaxDynamicShared) {
      return Fail(cudaErrorInvalidValue, "cudaFuncAttributeMaxDynamicSharedMemorySize " +
                                             std::to_string(value) +
                                             " is more than the 232448 bytes a block may have");
    }
    g_max_dynamic_shared[func] = value;
  }
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (count == 0) return cudaSuccess;
  if (cudaError_t e = CheckDevice(ptr, count, "cudaMemsetAsync")) return e;
  Enqueue(Resolve(stream), [=] { std::memset(ptr, value, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (cudaError_t e = cudaMemsetAsync(ptr, value, count, nullptr)) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (count == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault) {
    const bool d = IsDevice(dst, count), s = IsDevice(src, count);
    kind = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
             : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_device) {
    if (cudaError_t e = CheckDevice(dst, count, "cudaMemcpyAsync destination")) return e;
  }
  if (src_device) {
    if (cudaError_t e = CheckDevice(src, count, "cudaMemcpyAsync source")) return e;
  }
  CUstream_st* s = Resolve(stream);
  if (!src_device) {
    // Pageable host memory is staged at the call: the caller may reuse it at once.
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + count);
    const uint64_t seq = Enqueue(s, [=] { std::memcpy(dst, staged->data(), count); });
    if (!dst_device) Drain(s, seq);
    return cudaSuccess;
  }
  const uint64_t seq = Enqueue(s, [=] { std::memmove(dst, src, count); });
  if (!dst_device) {
    Drain(s, seq);  // into pageable host memory: returns when the copy is done
    return Status();
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  if (cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, nullptr)) return e;
  return cudaStreamSynchronize(nullptr);
}

}  // extern "C"
