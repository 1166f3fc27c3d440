// slot_anatomy.cu -- what one unit of hccc's kernels costs a thread block, taken apart on one GPU.
//
// Built by benchmarks/slot_anatomy.py against the headers hccc emits (hccc_prims.h: the same
// engine, hccc_run, every generated kernel runs), for CUDA (nvcc) or, to test this program, for
// the CPU emulation (g++ -DHCCC_PLATFORM_CPU). Prints one JSON object per line:
//   {"exp": "pingpong", "flavour": ..., "us_round_trip": ...}
//       two blocks on two SMs pass a flag back and forth (thread 0 each) with each ordering
//   {"exp": "units", "op": ..., "threads": ..., "slice": ..., "bytes": ..., "units": ..., "us": ...}
//       one block runs one primitive over `bytes` in units of `slice` bytes, its peers
//       pre-satisfied (head, tail, progress counters far ahead): the real code of a unit
//   {"exp": "grid", "blocks": ..., "us": ...}
//       block 0 runs COPY units while every other block of a full grid waits for its progress
//       counter (their sync lanes poll, their data warps wait at a barrier)
//   {"exp": "launch", "kind": ..., "blocks": ..., "rows": ..., "threads": ..., "us": ..., "us_each": ...}
//       what a launch costs by its blocks: an empty kernel ("empty"), and the engine whose every
//       block runs `rows` NOP rows of one micro-batch and waits for nothing ("engine"; launched
//       cooperatively too where the platform has it, "engine, cooperative", as a one-grid call is):
//       `us` one launch alone, start to end (the median), `us_each` one of a back-to-back series
//   {"exp": "timer", "streams": ..., "kernels": ..., "blocks": ..., "us": ...}
//       an empty kernel of `blocks` blocks (`kernels` of them, one a stream) timed as the runtime
//       times a call (hccc.runtime.gpu_timing.GpuTimer with no stream: a gate kernel on a control
//       stream, the start event behind it, every one of `streams` streams waiting for it, then an
//       event on each joined on the control stream before the stop event; the gate opened last);
//       `streams` 0: a plain event pair on one stream (the CPU emulation has only this one)
// Arguments: quick|full [cpu-scale].
#include "hccc_prims.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

// ---------------------------------------------------------------------------- platform glue
#if defined(HCCC_PLATFORM_CPU)
static void* dmalloc(size_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, 256, n ? n : 16) != 0) abort();
  memset(p, 0, n ? n : 16);
  return p;
}
static void dfree(void* p) { free(p); }
static void dset(void* p, int v, size_t n) { memset(p, v, n); }
static void h2d(void* d, const void* h, size_t n) { memcpy(d, h, n); }
static void d2h(void* h, const void* d, size_t n) { memcpy(h, d, n); }
// One launch: every block a group of threads, all at once; milliseconds.
template <typename Args>
static double launch_ms(void (*kernel)(Args), int grid, int block, const Args& a) {
  std::vector<hccc_cpu_block*> blocks;
  std::vector<std::thread> ts;
  for (int b = 0; b < grid; ++b) {
    blocks.push_back(new hccc_cpu_block);
    hccc_cpu_block_init(blocks.back(), b, block);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int b = 0; b < grid; ++b)
    for (int t = 0; t < block; ++t)
      ts.emplace_back([=, &a] { hccc_cpu_run_thread(kernel, a, blocks[b], t); });
  for (auto& t : ts) t.join();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (auto* b : blocks) delete b;
  return ms;
}
template <typename Args>
static double launch_coop_ms(void (*kernel)(Args), int grid, int block, const Args& a) {
  return launch_ms(kernel, grid, block, a);
}
template <typename Args>
static double launch_series_ms(void (*kernel)(Args), int grid, int block, const Args& a, int n) {
  double ms = 0;
  for (int i = 0; i < n; ++i) ms += launch_ms(kernel, grid, block, a);
  return ms / n;
}
static bool has_cooperative_launch() { return true; }
static int resident_blocks(int) { return 4; }
static const char* device_name() { return "CPU emulation"; }
#else
#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)
static void* dmalloc(size_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, n ? n : 16));
  CK(cudaMemset(p, 0, n ? n : 16));
  return p;
}
static void dfree(void* p) { CK(cudaFree(p)); }
static void dset(void* p, int v, size_t n) { CK(cudaMemset(p, v, n)); }
static void h2d(void* d, const void* h, size_t n) { CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
static void d2h(void* h, const void* d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }
// Milliseconds between an event recorded on `stream`, what `enqueue` queues and an event after it;
// `before_wait` runs once both are queued (the gated timer opens its gate there).
template <typename F, typename G>
static double timed_ms(cudaStream_t stream, F&& enqueue, G&& before_wait) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, stream));
  enqueue();
  CK(cudaGetLastError());
  CK(cudaEventRecord(e1, stream));
  before_wait();
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ms;
}
template <typename F>
static double timed_ms(F&& enqueue) {
  return timed_ms(0, enqueue, [] {});
}
template <typename Args>
static double launch_ms(void (*kernel)(Args), int grid, int block, const Args& a) {
  return timed_ms([&] { kernel<<<grid, block>>>(a); });
}
// One cooperative launch (as the runtime launches a one-grid call); milliseconds.
template <typename Args>
static double launch_coop_ms(void (*kernel)(Args), int grid, int block, const Args& a) {
  void* params[] = {(void*)&a};
  return timed_ms([&] { CK(cudaLaunchCooperativeKernel((const void*)kernel, grid, block, params, 0, 0)); });
}
// `n` launches back to back between two events; milliseconds for each.
template <typename Args>
static double launch_series_ms(void (*kernel)(Args), int grid, int block, const Args& a, int n) {
  return timed_ms([&] {
           for (int i = 0; i < n; ++i) kernel<<<grid, block>>>(a);
         }) / n;
}
static bool has_cooperative_launch() {
  int dev = 0, coop = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  return coop != 0;
}
template <typename Args>
static int resident_blocks_of(void (*kernel)(Args), int block) {
  int per_sm = 0, sms = 0, dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return per_sm * sms;
}
static const char* device_name() {
  static cudaDeviceProp p;
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}
#endif

