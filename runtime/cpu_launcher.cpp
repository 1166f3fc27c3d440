// Launcher of the CPU emulation platform (hccc.runtime.cpu), compiled into every CPU module next
// to the emitted rank kernels (hccc_cpu_emu.h models a thread block as a group of emulated threads).
//
// Fibers. Every emulated GPU thread is a fiber (a ucontext with a stack of its own), pinned to one
// of a bounded pool of OS worker threads (hccc_cpu_configure: the cores available unless the
// platform says otherwise). A worker runs its fibers in turn; a fiber runs until it waits (every
// wait of hccc_cpu_emu.h parks it or yields, see hccc_cpu_sched), and the worker resumes a parked
// fiber once the word it waits on has changed or its sleep is over: the worker checks the word
// itself, so a parked fiber costs no switch. Consecutive threads of a block go to consecutive
// workers: the threads of one block, and the blocks, run concurrently on every worker. A worker
// with nothing runnable sleeps until a store wakes it (hccc_cpu_futex_wake in the emulation) or
// for at most HCCC_CPU_IDLE_POLL_NS (stores made by another process wake no one); a worker with
// no fibers left exits, so an idle module holds no threads. Built with AddressSanitizer, every
// switch is announced to it (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber).
//
// Residency. A launch admits its blocks in block order, as a GPU dispatches them: all of them at
// once, or with `resident` > 0 at most that many at a time, a block's place taken by the next one
// when all of its threads have returned (the partial-residency mode: a block that waits on a block
// of its own launch not yet admitted waits until its timeout).
//
// C API (loaded with ctypes):
//   hccc_cpu_abi(out[4])                    sizeof hccc_args, hccc_conn, hccc_error; HCCC_NSLOTS
//   hccc_cpu_now_ns()                       the clock the launches are timed with (steady clock)
//   hccc_cpu_configure(workers)             worker threads of the launches that follow (> 0)
//   hccc_cpu_launch(fn, grid, block, args, nargs, resident, start, err, nerr)
//                                           a launch of grid x block fibers that run kernel fn on a
//                                           copy of args (one hccc_args; for the table mode's
//                                           generic kernels one hccc_args followed by the table's
//                                           address; for a one-grid entry hccc_grid_args, or the
//                                           table mode's hccc_table_grid_args: the argument's
//                                           size tells which), at most `resident` blocks at once
//                                           (0: all), started at once when start != 0, else at
//                                           hccc_cpu_start; returns a handle, or null with a
//                                           message in err (then nothing keeps running)
//   hccc_cpu_start(h)                       let the blocks of a held launch run
//   hccc_cpu_wait(h, timeout_s)             0 once every thread has returned, 1 after timeout_s
//                                           seconds (timeout_s < 0: wait forever)
//   hccc_cpu_times(h, &start, &end)         launch time and time the last thread returned (ns)
//   hccc_cpu_release(h)                     free a finished launch
//   hccc_cpu_os_threads()                   worker threads alive in this module (tests)
#include "hccc_prims.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define HCCC_CPU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define HCCC_CPU_API extern "C" __attribute__((visibility("default")))

typedef void (*hccc_cpu_kernel)(hccc_args);
// The table mode's argument (hccc_table_args in hccc_table.h): the same bytes, declared here so
// the launcher does not depend on the table header.
struct hccc_cpu_table_args {
  hccc_args a;
  const void* table;
};
typedef void (*hccc_cpu_table_kernel)(hccc_cpu_table_args);
typedef void (*hccc_cpu_grid_kernel)(hccc_grid_args);
// hccc_table_grid_args in hccc_table.h, likewise
struct hccc_cpu_table_grid_args {
  const void* ranks;
  const int32_t* first;
  int64_t nranks;
};
typedef void (*hccc_cpu_table_grid_kernel)(hccc_cpu_table_grid_args);
// The kinds of kernel argument, told apart by their sizes (all different).
enum hccc_cpu_arg_kind { HCCC_CPU_RANK, HCCC_CPU_TABLE, HCCC_CPU_GRID, HCCC_CPU_TABLE_GRID };
static_assert(sizeof(hccc_grid_args) != sizeof(hccc_cpu_table_grid_args) &&
                  sizeof(hccc_cpu_table_grid_args) < sizeof(hccc_args),
              "kernel argument sizes must differ");

