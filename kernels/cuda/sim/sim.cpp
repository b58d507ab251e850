// The simulator's execution: fibers for a block's threads, the block barrier, the warp
// collectives, the whole-warp rendezvous WMMA is built on and the launch loop (the model is
// described in kernels/cuda/sim/sim.h).
//
// The rule a reader could get wrong: a fiber switches only where CUDA lets threads wait on each
// other. Between two such points a thread runs alone, so anything a kernel reads of another
// thread's writes without a barrier in between is what the scheduler's order makes it (stale or
// poison), never "probably fine".
#include "kernels/cuda/sim/sim.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/sim/sim_internal.h"

namespace llmtrain::cuda_sim {

constinit thread_local ThreadIndex* tl_thread = nullptr;

namespace {

constexpr size_t kStackBytes = 256 * 1024;  // per fiber; a kernel's locals live here
constexpr int kMaxThreads = 1024;

enum class State : uint8_t { runnable, at_barrier, at_warp, exited };

struct Fiber {
  ucontext_t context;
  ThreadIndex index;
  State state = State::runnable;
  int linear = 0;  // the thread's index in its block, x fastest
};

// One warp's collective in progress: the lanes of `mask` that have arrived, their values and
// arguments, and, once all have, each lane's result. A whole-warp operation (warp_whole) has `run`
// set, its call's place in `where`, and each lane's arguments in `lanes`.
struct WarpRendezvous {
  unsigned mask = 0;
  unsigned arrived = 0;
  WarpOp op = WarpOp::sync;
  int width = 32;
  const char* what = "";
  uint64_t value[32] = {};
  int arg[32] = {};
  uint64_t result[32] = {};
  WarpFunction run = nullptr;
  std::source_location where;
  void* lanes[32] = {};
};

std::string place(const std::source_location& where) {
  return std::string(where.file_name()) + ":" + std::to_string(where.line());
}

// What a warp waits in, for messages: the collective, or the whole-warp call and where it is.
std::string call_name(const WarpRendezvous& w) {
  return w.run != nullptr ? std::string(w.what) + " at " + place(w.where) : std::string(w.what);
}

// What one OS thread needs to run blocks: a fiber per thread of the largest block so far, their
// stacks (kept between launches), the scheduler's own context, and the running block's state.
struct Executor {
  std::vector<Fiber> fibers;
  std::vector<void*> stacks;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  int threads = 0;     // in the running block
  int alive = 0;       // not exited
  int at_barrier = 0;  // waiting at __syncthreads
  std::vector<WarpRendezvous> warps;
  std::vector<unsigned char> dynamic_smem;
  size_t dynamic_smem_offset = 0;  // where the block's area starts in dynamic_smem: 16 mod 32
  uint64_t launches = 0;           // run on this OS thread: the seed of each launch's fragment mappings
  unsigned mapped = 0;             // the fragment kinds whose mapping this launch has drawn
  uint16_t mapping[kFragmentKinds][256] = {};
  const LaunchConfig* config = nullptr;
  const std::function<void()>* body = nullptr;  // one thread's work