// ---------------------------------------------------------------------------- flag ping-pong
enum { PP_RELAXED, PP_HCCC, PP_ACQREL_OPS, PP_FULL_FENCES, PP_HCCC_SYS, PP_NCCL_SIMPLE, PP_N };
static const char* const PP_NAME[PP_N] = {
    "relaxed poll / relaxed post (floor)",
    "hccc v4, one GPU: relaxed poll + fence.acquire / fence.release + relaxed post",
    "ld.acquire.gpu / st.release.gpu",
    "relaxed poll + fence.acq_rel.gpu / fence.acq_rel.gpu + relaxed post (hccc v3)",
    "hccc v4 across GPUs: the same at system scope",
    "NCCL Simple: volatile poll / fence.acq_rel.sys + volatile post"};
struct pp_args {
  uint64_t* flags;   // [0]: block 0 waits on it, [16]: block 1 waits on it (separate lines)
  int rounds;
  int flavour;
};
#if defined(HCCC_PLATFORM_CPU)
static uint64_t pp_poll(const uint64_t* p, int) { return hccc_poll_peer(p); }
static void pp_acquire(int) { hccc_acquire_peer(); }
static void pp_release(int) { hccc_release_peer(); }
static void pp_post(uint64_t* p, uint64_t v, int) { hccc_post_peer(p, v); }
#else
static __device__ __forceinline__ uint64_t pp_poll(const uint64_t* p, int f) {
  uint64_t v;
  if (f == PP_ACQREL_OPS)
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else if (f == PP_HCCC_SYS)
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else if (f == PP_NCCL_SIMPLE)
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else
    v = hccc_poll_peer(p);
  return v;
}
static __device__ __forceinline__ void pp_acquire(int f) {
  if (f == PP_HCCC) hccc_acquire_peer();
  else if (f == PP_FULL_FENCES) asm volatile("fence.acq_rel.gpu;" ::: "memory");
  else if (f == PP_HCCC_SYS) asm volatile(HCCC_FENCE_ACQ "sys;" ::: "memory");
}
static __device__ __forceinline__ void pp_release(int f) {
  if (f == PP_HCCC) hccc_release_peer();
  else if (f == PP_FULL_FENCES) asm volatile("fence.acq_rel.gpu;" ::: "memory");
  else if (f == PP_HCCC_SYS) asm volatile(HCCC_FENCE_REL "sys;" ::: "memory");
  else if (f == PP_NCCL_SIMPLE) asm volatile("fence.acq_rel.sys;" ::: "memory");
}
static __device__ __forceinline__ void pp_post(uint64_t* p, uint64_t v, int f) {
  if (f == PP_ACQREL_OPS)
    asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
  else if (f == PP_HCCC_SYS)
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
  else if (f == PP_NCCL_SIMPLE)
    asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
  else
    hccc_post_peer(p, v);
}
#endif
HCCC_GLOBAL void anatomy_pingpong(const pp_args x) {
  if (hccc_tid() != 0) return;
  const int me = hccc_block();
  uint64_t* mine = x.flags + 16 * me;
  uint64_t* theirs = x.flags + 16 * (1 - me);
  for (int r = 0; r < x.rounds; ++r) {
    const uint64_t v = 2ull * r + 1;
    if (me == 0) {
      pp_release(x.flavour);
      pp_post(theirs, v, x.flavour);
      while (pp_poll(mine, x.flavour) < v + 1) hccc_spin_pause();
      pp_acquire(x.flavour);
    } else {
      while (pp_poll(mine, x.flavour) < v) hccc_spin_pause();
      pp_acquire(x.flavour);
      pp_release(x.flavour);
      pp_post(theirs, v + 1, x.flavour);
    }
  }
}