// Stack of each emulated GPU thread (a fiber's, below a guard page): the kernels need little,
// and thousands of fibers may exist (the stacks are reserved, only what is touched is resident).
#ifndef HCCC_CPU_STACK_BYTES
#define HCCC_CPU_STACK_BYTES (256 * 1024)
#endif
// A worker with nothing runnable looks at its parked fibers again after yielding the core
// HCCC_CPU_IDLE_YIELDS times, then after sleeps from HCCC_CPU_IDLE_FIRST_NS doubling up to
// HCCC_CPU_IDLE_POLL_NS (a store wakes it earlier, but an LL line's store, or another process's,
// wakes no one: with every idle sleep 1 ms, ring AllReduce on 4 ranks took 0.45-0.86 s a run with
// LL lines and 0.05-0.16 s with the simple protocol, against 0.02 s and 0.01 s for OS threads; a
// pass over a few thousand parked fibers costs some 0.1 ms, so a long-idle worker costs little).
#define HCCC_CPU_IDLE_YIELDS 2
#define HCCC_CPU_IDLE_FIRST_NS 10000L
#define HCCC_CPU_IDLE_POLL_NS 1000000L
// Fiber stacks kept for the next launch (beyond that many, finished fibers unmap theirs). The pool
// lives while the module's workers do: the last worker to leave unmaps it (trim_stacks), so a
// module no launch is using holds no stacks. (Each pooled stack is two memory mappings, its guard
// page and its stack: a process loads many modules, and the system's mappings are bounded,
// vm.max_map_count, 65,530 by default; pools kept by idle modules once exhausted them in a
// long-lived test process.)
#define HCCC_CPU_STACK_POOL 4096
// What a worker thread is called (its /proc/<pid>/task/<tid>/comm).
#define HCCC_CPU_WORKER_NAME "hccc-cpu-worker"
// The most worker threads a module runs.
#define HCCC_CPU_MAX_WORKERS 1024

namespace {

struct Launch;

// One emulated GPU thread.
struct Fiber {
  ucontext_t ctx;
  unsigned char* map = nullptr;  // a guard page, then HCCC_CPU_STACK_BYTES of stack (null: none)
  hccc_cpu_thread_state state{};
  Launch* launch = nullptr;
  hccc_cpu_block* block = nullptr;
  int tid = 0;
  int worker = 0;
  bool done = false;
  // a park: runnable again once the word at park_addr no longer holds park_seen (its low
  // park_bytes bytes), or at park_until (0: no limit); park_addr null: runnable
  const void* park_addr = nullptr;
  uint64_t park_seen = 0;
  int park_bytes = 0;
  uint64_t park_until = 0;
#if HCCC_CPU_ASAN
  void* fake_stack = nullptr;
#endif
};

// One OS worker thread's share of the fibers.
struct Worker {
  int index = 0;
  std::mutex mu;
  std::deque<Fiber*> queue;  // its fibers, runnable or parked (under mu)
  bool alive = false;        // a thread runs this worker (under mu)
  ucontext_t ctx;            // the worker thread's own context while it runs a fiber
  Fiber* current = nullptr;
#if HCCC_CPU_ASAN
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
#endif
};

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return 1;
}

struct Scheduler {
  std::mutex mu;  // nworkers, next, workers[], stacks
  int nworkers = available_cores();
  unsigned next = 0;  // the worker of the next fiber
  std::unique_ptr<Worker> workers[HCCC_CPU_MAX_WORKERS];
  std::vector<unsigned char*> stacks;  // unused stacks
  std::atomic<uint32_t> epoch{0};      // bumped by every wake
  std::atomic<int> idle{0};            // workers asleep for want of a runnable fiber
  std::atomic<int> threads{0};         // worker threads alive
};