  ~Executor() {
    for (void* s : stacks) munmap(s, kStackBytes + size_t(getpagesize()));
  }
};

thread_local std::unique_ptr<Executor> tl_executor;

Executor& executor() {
  if (!tl_executor) tl_executor = std::make_unique<Executor>();
  return *tl_executor;
}

std::string block_name(const Executor& e) {
  const ThreadIndex& t = e.current->index;
  return std::string(e.config->name) + " block (" + std::to_string(t.block_idx.x) + "," +
         std::to_string(t.block_idx.y) + "," + std::to_string(t.block_idx.z) + ")";
}

void yield_to_scheduler(Executor& e) {
  Fiber* f = e.current;
  if (swapcontext(&f->context, &e.scheduler) != 0) fatal("swapcontext failed");
}

void fiber_entry() {
  Executor& e = executor();
  (*e.body)();
  Fiber* f = e.current;
  f->state = State::exited;
  --e.alive;
  // An exited thread no longer counts at the barrier (what the hardware does for exited warps);
  // a warp collective waiting for it can never complete.
  if (e.at_barrier > 0 && e.at_barrier == e.alive) {
    for (int i = 0; i < e.threads; ++i)
      if (e.fibers[size_t(i)].state == State::at_barrier) e.fibers[size_t(i)].state = State::runnable;
    e.at_barrier = 0;
  }
  const WarpRendezvous& w = e.warps[size_t(f->linear / 32)];
  if (w.arrived != 0 && (w.mask >> (f->linear % 32) & 1u))
    fatal(block_name(e) + ": thread " + std::to_string(f->linear) + " exited while lanes of its warp wait for it in " +
          call_name(w) + (w.run != nullptr ? " (all 32 lanes must make the call)" : " (its mask names it)"));
  // returning resumes uc_link: the scheduler
}

void ensure_fibers(Executor& e, int n) {
  const size_t page = size_t(getpagesize());
  while (int(e.stacks.size()) < n) {
    // A guard page below each stack: an overflow faults instead of corrupting a neighbour.
    void* p =
        mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fatal("cannot map a fiber stack");
    mprotect(p, page, PROT_NONE);
    e.stacks.push_back(p);
  }
  if (int(e.fibers.size()) < n) e.fibers.resize(size_t(n));
}

void run_block(Executor& e, const LaunchConfig& c, uint3 block_idx) {
  const int nx = int(c.block.x), ny = int(c.block.y), n = int(c.block.x * c.block.y * c.block.z);
  const size_t page = size_t(getpagesize());
  e.threads = n;
  e.alive = n;
  e.at_barrier = 0;
  e.warps.assign(size_t((n + 31) / 32), WarpRendezvous{});
  // Fresh dynamic shared memory holds garbage on a GPU; here it is poison, the same every time.
  std::memset(e.dynamic_smem.data(), 0xFF, e.dynamic_smem.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = e.fibers[size_t(i)];
    f.state = State::runnable;
    f.linear = i;
    f.index.thread_idx = make_uint3(unsigned(i % nx), unsigned(i / nx % ny), unsigned(i / (nx * ny)));
    f.index.block_idx = block_idx;
    f.index.block_dim = c.block;
    f.index.grid_dim = c.grid;
    if (getcontext(&f.context) != 0) fatal("getcontext failed");
    f.context.uc_stack.ss_sp = static_cast<char*>(e.stacks[size_t(i)]) + page;
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &e.scheduler;
    makecontext(&f.context, fiber_entry, 0);
  }
  // Run every runnable thread until it blocks or exits, pass after pass, until all have exited.
  // The order alternates between passes (index order, then reverse) and starts reversed on odd
  // blocks, so that a read missing its barrier sees stale data whichever neighbour it reads.
  for (int pass = 0; e.alive > 0; ++pass) {
    const bool reverse = (pass + int(block_idx.x + block_idx.y + block_idx.z)) % 2 == 1;
    bool progress = false;
    for (int k = 0; k < n; ++k) {
      const int i = reverse ? n - 1 - k : k;
      Fiber& f = e.fibers[size_t(i)];
      if (f.state != State::runnable) continue;
      progress = true;
      e.current = &f;
      tl_thread = &f.index;
      if (swapcontext(&e.scheduler, &f.context) != 0) fatal("swapcontext failed");
    }
    tl_thread = nullptr;
    if (!progress) {
      std::string waits;
      for (int i = 0; i < n; ++i) {
        const Fiber& f = e.fibers[size_t(i)];
        if (f.state == State::at_barrier) waits += " " + std::to_string(i) + ":__syncthreads";
        if (f.state == State::at_warp) waits += " " + std::to_string(i) + ":" + call_name(e.warps[size_t(i / 32)]);
      }
      e.current = &e.fibers[0];
      fatal(block_name(e) + ": deadlock, every thread that has not exited waits (thread:call)" + waits);
    }
  }
  e.current = nullptr;
}

}  // namespace

[[noreturn]] void fatal(const std::string& message) {
  std::fprintf(stderr, "cuda simulator: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

void syncthreads() {
  Executor& e = executor();
  if (tl_thread == nullptr) fatal("__syncthreads called outside a kernel");
  Fiber* f = e.current;
  f->state = State::at_barrier;
  if (++e.at_barrier == e.alive) {
    for (int i = 0; i < e.threads; ++i)
      if (e.fibers[size_t(i)].state == State::at_barrier) e.fibers[size_t(i)].state = State::runnable;
    e.at_barrier = 0;
    return;  // the last to arrive goes on
  }
  yield_to_scheduler(e);
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* what) {
  Executor& e = executor();
  if (tl_thread == nullptr) fatal(std::string(what) + " called outside a kernel");
  Fiber* f = e.current;
  const int lane = f->linear % 32, warp = f->linear / 32;
  WarpRendezvous& w = e.warps[size_t(warp)];
  auto fail = [&](const std::string& why) {
    fatal(block_name(e) + ", thread " + std::to_string(f->linear) + ", " + what + ": " + why);
  };
  if (!(mask >> lane & 1u)) fail("the calling lane " + std::to_string(lane) + " is not in its mask");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail("width " + std::to_string(width) + " is not a power of two <= 32");
  const int lanes_here = std::min(32, e.threads - warp * 32);
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    if (l >= lanes_here) fail("its mask names lane " + std::to_string(l) + ", which this block does not have");
    if (e.fibers[size_t(warp * 32 + l)].state == State::exited)
      fail("its mask names lane " + std::to_string(l) + ", which has exited");
  }
  if (w.arrived == 0) {
    w.mask = mask;
    w.op = op;
    w.width = width;
    w.what = what;
  } else if (w.run != nullptr || w.mask != mask || w.op != op || w.width != width) {
    fail("lanes of one warp meet in different collectives or with different masks (" + call_name(w) + ")");
  }
  w.value[lane] = value;
  w.arg[lane] = arg;
  w.arrived |= 1u << lane;
  if (w.arrived != mask) {
    f->state = State::at_warp;
    yield_to_scheduler(e);
    return w.result[lane];
  }
  // The last lane: every participant's result, then all go on.
  uint64_t votes = 0;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u && w.value[l] != 0) votes |= 1ull << l;
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    const int base = l & ~(width - 1);
    int src = l;
    switch (op) {
      case WarpOp::sync:
        break;
      case WarpOp::shfl_idx:
        src = base + (w.arg[l] & (width - 1));
        break;
      case WarpOp::shfl_up:
        src = l - w.arg[l] >= base ? l - w.arg[l] : l;
        break;
      case WarpOp::shfl_down:
        src = l + w.arg[l] < base + width ? l + w.arg[l] : l;
        break;
      case WarpOp::shfl_xor:
        src = l ^ w.arg[l];
        if (src >= base + width) src = l;
        break;
      case WarpOp::ballot:
      case WarpOp::any:
      case WarpOp::all:
        break;
    }
    if (op == WarpOp::ballot) {
      w.result[l] = votes;
    } else if (op == WarpOp::any) {
      w.result[l] = votes != 0;
    } else if (op == WarpOp::all) {
      w.result[l] = votes == mask;
    } else if (src < 0 || src > 31 || !(mask >> src & 1u)) {
      // CUDA: reading a lane that does not take part is undefined; poison makes it visible.
      w.result[l] = ~0ull;
    } else {
      w.result[l] = w.value[src];
    }
    if (l != lane) e.fibers[size_t(warp * 32 + l)].state = State::runnable;
  }
  w.arrived = 0;
  return w.result[lane];
}