// ---------------------------------------------------------------------------- launches
HCCC_GLOBAL void HCCC_LAUNCH_BOUNDS(512) anatomy_empty(const pp_args x) {
  if (x.rounds < 0 && hccc_tid() == 0) x.flags[0] = 1;   // never taken: keeps the argument live
}
#if !defined(HCCC_PLATFORM_CPU)
// The runtime's gate kernel: spins until the host sets *flag (a mapped host word).
HCCC_GLOBAL void anatomy_gate(const pp_args x) {
  if (hccc_tid() != 0) return;
  while (hccc_load_u32((const uint32_t*)x.flags) == 0u) hccc_spin_pause();
}
// `kernels` empty kernels of `blocks` blocks, one on each of the first `kernels` of `nstreams`
// streams, timed as GpuTimer does with no stream (see the "timer" rows); milliseconds.
static double gated_ms(int nstreams, int kernels, int blocks, int block) {
  static std::vector<cudaStream_t> streams;
  static cudaStream_t ctl = nullptr;
  if (ctl == nullptr) CK(cudaStreamCreateWithFlags(&ctl, cudaStreamNonBlocking));
  while ((int)streams.size() < nstreams) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    streams.push_back(st);
  }
  uint32_t* hflag = nullptr;
  uint32_t* dflag = nullptr;
  CK(cudaHostAlloc((void**)&hflag, 8, cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void**)&dflag, hflag, 0));
  *(volatile uint32_t*)hflag = 0;
  uint64_t* scratch = (uint64_t*)dmalloc(16 * sizeof(uint64_t));
  const pp_args e{scratch, 0, 0};
  anatomy_gate<<<1, 1, 0, ctl>>>(pp_args{(uint64_t*)dflag, 0, 0});
  const double ms = timed_ms(
      ctl,
      [&] {
        cudaEvent_t e0;
        CK(cudaEventCreateWithFlags(&e0, cudaEventDisableTiming));
        CK(cudaEventRecord(e0, ctl));
        for (int i = 0; i < nstreams; ++i) CK(cudaStreamWaitEvent(streams[i], e0, 0));
        CK(cudaEventDestroy(e0));
        for (int k = 0; k < kernels; ++k) anatomy_empty<<<blocks, block, 0, streams[k % nstreams]>>>(e);
        CK(cudaGetLastError());
        for (int i = 0; i < nstreams; ++i) {
          cudaEvent_t ev;
          CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
          CK(cudaEventRecord(ev, streams[i]));
          CK(cudaStreamWaitEvent(ctl, ev, 0));
          CK(cudaEventDestroy(ev));
        }
      },
      [&] { *(volatile uint32_t*)hflag = 1; });
  CK(cudaFreeHost(hflag));
  dfree(scratch);
  return ms;
}
#endif

// ---------------------------------------------------------------------------- engine units
struct unit_args {
  hccc_args a;
  hccc_program prog;
};
HCCC_GLOBAL void HCCC_LAUNCH_BOUNDS(512) anatomy_units(const HCCC_GRID_CONSTANT unit_args x) {
  hccc_run<float, HCCC_SUM>(&x.a, x.prog, hccc_block());
}

