// Test program for hccc_host.h's AllToAllv call (tests/test_host_alltoallv.py): one process per
// rank of a float32 AllToAll program (forked; handles and barriers in shared anonymous memory),
// a call per counts matrix of COUNTS (int64, nranks x nranks per call, back to back) through
// hccc_host_proto / hccc_host_reset / hccc_host_args_v, every rank reading the matrix from its own
// memory (the CPU emulation's device memory). DISPLS ("-": packed) holds 2 x nranks x nranks int64
// per call (hccc_args::vdispls: every sd[o][p], then every rd[o][p]); MODE "inplace" runs with
// input == output. MAX bounds the counts (hccc_host_v_scratch(MAX) scratch elements). Rank r's
// send element i is r * 100000 + i + 1 (the receive buffer starts at -1); each rank writes its
// receive buffer of call k to OUT/r<r>_c<k>.bin, or prints "rank R call K error wait W entry E
// why O" when the kernels refuse the call (and stops). Every rank's buffers are exactly as long as
// the call's blocks need (every rank works them out from the matrix: hccc_args::vlens), or, with
// LENS, 2 x nranks int64 per call: every rank's send then receive buffer length, whatever the
// counts say (hostile calls; the buffers are allocated exactly that long, for AddressSanitizer).
//
//   host_alltoallv_ranks OUT COUNTS DISPLS MODE MAX [LENS]
//
// Compiled with the rank kernels and -DHCCC_PLATFORM_CPU=1 (g++, the CPU emulation).
#include "hccc_host.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

const int N = HCCC_HOST_NRANKS;

struct Shared {
  pthread_barrier_t barrier;
  hccc_host_handle handles[HCCC_HOST_NRANKS];
};

std::vector<int64_t> read_all(const char* path) {
  std::vector<int64_t> v;
  if (std::string(path) == "-") return v;
  FILE* f = fopen(path, "rb");
  if (!f) return v;
  int64_t x;
  while (fread(&x, sizeof x, 1, f) == 1) v.push_back(x);
  fclose(f);
  return v;
}

// Rank r's send and receive buffer lengths: where its last block ends.
void needed(const std::vector<int64_t>& counts, const std::vector<int64_t>& displs, int rank, bool inplace,
            int64_t* n_send, int64_t* n_recv) {
  uint64_t ns = 0, nr = 0, sd = 0, rd = 0;
  for (int p = 0; p < N; ++p) {
    const uint64_t cs = counts[rank * N + p], cr = counts[p * N + rank];
    const uint64_t so = displs.empty() ? sd : displs[rank * N + p];
    const uint64_t ro = displs.empty() ? rd : displs[N * N + rank * N + p];
    if (cs && so + cs > ns) ns = so + cs;
    if (cr && ro + cr > nr) nr = ro + cr;
    sd += cs;
    rd += cr;
  }
  if (inplace) ns = nr = ns > nr ? ns : nr;
  *n_send = (int64_t)ns;
  *n_recv = (int64_t)nr;
}