// The module's scheduler: never destroyed (a stuck launch's fibers may outlive everything). A
// process forked while workers ran starts a scheduler of its own: the parent's threads (and any
// lock they held) are not in the child.
std::atomic<Scheduler*> the_sched{nullptr};
void fork_child() { the_sched.store(new Scheduler()); }
Scheduler& sched() {
  Scheduler* s = the_sched.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  static std::once_flag once;
  std::call_once(once, [] {
    the_sched.store(new Scheduler(), std::memory_order_release);
    pthread_atfork(nullptr, nullptr, fork_child);
  });
  return *the_sched.load(std::memory_order_acquire);
}

thread_local Worker* tl_worker = nullptr;

size_t page_bytes() {
  static const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return page;
}

unsigned char* get_stack() {
  Scheduler& s = sched();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.stacks.empty()) {
      unsigned char* m = s.stacks.back();
      s.stacks.pop_back();
      return m;
    }
  }
  const size_t page = page_bytes();
  void* m = mmap(nullptr, page + HCCC_CPU_STACK_BYTES, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  if (mprotect(m, page, PROT_NONE) != 0) {  // the guard page: an overflow faults
    munmap(m, page + HCCC_CPU_STACK_BYTES);
    return nullptr;
  }
  return static_cast<unsigned char*>(m);
}

// Every pooled stack unmapped (the module's last worker is leaving; a stack handed out is not in the
// pool, so a launch starting meanwhile keeps its own).
void trim_stacks(Scheduler& s) {
  std::vector<unsigned char*> drop;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    drop.swap(s.stacks);
  }
  for (unsigned char* m : drop) munmap(m, page_bytes() + HCCC_CPU_STACK_BYTES);
}

void put_stack(unsigned char* m) {
  if (m == nullptr) return;
  Scheduler& s = sched();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stacks.size() < HCCC_CPU_STACK_POOL) {
      s.stacks.push_back(m);
      return;
    }
  }
  munmap(m, page_bytes() + HCCC_CPU_STACK_BYTES);
}

// Fiber -> its worker (finished: the fiber never runs again).
void switch_out(Fiber* f, bool finished) {
  Worker* w = tl_worker;
#if HCCC_CPU_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &f->fake_stack, w->stack_bottom, w->stack_size);
#else
  (void)finished;
#endif
  swapcontext(&f->ctx, &w->ctx);
#if HCCC_CPU_ASAN
  w = tl_worker;  // the same worker: a fiber is pinned to one
  __sanitizer_finish_switch_fiber(f->fake_stack, &w->stack_bottom, &w->stack_size);
#endif
}

void fiber_park(const void* p, uint64_t seen, int bytes, long ns) {
  Fiber* f = tl_worker->current;
  f->park_seen = seen;
  f->park_bytes = bytes;
  f->park_until = ns > 0 ? hccc_clock() + (uint64_t)ns : 0;
  f->park_addr = p;
  switch_out(f, false);
}

void fiber_yield() {
  Fiber* f = tl_worker->current;
  f->park_addr = nullptr;
  switch_out(f, false);
}

void futex(std::atomic<uint32_t>* word, int op, uint32_t val, long ns) {
  struct timespec limit = {ns / 1000000000L, ns % 1000000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ns > 0 ? &limit : nullptr, nullptr, 0);
}

void fiber_wake() {
  Scheduler& s = sched();
  s.epoch.fetch_add(1, std::memory_order_seq_cst);
  if (s.idle.load(std::memory_order_seq_cst) > 0) futex(&s.epoch, FUTEX_WAKE_PRIVATE, 0x7fffffff, 0);
}

const hccc_cpu_sched fiber_hooks = {fiber_park, fiber_yield, fiber_wake};