void warp_call_failed(const char* what, const std::source_location& where, const std::string& why) {
  Executor& e = executor();
  if (e.current == nullptr) fatal(std::string(what) + " at " + place(where) + " called outside a kernel: " + why);
  fatal(block_name(e) + ", thread " + std::to_string(e.current->linear) + ", " + what + " at " + place(where) + ": " +
        why);
}

void warp_whole(const char* what, const std::source_location& where, void* args, WarpFunction run) {
  Executor& e = executor();
  if (tl_thread == nullptr) fatal(std::string(what) + " at " + place(where) + " called outside a kernel");
  Fiber* f = e.current;
  const int lane = f->linear % 32, warp = f->linear / 32;
  WarpRendezvous& w = e.warps[size_t(warp)];
  auto fail = [&](const std::string& why) { warp_call_failed(what, where, why); };
  const int lanes_here = std::min(32, e.threads - warp * 32);
  if (lanes_here < 32)
    fail("its warp has " + std::to_string(lanes_here) + " threads (a block of " + std::to_string(e.threads) +
         "), and the call needs all 32 lanes of a full warp");
  for (int l = 0; l < 32; ++l)
    if (e.fibers[size_t(warp * 32 + l)].state == State::exited)
      fail("lane " + std::to_string(l) + " of its warp (thread " + std::to_string(warp * 32 + l) +
           ") has exited, and all 32 lanes must make the call");
  if (w.arrived == 0) {
    w.mask = ~0u;
    w.what = what;
    w.run = run;
    w.where = where;
  } else if (w.run != run || std::strcmp(w.what, what) != 0 || w.where.line() != where.line() ||
             w.where.column() != where.column() || std::strcmp(w.where.file_name(), where.file_name()) != 0) {
    fail("lanes of its warp wait in " + call_name(w) + ": all 32 lanes must make the same call, converged");
  }
  w.lanes[lane] = args;
  w.arrived |= 1u << lane;
  if (w.arrived != ~0u) {
    f->state = State::at_warp;
    yield_to_scheduler(e);
    return;
  }
  // The last lane: the operation over every lane's arguments, then all go on.
  const std::string why = run(w.lanes);
  if (!why.empty()) fail(why);
  for (int l = 0; l < 32; ++l)
    if (l != lane) e.fibers[size_t(warp * 32 + l)].state = State::runnable;
  w.arrived = 0;
  w.run = nullptr;
}