int run_rank(Shared* s, int rank, const char* out, const std::vector<int64_t>& all_counts,
             const std::vector<int64_t>& all_displs, const std::vector<int64_t>& all_lens, bool inplace,
             uint64_t max_count) {
  hccc_host_comm c;
  if (hccc_host_init(&c, rank)) {
    fprintf(stderr, "%s\n", c.error_text);
    return 1;
  }
  hccc_host_export(&c, &s->handles[rank]);
  pthread_barrier_wait(&s->barrier);
  if (hccc_host_connect(&c, s->handles)) {
    fprintf(stderr, "%s\n", c.error_text);
    return 1;
  }
  pthread_barrier_wait(&s->barrier);
  hccc_host_seal(&c);
  hccc_host_kernel kernels[] = HCCC_HOST_KERNELS(float32, sum);
  const size_t calls = all_counts.size() / (N * N);
  for (size_t k = 0; k < calls; ++k) {
    // this rank's copy of the call's matrix (and displacements): what the kernels read
    std::vector<int64_t> counts(all_counts.begin() + k * N * N, all_counts.begin() + (k + 1) * N * N);
    std::vector<int64_t> displs;
    if (!all_displs.empty())
      displs.assign(all_displs.begin() + k * 2 * N * N, all_displs.begin() + (k + 1) * 2 * N * N);
    // every rank's buffer lengths (the kernels check the blocks against them)
    std::vector<int64_t> lens(2 * N);
    if (!all_lens.empty())
      lens.assign(all_lens.begin() + k * 2 * N, all_lens.begin() + (k + 1) * 2 * N);
    else
      for (int r = 0; r < N; ++r) needed(counts, displs, r, inplace, &lens[r], &lens[N + r]);
    const uint64_t n_send = (uint64_t)lens[rank], n_recv = (uint64_t)lens[N + rank];
    // (at least one element: two empty buffers must not look like one, input == output)
    std::vector<float> in(n_send ? n_send : 1), sep(inplace || !n_recv ? 1 : n_recv, -1.0f);
    std::vector<float> scratch(hccc_host_v_scratch(max_count) + 1);
    for (uint64_t i = 0; i < n_send; ++i) in[i] = float(rank * 100000 + i + 1);
    float* dst = inplace ? in.data() : sep.data();
    const uint64_t count = hccc_host_v_count(max_count);
    const int p = hccc_host_proto(count, sizeof(float), HCCC_PROTO_SIMPLE);
    pthread_barrier_wait(&s->barrier);   // every rank finished its previous call
    hccc_host_reset(&c, p, count, sizeof(float));
    pthread_barrier_wait(&s->barrier);   // every rank has reset
    hccc_args a;
    if (hccc_host_args_v(&c, &a, in.data(), dst, scratch.data(), max_count, counts.data(),
                         displs.empty() ? nullptr : displs.data(), lens.data(), 20.0)) {
      fprintf(stderr, "%s\n", c.error_text);
      return 1;
    }
    if (hccc_host_launch(&c, kernels[rank], &a, 0) || hccc_host_wait(&c)) {
      fprintf(stderr, "%s\n", c.error_text);
      return 1;
    }
    hccc_error e;
    if (hccc_host_error(&c, &e)) {
      printf("rank %d call %zu error wait %d entry %d why %d\n", rank, k, e.wait, e.chunk, e.op);
      fflush(stdout);
      break;
    }
    std::string path = std::string(out) + "/r" + std::to_string(rank) + "_c" + std::to_string(k) + ".bin";
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(dst, sizeof(float), n_recv, f) != n_recv || fclose(f) != 0) {
      perror(path.c_str());
      return 1;
    }
  }
  hccc_host_destroy(&c);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    fprintf(stderr, "usage: %s OUT COUNTS DISPLS MODE MAX [LENS]\n", argv[0]);
    return 2;
  }
  const std::vector<int64_t> counts = read_all(argv[2]), displs = read_all(argv[3]);
  const std::vector<int64_t> lens = argc == 7 ? read_all(argv[6]) : std::vector<int64_t>();
  if (counts.empty() || counts.size() % (N * N)) return 2;
  const bool inplace = std::string(argv[4]) == "inplace";
  const uint64_t max_count = strtoull(argv[5], nullptr, 10);
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 2;
  Shared* s = static_cast<Shared*>(mem);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&s->barrier, &attr, N);
  std::vector<pid_t> kids;
  for (int r = 0; r < N; ++r) {
    fflush(stdout);
    const pid_t p = fork();
    if (p < 0) return 2;
    if (p == 0) {
      const int rc = run_rank(s, r, argv[1], counts, displs, lens, inplace, max_count);
      fflush(stdout);
      _exit(rc);
    }
    kids.push_back(p);
  }
  int failed = 0;
  for (pid_t p : kids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed ? 1 : 0;
}