// May the parked fiber f run? (now: the clock, read once when needed)
bool parked_ready(const Fiber* f, uint64_t* now) {
  const uint64_t v = f->park_bytes == 8 ? __atomic_load_n(static_cast<const uint64_t*>(f->park_addr), __ATOMIC_RELAXED)
                                        : __atomic_load_n(static_cast<const uint32_t*>(f->park_addr), __ATOMIC_RELAXED);
  const uint64_t seen = f->park_bytes == 8 ? f->park_seen : (uint32_t)f->park_seen;
  if (v != seen) return true;
  if (f->park_until == 0) return false;
  if (*now == 0) *now = hccc_clock();
  return *now >= f->park_until;
}

void start_worker_thread(Worker* w);

// Hand a new fiber to its worker (starting the worker's thread if it has none).
void enqueue(Fiber* f) {
  Scheduler& s = sched();
  Worker* w;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const int i = (int)(s.next++ % (unsigned)s.nworkers);
    if (!s.workers[i]) {
      s.workers[i].reset(new Worker());
      s.workers[i]->index = i;
    }
    w = s.workers[i].get();
  }
  f->worker = w->index;
  bool start;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->queue.push_back(f);
    start = !w->alive;
    w->alive = true;
  }
  if (start) start_worker_thread(w);
  fiber_wake();
}

void run_fiber(Worker* w, Fiber* f) {
  w->current = f;
  hccc_cpu_cur = &f->state;
#if HCCC_CPU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f->map + page_bytes(), HCCC_CPU_STACK_BYTES);
#endif
  swapcontext(&w->ctx, &f->ctx);
#if HCCC_CPU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  hccc_cpu_cur = nullptr;
  w->current = nullptr;
}

void fiber_finished(Fiber* f);

void* worker_main(void* p) {
  Worker* w = static_cast<Worker*>(p);
  Scheduler& s = sched();
  pthread_setname_np(pthread_self(), HCCC_CPU_WORKER_NAME);
  tl_worker = w;
  hccc_cpu_fiber_sched = &fiber_hooks;
  size_t skipped = 0;    // parked fibers passed over since a fiber last ran
  uint64_t until = 0;    // the earliest end of their sleeps (0: none)
  int idle = 0;          // passes that found nothing to run since a fiber last ran
  uint32_t epoch = s.epoch.load(std::memory_order_seq_cst);
  for (;;) {
    Fiber* f = nullptr;
    size_t n = 0;
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      if (w->queue.empty()) {  // no fibers left: the thread ends (enqueue starts another)
        w->alive = false;
        last = s.threads.fetch_sub(1) == 1;
      } else {
        f = w->queue.front();
        w->queue.pop_front();
        n = w->queue.size() + 1;
      }
    }
    if (f == nullptr) {
      if (last) trim_stacks(s);  // the module's last worker: no stack is kept idle
      return nullptr;
    }
    if (f->park_addr != nullptr) {
      uint64_t now = 0;
      if (!parked_ready(f, &now)) {
        if (f->park_until != 0 && (until == 0 || f->park_until < until)) until = f->park_until;
        {
          std::lock_guard<std::mutex> lock(w->mu);
          w->queue.push_back(f);
        }
        if (++skipped >= n) {  // a whole pass found nothing to run: yield, or sleep until a wake
          long ns = HCCC_CPU_IDLE_FIRST_NS;
          for (int k = HCCC_CPU_IDLE_YIELDS; k < idle && ns < HCCC_CPU_IDLE_POLL_NS; ++k) ns *= 2;
          if (ns > HCCC_CPU_IDLE_POLL_NS) ns = HCCC_CPU_IDLE_POLL_NS;
          if (until != 0) {
            const uint64_t t = hccc_clock();
            ns = until <= t ? 0 : (long)(until - t < (uint64_t)ns ? until - t : (uint64_t)ns);
          }
          if (idle++ < HCCC_CPU_IDLE_YIELDS) {
            sched_yield();
          } else if (ns > 0) {
            s.idle.fetch_add(1, std::memory_order_seq_cst);
            futex(&s.epoch, FUTEX_WAIT_PRIVATE, epoch, ns);
            s.idle.fetch_sub(1, std::memory_order_seq_cst);
          }
          skipped = 0;
          until = 0;
          epoch = s.epoch.load(std::memory_order_seq_cst);
        }
        continue;
      }
      f->park_addr = nullptr;
    }
    skipped = 0;
    until = 0;
    idle = 0;
    epoch = s.epoch.load(std::memory_order_seq_cst);
    run_fiber(w, f);
    if (f->done) {
      fiber_finished(f);
    } else {
      std::lock_guard<std::mutex> lock(w->mu);
      w->queue.push_back(f);
    }
  }
}