static const uint64_t FAR = 1ull << 50;        // a counter far ahead: every wait met at once
static const int SLOT_BYTES_MAX = 1 << 20;     // the slot capacity (largest slice)

// Device memory of one experiment: buffers, one send and one receive connection whose counters
// are pre-set, progress counters, the program.
struct rig {
  float *in, *out;
  char *sslots, *rslots;
  uint64_t* ctrl;        // [0] send head (far), [1] send tail, [2] recv tail (far), [3] recv head,
                         // [4] abort flag word, [8..] progress
  hccc_conn* conns;      // [0] send, [1] recv
  hccc_error* err;
  hccc_rank_consts* consts;
  hccc_pd* prims;
  int32_t* deps;
  hccc_tb_range* tbs;
  size_t bytes;
  int max_tbs;
};

static size_t slot_bytes() { return (size_t)HCCC_SLOT_BYTES((uint64_t)SLOT_BYTES_MAX, 1ull); }

static rig rig_new(size_t bytes, int max_tbs) {
  rig g;
  g.bytes = bytes;
  g.max_tbs = max_tbs;
  g.in = (float*)dmalloc(bytes);
  g.out = (float*)dmalloc(bytes);
  g.sslots = (char*)dmalloc(HCCC_NSLOTS * slot_bytes());
  g.rslots = (char*)dmalloc(HCCC_NSLOTS * slot_bytes());
  g.ctrl = (uint64_t*)dmalloc(64 * sizeof(uint64_t));
  g.conns = (hccc_conn*)dmalloc(2 * sizeof(hccc_conn));
  g.err = (hccc_error*)dmalloc(sizeof(hccc_error));
  g.consts = (hccc_rank_consts*)dmalloc(sizeof(hccc_rank_consts));
  g.prims = (hccc_pd*)dmalloc((size_t)(max_tbs + 2) * sizeof(hccc_pd));
  g.deps = (int32_t*)dmalloc((size_t)(max_tbs + 2) * sizeof(int32_t));
  g.tbs = (hccc_tb_range*)dmalloc((size_t)(max_tbs + 1) * sizeof(hccc_tb_range));
  hccc_conn c[2];
  c[0].slots = g.sslots;
  c[0].head = g.ctrl + 0;
  c[0].tail = g.ctrl + 1;
  c[1].slots = g.rslots;
  c[1].tail = g.ctrl + 2;
  c[1].head = g.ctrl + 3;
  h2d(g.conns, c, sizeof c);
  return g;
}

static void rig_free(rig& g) {
  for (void* p : {(void*)g.in, (void*)g.out, (void*)g.sslots, (void*)g.rslots, (void*)g.ctrl,
                  (void*)g.conns, (void*)g.err, (void*)g.consts, (void*)g.prims, (void*)g.deps,
                  (void*)g.tbs})
    dfree(p);
}

static hccc_pd pd(int op) {
  hccc_pd d;
  memset(&d, 0, sizeof d);
  d.op = op;
  d.sconn = d.rconn = -1;
  d.sbuf = d.dbuf = d.pbuf = HCCC_BUF_NONE;
  d.cnt = 1;
  d.post = -1;
  d.task = -1;
  const bool snd = op == HCCC_SEND || op == HCCC_RECV_COPY_SEND || op == HCCC_RECV_REDUCE_SEND;
  const bool rcv = op == HCCC_RECV || op == HCCC_RECV_REDUCE_COPY || op == HCCC_RECV_COPY_SEND ||
                   op == HCCC_RECV_REDUCE_SEND;
  if (snd) d.sconn = 0;
  if (rcv) d.rconn = 0;
  if (op == HCCC_SEND || op == HCCC_COPY || op == HCCC_RECV_REDUCE_COPY || op == HCCC_RECV_REDUCE_SEND)
    d.sbuf = HCCC_BUF_INPUT;
  if (op == HCCC_RECV || op == HCCC_COPY || op == HCCC_RECV_REDUCE_COPY || op == HCCC_RECV_COPY_SEND)
    d.dbuf = HCCC_BUF_OUTPUT;
  return d;
}

