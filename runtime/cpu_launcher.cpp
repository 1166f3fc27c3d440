// Launcher of the CPU emulation platform (hccc.runtime.cpu), compiled into every CPU module next
// to the emitted rank kernels (hccc_cpu_emu.h models thread blocks as groups of OS threads).
//
// C API (loaded with ctypes):
//   hccc_cpu_abi(out[4])                    sizeof hccc_args, hccc_conn, hccc_error; HCCC_NSLOTS
//   hccc_cpu_now_ns()                       the clock the launches are timed with (steady clock)
//   hccc_cpu_launch(fn, grid, block, args, nargs, start, err, nerr)
//                                           create grid x block threads that run kernel fn on a copy
//                                           of args (one hccc_args; for the table mode's generic
//                                           kernels one hccc_args followed by the table's
//                                           address; for a one-grid entry hccc_grid_args, or the
//                                           table mode's hccc_table_grid_args: the argument's
//                                           size tells which), at once when start != 0, else
//                                           at hccc_cpu_start; returns a handle, or null with a
//                                           message in err (then nothing keeps running)
//   hccc_cpu_start(h)                       let the threads of a held launch run
//   hccc_cpu_wait(h, timeout_s)             0 once every thread has returned, 1 after timeout_s
//                                           seconds (timeout_s < 0: wait forever)
//   hccc_cpu_times(h, &start, &end)         launch time and time the last thread returned (ns)
//   hccc_cpu_release(h)                     join and free a finished launch
#include "hccc_prims.h"

#include <pthread.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

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

// Stack of each emulated GPU thread: the kernels need little, and thousands of threads may run.
#ifndef HCCC_CPU_STACK_BYTES
#define HCCC_CPU_STACK_BYTES (256 * 1024)
#endif

namespace {

struct Launch;

struct Worker {
  Launch* launch;
  hccc_cpu_kernel kernel;
  hccc_cpu_block* block;
  int tid;
};

struct Launch {
  union {
    hccc_cpu_table_args args;  // .table is used by table-mode kernels only
    hccc_grid_args grid;
    hccc_cpu_table_grid_args table_grid;
  };
  hccc_cpu_arg_kind kind = HCCC_CPU_RANK;
  std::vector<std::unique_ptr<hccc_cpu_block>> blocks;
  std::vector<Worker> workers;
  std::vector<pthread_t> threads;
  std::mutex mu;
  std::condition_variable cv;
  int gate = 0;  // 0: threads wait to start, 1: run the kernel, 2: leave without running it
  int running = 0;
  uint64_t t_start = 0, t_end = 0;

  void body(const Worker& w) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [this] { return gate != 0; });
      if (gate == 2) return;
    }
    switch (kind) {
      case HCCC_CPU_TABLE:
        hccc_cpu_run_thread(reinterpret_cast<hccc_cpu_table_kernel>(w.kernel), args, w.block, w.tid);
        break;
      case HCCC_CPU_GRID:
        hccc_cpu_run_thread(reinterpret_cast<hccc_cpu_grid_kernel>(w.kernel), grid, w.block, w.tid);
        break;
      case HCCC_CPU_TABLE_GRID:
        hccc_cpu_run_thread(reinterpret_cast<hccc_cpu_table_grid_kernel>(w.kernel), table_grid, w.block,
                            w.tid);
        break;
      default:
        hccc_cpu_run_thread(w.kernel, args.a, w.block, w.tid);
    }
    const uint64_t now = hccc_clock();
    std::lock_guard<std::mutex> lock(mu);
    if (--running == 0) {
      t_end = now;
      cv.notify_all();
    }
  }

  void open_gate(int value) {
    {
      std::lock_guard<std::mutex> lock(mu);
      gate = value;
    }
    cv.notify_all();
  }
};

void* thread_main(void* p) {
  const Worker* w = static_cast<const Worker*>(p);
  w->launch->body(*w);
  return nullptr;
}

}  // namespace

HCCC_CPU_API void hccc_cpu_abi(uint64_t* out) {
  out[0] = sizeof(hccc_args);
  out[1] = sizeof(hccc_conn);
  out[2] = sizeof(hccc_error);
  out[3] = HCCC_NSLOTS;
}

HCCC_CPU_API uint64_t hccc_cpu_now_ns() { return hccc_clock(); }