void start_worker_thread(Worker* w) {
  Scheduler& s = sched();
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t th;
  s.threads.fetch_add(1);
  const int rc = pthread_create(&th, &attr, worker_main, w);
  pthread_attr_destroy(&attr);
  if (rc == 0) return;
  s.threads.fetch_sub(1);
  // No thread for this worker: its fibers go to the calling worker (a worker thread runs this
  // when a block is admitted), or the run cannot go on.
  std::deque<Fiber*> orphans;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    orphans.swap(w->queue);
    w->alive = false;
  }
  Worker* here = tl_worker;
  if (here == nullptr || here == w) {
    fprintf(stderr, "hccc: cannot start a worker thread of the CPU emulation: %s\n", strerror(rc));
    abort();
  }
  std::lock_guard<std::mutex> lock(here->mu);
  for (Fiber* f : orphans) {
    f->worker = here->index;
    here->queue.push_back(f);
  }
}

void fiber_entry();

struct Launch {
  union {
    hccc_cpu_table_args args;  // .table is used by table-mode kernels only
    hccc_grid_args grid_args;
    hccc_cpu_table_grid_args table_grid;
  };
  hccc_cpu_arg_kind kind = HCCC_CPU_RANK;
  hccc_cpu_kernel kernel = nullptr;
  int grid = 0, nthreads = 1, resident = 0;
  std::vector<std::unique_ptr<hccc_cpu_block>> blocks;
  std::unique_ptr<Fiber[]> fibers;
  std::unique_ptr<std::atomic<int>[]> live;  // threads of each block not returned yet
  std::mutex mu;
  std::condition_variable cv;
  int gate = 0;         // 0: held, 1: started
  int next_block = 0;   // the next block to admit (under mu)
  int blocks_left = 0;  // blocks not finished (under mu)
  uint64_t t_start = 0, t_end = 0;

  void run(const Fiber& f) {
    switch (kind) {
      case HCCC_CPU_TABLE:
        hccc_cpu_run_thread(reinterpret_cast<hccc_cpu_table_kernel>(kernel), args, f.block, f.tid);
        break;
      case HCCC_CPU_GRID:
        hccc_cpu_run_thread(reinterpret_cast<hccc_cpu_grid_kernel>(kernel), grid_args, f.block, f.tid);
        break;
      case HCCC_CPU_TABLE_GRID:
        hccc_cpu_run_thread(reinterpret_cast<hccc_cpu_table_grid_kernel>(kernel), table_grid, f.block, f.tid);
        break;
      default:
        hccc_cpu_run_thread(kernel, args.a, f.block, f.tid);
    }
  }

  // Make block b's threads runnable. Its last fiber handed over may finish (and the launch with
  // it) before this returns: nothing here touches the launch after that.
  void admit(int b) {
    for (int t = 0; t < nthreads; ++t) {
      Fiber* f = &fibers[(size_t)b * (size_t)nthreads + (size_t)t];
#if HCCC_CPU_ASAN
      __asan_unpoison_memory_region(f->map + page_bytes(), HCCC_CPU_STACK_BYTES);  // a reused stack
#endif
      getcontext(&f->ctx);
      f->ctx.uc_stack.ss_sp = f->map + page_bytes();
      f->ctx.uc_stack.ss_size = HCCC_CPU_STACK_BYTES;
      f->ctx.uc_link = nullptr;
      makecontext(&f->ctx, fiber_entry, 0);
    }
    const int n = nthreads;
    Fiber* first = &fibers[(size_t)b * (size_t)nthreads];
    for (int t = 0; t < n; ++t) enqueue(first + t);
  }