// TB 0 runs `first`, then a NOP that posts progress counter 2 for each micro-batch; TBs 1 ..
// nwait each run a NOP that waits for that counter. Returns microseconds of one launch (the
// median of `reps`).
static double run_units(rig& g, hccc_pd first, size_t bytes, int slice, int threads, int nwait,
                        int reps) {
  const int ntbs = 1 + nwait;
  hccc_rank_consts k = {0, 1, 0, 0, SLOT_BYTES_MAX, 1, ntbs, 1, 1, 1, 4};
  h2d(g.consts, &k, sizeof k);
  // rows: 0 `first`, 1 the posting NOP, 2 .. 1 + nwait the waiters' NOPs
  std::vector<hccc_pd> rows((size_t)2 + nwait);
  rows[0] = first;
  rows[1] = pd(HCCC_NOP);
  rows[1].cnt = 0;
  rows[1].post = 2;
  rows[1].seq = 1;
  for (int w = 0; w < nwait; ++w) {
    rows[2 + w] = pd(HCCC_NOP);
    rows[2 + w].cnt = 0;
    rows[2 + w].ndeps = 1;
  }
  // awaited counters in row order: `first`'s (progress 0, met) if it has one, then the waiters'
  const int nd0 = first.ndeps > 0 ? 1 : 0;
  std::vector<int32_t> deps((size_t)nd0 + nwait + 1, 2);
  if (nd0) deps[0] = 0;
  std::vector<hccc_tb_range> tbs((size_t)ntbs + 1);
  tbs[0] = {0u, 0u};
  for (int t = 1; t <= ntbs; ++t) tbs[t] = {(uint32_t)(1 + t), (uint32_t)(nd0 + t - 1)};
  h2d(g.prims, rows.data(), rows.size() * sizeof(hccc_pd));
  h2d(g.deps, deps.data(), deps.size() * sizeof(int32_t));
  h2d(g.tbs, tbs.data(), tbs.size() * sizeof(hccc_tb_range));
  unit_args x;
  memset(&x, 0, sizeof x);
  x.a.input = g.in;
  x.a.output = g.out;
  x.a.count = bytes / sizeof(float);
  x.a.send_conns = g.conns;
  x.a.recv_conns = g.conns + 1;
  x.a.progress = g.ctrl + 8;
  x.a.abort_flag = (uint32_t*)(g.ctrl + 4);
  x.a.error = g.err;
  x.a.timeout = 20ull * 1000 * 1000 * 1000;   // 20 s (ns)
  x.a.slice_bytes = (uint64_t)slice;
  x.a.proto = HCCC_PROTO_SIMPLE;
  x.prog = hccc_program{g.consts, g.prims, g.deps, g.tbs};
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    uint64_t ctrl[64];
    memset(ctrl, 0, sizeof ctrl);
    ctrl[0] = ctrl[2] = FAR;
    ctrl[8] = FAR;   // progress 0: the met dependency
    h2d(g.ctrl, ctrl, sizeof ctrl);
    dset(g.err, 0, sizeof(hccc_error));
    const double ms = launch_ms(anatomy_units, ntbs, threads, x);
    uint32_t abort_word = 0;
    d2h(&abort_word, g.ctrl + 4, sizeof abort_word);
    if (abort_word != 0) {
      fprintf(stderr, "slot_anatomy: a unit run gave up (op %d, slice %d, threads %d)\n", first.op,
              slice, threads);
      exit(1);
    }
    if (r > 0) t.push_back(ms * 1000.0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Every one of `blocks` TBs runs `rows` NOP rows over one micro-batch of 4 KiB, no dependency,
// no post: what the engine's start (its program read and decoded), its rows and its end cost.
// Returns (microseconds of one launch alone: the median of `reps`; of one of `reps` back to back).
struct launch_times { double alone, each; };
static launch_times run_launch(int blocks, int rows_per_tb, int threads, bool cooperative, int reps) {
  const size_t bytes = 4096;
  float* buf = (float*)dmalloc(bytes);
  uint64_t* ctrl = (uint64_t*)dmalloc(64 * sizeof(uint64_t));
  hccc_error* err = (hccc_error*)dmalloc(sizeof(hccc_error));
  hccc_rank_consts* consts = (hccc_rank_consts*)dmalloc(sizeof(hccc_rank_consts));
  const size_t nrows = (size_t)blocks * rows_per_tb;
  hccc_pd* prims = (hccc_pd*)dmalloc(nrows * sizeof(hccc_pd));
  int32_t* deps = (int32_t*)dmalloc(sizeof(int32_t));
  hccc_tb_range* tbs = (hccc_tb_range*)dmalloc((size_t)(blocks + 1) * sizeof(hccc_tb_range));
  hccc_rank_consts k = {0, 1, 0, 0, SLOT_BYTES_MAX, 1, blocks, 1, 1, 1, 4};
  h2d(consts, &k, sizeof k);
  std::vector<hccc_pd> rows(nrows, pd(HCCC_NOP));
  for (auto& r : rows) r.cnt = 0;
  std::vector<hccc_tb_range> t((size_t)blocks + 1);
  for (int b = 0; b <= blocks; ++b) t[b] = {(uint32_t)(b * rows_per_tb), 0u};
  h2d(prims, rows.data(), nrows * sizeof(hccc_pd));
  h2d(tbs, t.data(), t.size() * sizeof(hccc_tb_range));
  unit_args x;
  memset(&x, 0, sizeof x);
  x.a.input = buf;
  x.a.output = buf;
  x.a.count = bytes / sizeof(float);
  x.a.progress = ctrl + 8;
  x.a.abort_flag = (uint32_t*)(ctrl + 4);
  x.a.error = err;
  x.a.timeout = 20ull * 1000 * 1000 * 1000;
  x.a.slice_bytes = bytes;
  x.a.proto = HCCC_PROTO_SIMPLE;
  x.prog = hccc_program{consts, prims, deps, tbs};
  std::vector<double> alone;
  for (int r = 0; r < reps + 1; ++r) {
    const double ms = cooperative ? launch_coop_ms(anatomy_units, blocks, threads, x)
                                  : launch_ms(anatomy_units, blocks, threads, x);
    if (r > 0) alone.push_back(ms * 1000.0);
  }
  std::sort(alone.begin(), alone.end());
  const double each = cooperative ? alone[alone.size() / 2]
                                  : launch_series_ms(anatomy_units, blocks, threads, x, reps) * 1000.0;
  uint32_t abort_word = 0;
  d2h(&abort_word, ctrl + 4, sizeof abort_word);
  if (abort_word != 0) {
    fprintf(stderr, "slot_anatomy: a launch run gave up (%d blocks, %d rows)\n", blocks, rows_per_tb);
    exit(1);
  }
  for (void* p : {(void*)buf, (void*)ctrl, (void*)err, (void*)consts, (void*)prims, (void*)deps, (void*)tbs})
    dfree(p);
  return {alone[alone.size() / 2], each};
}

static bool check_copy(rig& g, size_t bytes) {
  std::vector<float> a(bytes / sizeof(float)), b(bytes / sizeof(float));
  d2h(a.data(), g.in, bytes);
  d2h(b.data(), g.out, bytes);
  return memcmp(a.data(), b.data(), bytes) == 0;
}

int main(int argc, char** argv) {
  const bool full = argc > 1 && strcmp(argv[1], "full") == 0;
  // the mode "copy": the copy engine's rows alone ({"exp": "copy", ...}, below); the device row
  // says whether the engine was built with bulk copies (HCCC_BULK_COPIES: -DHCCC_TMA=1 on sm_90,
  // or the CPU emulation's model of them)
  const bool copy_only = argc > 1 && strcmp(argv[1], "copy") == 0;
  const double scale = argc > 2 ? atof(argv[2]) : 1.0;   // the CPU test shrinks everything
  printf("{\"exp\": \"device\", \"name\": \"%s\", \"warp\": %d, \"nslots\": %d, \"bulk_copies\": %d}\n",
         device_name(), HCCC_WARP_SIZE, HCCC_NSLOTS, HCCC_BULK_COPIES);
  fflush(stdout);
  // A: ping-pong
  if (!copy_only) {
    uint64_t* flags = (uint64_t*)dmalloc(32 * sizeof(uint64_t));
    const int rounds = std::max(10, (int)(20000 * scale));
#if defined(HCCC_PLATFORM_CPU)
    const int flavours[] = {PP_HCCC};
#else
    const int flavours[] = {PP_RELAXED, PP_HCCC, PP_ACQREL_OPS, PP_FULL_FENCES, PP_HCCC_SYS, PP_NCCL_SIMPLE};
#endif
    for (int f : flavours) {
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        dset(flags, 0, 32 * sizeof(uint64_t));
        const double ms = launch_ms(anatomy_pingpong, 2, 32, pp_args{flags, rounds, f});
        best = std::min(best, ms);
      }
      printf("{\"exp\": \"pingpong\", \"flavour\": \"%s\", \"rounds\": %d, \"us_round_trip\": %.4f}\n",
             PP_NAME[f], rounds, best * 1000.0 / rounds);
      fflush(stdout);
    }
    dfree(flags);
  }
  // B: units of the real engine, peers pre-satisfied; the slope over units at a fixed byte count
  const size_t unit_bytes = (size_t)(4 << 20) * scale >= 4096 ? (size_t)((4 << 20) * scale) / 4096 * 4096 : 4096;
  const size_t copy_bytes = (size_t)(64 << 20) * scale >= 65536 ? (size_t)((64 << 20) * scale) / 65536 * 65536 : 65536;
  rig g = rig_new(std::max(unit_bytes, copy_bytes), 4096);
  {
    std::vector<float> h(g.bytes / sizeof(float));
    for (size_t i = 0; i < h.size(); ++i) h[i] = (float)(i % 1009) - 500.0f;
    h2d(g.in, h.data(), g.bytes);
  }
  struct opdef { const char* name; hccc_pd d; };
  hccc_pd dep = pd(HCCC_SEND);
  dep.ndeps = 1;
  std::vector<opdef> ops = {{"COPY", pd(HCCC_COPY)}, {"SEND", pd(HCCC_SEND)}, {"RECV", pd(HCCC_RECV)},
                            {"RECV_REDUCE_COPY", pd(HCCC_RECV_REDUCE_COPY)}, {"SEND after a met dependency", dep}};
#if defined(HCCC_PLATFORM_CPU)
  const int thread_set[] = {1, 2, 3};
#else
  const int thread_set_quick[] = {32, 128, 512};
  const int thread_set_full[] = {32, 64, 128, 256, 512};
#endif
  const int slices_quick[] = {65536, 16384, 4096, 1024};
  const int slices_full[] = {262144, 65536, 32768, 16384, 8192, 4096, 2048, 1024};
  const int* slices = full ? slices_full : slices_quick;
  const int nslices = full ? 8 : 4;
#if defined(HCCC_PLATFORM_CPU)
  const int* threads = thread_set;
  const int nthreadsets = 3;
#else
  const int* threads = full ? thread_set_full : thread_set_quick;
  const int nthreadsets = full ? 5 : 3;
#endif
  const int reps = full ? 5 : 3;
  if (!copy_only)
  for (const opdef& o : ops)
    for (int ti = 0; ti < nthreadsets; ++ti)
      for (int si = 0; si < nslices; ++si) {
        const int slice = slices[si];
        if ((size_t)slice > unit_bytes) continue;
        const double us = run_units(g, o.d, unit_bytes, slice, threads[ti], 0, reps);
        const size_t units = (unit_bytes + slice - 1) / slice;
        printf("{\"exp\": \"units\", \"op\": \"%s\", \"threads\": %d, \"slice\": %d, \"bytes\": %zu, "
               "\"units\": %zu, \"us\": %.3f}\n", o.name, threads[ti], slice, unit_bytes, units, us);
        fflush(stdout);
      }
  // the copy engine of one block: COPY units of 4 KiB .. 512 KiB over copy_bytes
  const int copy_slices[] = {4096, 16384, 65536, 262144, 524288};
  for (int ti = 0; ti < nthreadsets; ++ti)
    for (int slice : copy_slices) {
      if ((size_t)slice > copy_bytes) continue;
      dset(g.out, 0, copy_bytes);
      const double us = run_units(g, pd(HCCC_COPY), copy_bytes, slice, threads[ti], 0, reps);
      const bool ok = check_copy(g, copy_bytes);
      printf("{\"exp\": \"copy\", \"threads\": %d, \"slice\": %d, \"bytes\": %zu, \"us\": %.3f, "
             "\"GBps\": %.2f, \"correct\": %s}\n", threads[ti], slice, copy_bytes, us,
             copy_bytes / us / 1000.0, ok ? "true" : "false");
      fflush(stdout);
    }
  // C: block 0's COPY units, alone and with every other block of a full grid waiting
  if (!copy_only) {
    const int block = threads[nthreadsets - 1];
#if defined(HCCC_PLATFORM_CPU)
    const int full_grid = 4;
#else
    const int full_grid = std::min(resident_blocks_of(anatomy_units, block), g.max_tbs);
#endif
    const int slice = 65536 * scale >= 4096 ? (int)(65536 * scale) / 16 * 16 : 4096;
    for (int blocks : {1, full_grid}) {
      const double us = run_units(g, pd(HCCC_COPY), copy_bytes, slice, block, blocks - 1, reps);
      printf("{\"exp\": \"grid\", \"blocks\": %d, \"threads\": %d, \"slice\": %d, \"bytes\": %zu, "
             "\"us\": %.3f}\n", blocks, block, slice, copy_bytes, us);
      fflush(stdout);
    }
  }
  rig_free(g);
  // D: what a launch costs by its blocks: an empty kernel, the engine's start and rows
  if (!copy_only) {
    const int block = threads[nthreadsets - 1];
#if defined(HCCC_PLATFORM_CPU)
    const int grids[] = {1, 2, 4};
    const int ngrids = 3;
    const int most = 4;
#else
    const int grids[] = {1, 8, 16, 32, 64, 128, 256, 512};
    const int ngrids = 8;
    const int most = resident_blocks_of(anatomy_units, block);
#endif
    const int reps = full ? 20 : 10;
    const bool coop = has_cooperative_launch();
    for (int gi = 0; gi < ngrids; ++gi) {
      const int blocks = grids[gi];
      if (blocks > most) continue;
      {
        uint64_t* f = (uint64_t*)dmalloc(16 * sizeof(uint64_t));
        const pp_args e{f, 0, 0};
        std::vector<double> alone;
        for (int r = 0; r < reps + 1; ++r) {
          const double ms = launch_ms(anatomy_empty, blocks, block, e);
          if (r > 0) alone.push_back(ms * 1000.0);
        }
        std::sort(alone.begin(), alone.end());
        const double each = launch_series_ms(anatomy_empty, blocks, block, e, reps) * 1000.0;
        printf("{\"exp\": \"launch\", \"kind\": \"empty\", \"blocks\": %d, \"rows\": 0, \"threads\": %d, "
               "\"us\": %.3f, \"us_each\": %.3f}\n", blocks, block, alone[alone.size() / 2], each);
        fflush(stdout);
        dfree(f);
      }
      for (int rows : {1, 16})
        for (int c = 0; c < (coop ? 2 : 1); ++c) {
          const launch_times lt = run_launch(blocks, rows, block, c == 1, reps);
          printf("{\"exp\": \"launch\", \"kind\": \"%s\", \"blocks\": %d, \"rows\": %d, \"threads\": %d, "
                 "\"us\": %.3f, \"us_each\": %.3f}\n", c ? "engine, cooperative" : "engine", blocks, rows,
                 block, lt.alone, lt.each);
          fflush(stdout);
        }
    }
  }
  // E: the runtime's timer around empty kernels, against a plain event pair
  if (!copy_only) {
    const int block = threads[nthreadsets - 1];
    const int reps = full ? 20 : 10;
    uint64_t* f = (uint64_t*)dmalloc(16 * sizeof(uint64_t));
    const pp_args e{f, 0, 0};
    for (int blocks : {8, 128}) {
      std::vector<double> t;
      for (int r = 0; r < reps + 1; ++r) {
        const double ms = launch_ms(anatomy_empty, blocks, block, e);
        if (r > 0) t.push_back(ms * 1000.0);
      }
      std::sort(t.begin(), t.end());
      printf("{\"exp\": \"timer\", \"streams\": 0, \"kernels\": 1, \"blocks\": %d, \"us\": %.3f}\n", blocks,
             t[t.size() / 2]);
      fflush(stdout);
#if !defined(HCCC_PLATFORM_CPU)
      const int variants[][2] = {{1, 1}, {8, 1}, {8, 8}};
      for (const auto& v : variants) {
        std::vector<double> g;
        for (int r = 0; r < reps + 1; ++r) {
          const double ms = gated_ms(v[0], v[1], blocks / v[1] > 0 ? blocks / v[1] : 1, block);
          if (r > 0) g.push_back(ms * 1000.0);
        }
        std::sort(g.begin(), g.end());
        printf("{\"exp\": \"timer\", \"streams\": %d, \"kernels\": %d, \"blocks\": %d, \"us\": %.3f}\n",
               v[0], v[1], blocks, g[g.size() / 2]);
        fflush(stdout);
      }
#endif
    }
    dfree(f);
  }
  printf("{\"exp\": \"done\"}\n");
  return 0;
}