HCCC_CPU_API void hccc_cpu_start(void* h) {
  Launch* L = static_cast<Launch*>(h);
  {
    std::lock_guard<std::mutex> lock(L->mu);
    if (L->gate != 0) return;
    L->t_start = hccc_clock();
    if (L->running == 0) L->t_end = L->t_start;
  }
  L->open_gate(1);
}

static void* launch(void* fn, int grid, int block, const void* args, uint64_t nargs, int start, char* err,
                    uint64_t nerr);

// A launch the system has no memory for (the blocks, the thread table) fails with a message, never
// with an exception through the C interface (which would abort the process).
HCCC_CPU_API void* hccc_cpu_launch(void* fn, int grid, int block, const void* args, uint64_t nargs,
                                   int start, char* err, uint64_t nerr) {
  try {
    return launch(fn, grid, block, args, nargs, start, err, nerr);
  } catch (const std::bad_alloc&) {
    snprintf(err, nerr, "out of memory for the launch of %d x %d threads", grid, block);
  } catch (...) {
    snprintf(err, nerr, "the launch of %d x %d threads failed", grid, block);
  }
  return nullptr;
}

static void* launch(void* fn, int grid, int block, const void* args, uint64_t nargs, int start, char* err,
                    uint64_t nerr) {
  const bool known = nargs == sizeof(hccc_args) || nargs == sizeof(hccc_cpu_table_args) ||
                     nargs == sizeof(hccc_grid_args) || nargs == sizeof(hccc_cpu_table_grid_args);
  if (!known || grid < 0 || block < 1) {
    snprintf(err, nerr, "bad launch: grid %d, block %d, %llu argument bytes (expected %zu, %zu, %zu or %zu)",
             grid, block, (unsigned long long)nargs, sizeof(hccc_args), sizeof(hccc_cpu_table_args),
             sizeof(hccc_grid_args), sizeof(hccc_cpu_table_grid_args));
    return nullptr;
  }
  std::unique_ptr<Launch> L(new Launch());
  memset(&L->args, 0, sizeof(L->args));
  memcpy(&L->args, args, (size_t)nargs);
  L->kind = nargs == sizeof(hccc_args) ? HCCC_CPU_RANK
            : nargs == sizeof(hccc_cpu_table_args) ? HCCC_CPU_TABLE
            : nargs == sizeof(hccc_grid_args) ? HCCC_CPU_GRID : HCCC_CPU_TABLE_GRID;
  const hccc_cpu_kernel kernel = reinterpret_cast<hccc_cpu_kernel>(fn);
  L->blocks.reserve((size_t)grid);
  for (int b = 0; b < grid; ++b) {
    L->blocks.emplace_back(new hccc_cpu_block());
    hccc_cpu_block_init(L->blocks.back().get(), b, block);
  }
  // Start every thread behind a gate, so a failure to create one (out of threads) can still
  // cancel the launch before any TB runs (a partly started TB would wait at its barrier forever).
  const size_t nthreads = (size_t)grid * (size_t)block;
  L->workers.reserve(nthreads);
  for (int b = 0; b < grid; ++b)
    for (int t = 0; t < block; ++t)
      L->workers.push_back(Worker{L.get(), kernel, L->blocks[(size_t)b].get(), t});
  L->threads.reserve(nthreads);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, HCCC_CPU_STACK_BYTES);
  int rc = 0;
  for (size_t i = 0; i < nthreads && rc == 0; ++i) {
    pthread_t th;
    rc = pthread_create(&th, &attr, thread_main, &L->workers[i]);
    if (rc == 0) L->threads.push_back(th);
  }
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    snprintf(err, nerr, "cannot start %d x %d threads (%zu started): %s", grid, block,
             L->threads.size(), strerror(rc));
    L->open_gate(2);
    for (pthread_t th : L->threads) pthread_join(th, nullptr);
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(L->mu);
    L->running = (int)nthreads;
  }
  if (start) hccc_cpu_start(L.get());
  return L.release();
}

HCCC_CPU_API int hccc_cpu_wait(void* h, double timeout_s) {
  Launch* L = static_cast<Launch*>(h);
  std::unique_lock<std::mutex> lock(L->mu);
  if (timeout_s < 0) {
    L->cv.wait(lock, [L] { return L->running == 0; });
    return 0;
  }
  const bool done = L->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                   [L] { return L->running == 0; });
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
  for (pthread_t th : L->threads) pthread_join(th, nullptr);
  delete L;
}