  // Blocks the start admits at once.
  int first_admitted() const { return resident > 0 && resident < grid ? resident : grid; }
};

void fiber_entry() {
  Worker* w = tl_worker;
  Fiber* f = w->current;
#if HCCC_CPU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &w->stack_bottom, &w->stack_size);
#endif
  f->launch->run(*f);
  f->done = true;
  switch_out(f, true);
  abort();  // a finished fiber is never resumed
}

// On the worker, after fiber f returned from the kernel: its stack back to the pool; when it was
// its block's last, the block's place to the next block; when the launch's last, the launch done.
void fiber_finished(Fiber* f) {
  Launch* L = f->launch;
  unsigned char* m = f->map;
  f->map = nullptr;
  put_stack(m);
  const int b = f->block->index;
  if (L->live[b].fetch_sub(1) != 1) return;
  const uint64_t now = hccc_clock();
  int admit = -1;
  {
    std::lock_guard<std::mutex> lock(L->mu);
    if (L->next_block < L->grid) admit = L->next_block++;
    if (--L->blocks_left == 0) {
      L->t_end = now;
      L->cv.notify_all();  // (under the lock: the waiter frees the launch once it has it)
    }
  }
  if (admit >= 0) L->admit(admit);  // a block not yet run: the launch is not finished
}

void free_stacks(Launch* L) {
  const size_t n = (size_t)L->grid * (size_t)L->nthreads;
  for (size_t i = 0; i < n; ++i) {
    put_stack(L->fibers[i].map);
    L->fibers[i].map = nullptr;
  }
}

}  // namespace

HCCC_CPU_API void hccc_cpu_abi(uint64_t* out) {
  out[0] = sizeof(hccc_args);
  out[1] = sizeof(hccc_conn);
  out[2] = sizeof(hccc_error);
  out[3] = HCCC_NSLOTS;
}

HCCC_CPU_API uint64_t hccc_cpu_now_ns() { return hccc_clock(); }

HCCC_CPU_API void hccc_cpu_configure(int workers) {
  Scheduler& s = sched();
  std::lock_guard<std::mutex> lock(s.mu);
  s.nworkers = workers < 1 ? 1 : workers > HCCC_CPU_MAX_WORKERS ? HCCC_CPU_MAX_WORKERS : workers;
}

HCCC_CPU_API int hccc_cpu_os_threads() { return sched().threads.load(); }

HCCC_CPU_API void hccc_cpu_start(void* h) {
  Launch* L = static_cast<Launch*>(h);
  int n;
  {
    std::lock_guard<std::mutex> lock(L->mu);
    if (L->gate != 0) return;
    L->gate = 1;
    L->t_start = hccc_clock();
    if (L->blocks_left == 0) L->t_end = L->t_start;
    n = L->first_admitted();
    L->next_block = n;
  }
  // block n - 1 is admitted last: until then the launch cannot finish
  for (int b = 0; b < n; ++b) L->admit(b);
}

static void* launch(void* fn, int grid, int block, const void* args, uint64_t nargs, int resident, int start,
                    char* err, uint64_t nerr);

// A launch the system has no memory for (the blocks, the thread table) fails with a message, never
// with an exception through the C interface (which would abort the process).
HCCC_CPU_API void* hccc_cpu_launch(void* fn, int grid, int block, const void* args, uint64_t nargs,
                                   int resident, int start, char* err, uint64_t nerr) {
  try {
    return launch(fn, grid, block, args, nargs, resident, start, err, nerr);
  } catch (const std::bad_alloc&) {
    snprintf(err, nerr, "out of memory for the launch of %d x %d threads", grid, block);
  } catch (...) {
    snprintf(err, nerr, "the launch of %d x %d threads failed", grid, block);
  }
  return nullptr;
}