const uint16_t* fragment_mapping(int kind) {
  Executor& e = executor();
  if (e.config == nullptr) fatal("a WMMA fragment used outside a kernel");
  if (kind < 0 || kind >= kFragmentKinds) fatal("fragment_mapping: no fragment kind " + std::to_string(kind));
  uint16_t* m = e.mapping[kind];
  if (!(e.mapped >> kind & 1u)) {
    // A Fisher-Yates shuffle driven by splitmix64 from (launch, kind): the same in every run.
    uint64_t state = e.launches * 0x9E3779B97F4A7C15ull + uint64_t(kind) * 0xD1B54A32D192ED03ull + 1;
    auto next = [&state] {
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    for (int i = 0; i < 256; ++i) m[i] = uint16_t(i);
    for (int i = 255; i > 0; --i) std::swap(m[i], m[next() % uint64_t(i + 1)]);
    e.mapped |= 1u << kind;
  }
  return m;
}

void device_check_failed(const char* file, int line, const char* cond, const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  Executor& e = executor();
  std::string where = e.current != nullptr ? block_name(e) + ", thread " + std::to_string(e.current->linear) : "";
  fatal(std::string(file) + ":" + std::to_string(line) + ": kernel check failed in " + where + ": " + cond + ": " +
        text);
}

void* dynamic_shared_memory() {
  Executor& e = executor();
  if (tl_thread == nullptr) fatal("dynamic shared memory used outside a kernel");
  return e.dynamic_smem.data() + e.dynamic_smem_offset;
}

namespace {

// Runs every block of a launch whose configuration was checked.
void run_grid(const LaunchConfig& c, const std::function<void()>& body) {
  Executor& e = executor();
  if (e.config != nullptr) fatal(std::string("kernel ") + c.name + " launched from inside kernel " + e.config->name);
  ensure_fibers(e, int(c.block.x * c.block.y * c.block.z));
  // 16-byte alignment, as CUDA promises, and deliberately not 32: a kernel relying on more than CUDA
  // promises (WMMA's 32-byte pointers) fails here too.
  e.dynamic_smem.resize(c.smem + 32);
  const uintptr_t base = reinterpret_cast<uintptr_t>(e.dynamic_smem.data());
  e.dynamic_smem_offset = size_t((16 + 32 - base % 32) % 32);
  ++e.launches;
  e.mapped = 0;
  e.config = &c;
  e.body = &body;
  {
    DeviceAccess access;  // device memory is accessible while the kernel runs
    for (unsigned z = 0; z < c.grid.z; ++z)
      for (unsigned y = 0; y < c.grid.y; ++y)
        for (unsigned x = 0; x < c.grid.x; ++x) run_block(e, c, make_uint3(x, y, z));
  }
  e.config = nullptr;
  e.body = nullptr;
}

}  // namespace

void launch(const LaunchConfig& c, std::function<void()> thread_body) {
  if (executor().config != nullptr)
    fatal(std::string("kernel ") + c.name + " launched from inside kernel " + executor().config->name);
  const uint64_t threads = uint64_t(c.block.x) * c.block.y * c.block.z;
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0 || threads > kMaxThreads || c.block.z > 64 ||
      c.grid.y > 65535 || c.grid.z > 65535) {
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (c.smem > kMaxDynamicSharedBytes) {
    set_last_error(cudaErrorInvalidValue);
    return;
  }
  // More than 48 KiB only after the kernel's opt-in on this device, as CUDA requires.
  if (const size_t limit = dynamic_shared_limit(c.func); c.smem > limit) {
    fail_because(cudaErrorInvalidValue,
                 std::string("kernel ") + c.name + " asks for " + std::to_string(c.smem) +
                     " bytes of dynamic shared memory, more than its limit of " + std::to_string(limit) +
                     " on device " + std::to_string(current_device()) +
                     " (48 KiB unless cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                     "bytes) raised it on that device)");
    return;
  }
  // A refused stream sets the launch error (cudaErrorInvalidResourceHandle) and queues nothing.
  if (enqueue(
          c.stream, [c, body = std::move(thread_body)] { run_grid(c, body); }, c.name) == cudaSuccess)
    count_launch();
}

}  // namespace llmtrain::cuda_sim