static void* launch(void* fn, int grid, int block, const void* args, uint64_t nargs, int resident, int start,
                    char* err, uint64_t nerr) {
  const bool known = nargs == sizeof(hccc_args) || nargs == sizeof(hccc_cpu_table_args) ||
                     nargs == sizeof(hccc_grid_args) || nargs == sizeof(hccc_cpu_table_grid_args);
  if (!known || grid < 0 || block < 1 || resident < 0) {
    snprintf(err, nerr, "bad launch: grid %d, block %d, %d resident, %llu argument bytes (expected %zu, %zu, %zu or %zu)",
             grid, block, resident, (unsigned long long)nargs, sizeof(hccc_args), sizeof(hccc_cpu_table_args),
             sizeof(hccc_grid_args), sizeof(hccc_cpu_table_grid_args));
    return nullptr;
  }
  std::unique_ptr<Launch> L(new Launch());
  memset(&L->args, 0, sizeof(L->args));
  memcpy(&L->args, args, (size_t)nargs);
  L->kind = nargs == sizeof(hccc_args) ? HCCC_CPU_RANK
            : nargs == sizeof(hccc_cpu_table_args) ? HCCC_CPU_TABLE
            : nargs == sizeof(hccc_grid_args) ? HCCC_CPU_GRID : HCCC_CPU_TABLE_GRID;
  L->kernel = reinterpret_cast<hccc_cpu_kernel>(fn);
  L->grid = grid;
  L->nthreads = block;
  L->resident = resident;
  L->blocks.reserve((size_t)grid);
  for (int b = 0; b < grid; ++b) {
    L->blocks.emplace_back(new hccc_cpu_block());
    hccc_cpu_block_init(L->blocks.back().get(), b, block);
  }
  // Every fiber's stack now, so a launch that cannot have them fails before any block runs.
  const size_t nthreads = (size_t)grid * (size_t)block;
  L->fibers.reset(new Fiber[nthreads]);
  L->live.reset(new std::atomic<int>[(size_t)grid]);
  for (int b = 0; b < grid; ++b) L->live[b].store(block);
  for (size_t i = 0; i < nthreads; ++i) {
    Fiber& f = L->fibers[i];
    f.launch = L.get();
    f.block = L->blocks[i / (size_t)block].get();
    f.tid = (int)(i % (size_t)block);
    f.map = get_stack();
    if (f.map == nullptr) {
      snprintf(err, nerr, "cannot start %d x %d threads (%zu stacks of %d bytes mapped): %s", grid, block, i,
               (int)HCCC_CPU_STACK_BYTES, strerror(errno));
      free_stacks(L.get());
      return nullptr;
    }
  }
  L->blocks_left = grid;
  if (start) hccc_cpu_start(L.get());
  return L.release();
}

HCCC_CPU_API int hccc_cpu_wait(void* h, double timeout_s) {
  Launch* L = static_cast<Launch*>(h);
  std::unique_lock<std::mutex> lock(L->mu);
  if (timeout_s < 0) {
    L->cv.wait(lock, [L] { return L->blocks_left == 0; });
    return 0;
  }
  const bool done = L->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                   [L] { return L->blocks_left == 0; });
  return done ? 0 : 1;
}

HCCC_CPU_API void hccc_cpu_times(void* h, uint64_t* start, uint64_t* end) {
  Launch* L = static_cast<Launch*>(h);
  std::lock_guard<std::mutex> lock(L->mu);
  *start = L->t_start;
  *end = L->t_end;
}

HCCC_CPU_API void hccc_cpu_release(void* h) {
  Launch* L = static_cast<Launch*>(h);
  {
    std::unique_lock<std::mutex> lock(L->mu);
    L->cv.wait(lock, [L] { return L->gate == 0 || L->blocks_left == 0; });
  }
  free_stacks(L);  // a held launch's, never run
  delete L;
}
