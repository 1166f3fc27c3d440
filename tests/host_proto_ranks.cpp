// Test program for hccc_host.h's protocol choice (tests/test_ll_launchers.py): one process per rank
// of a float32 / sum AllReduce (forked; handles and barriers in shared anonymous memory), a call per
// COUNT under the protocol WANT asks for (-1 auto, 0 Simple, 1 LL) through hccc_host_proto /
// hccc_host_reset / hccc_host_args (a COUNT written COUNT:W asks for W instead); odd calls run in
// place. Rank r's input element i of call k is ((7r + 3i + k) mod 17) - 8. Each rank writes its
// output of call k to OUT/r<r>_c<k>.bin and prints "rank R call K proto P epoch E zeroings Z" per
// call (the call's LL flag epoch and the slot zeroings so far). With LL_NEXT set, the epoch the
// next LL call gets is set to it after the first call (to reach the wrap).
//
//   host_proto_ranks OUT WANT COUNT[:W]...
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

struct Shared {
  pthread_barrier_t barrier;
  hccc_host_handle handles[HCCC_HOST_NRANKS];
};

int run_rank(Shared* s, int rank, const char* out, int want0, const std::vector<uint64_t>& counts,
             const std::vector<int>& wants) {
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
  for (size_t k = 0; k < counts.size(); ++k) {
    const uint64_t count = counts[k];
    uint64_t n_in, n_out, n_scr;
    int64_t in_off, out_off;
    hccc_host_layout(rank, count, &n_in, &n_out, &n_scr, &in_off, &out_off);
    std::vector<float> in(n_in + 1), sep(n_out + 1, -1000.0f), scratch(n_scr + 1);
    for (uint64_t i = 0; i < n_in; ++i) in[i] = float((7 * rank + 3 * i + k) % 17) - 8.0f;
    const bool inplace = k % 2 == 1 && in_off == 0 && n_in == n_out;
    float* dst = inplace ? in.data() : sep.data();
    const int want = wants[k] == -100 ? want0 : wants[k];
    const int p = hccc_host_proto(count, sizeof(float), want);
    if (p < 0) {
      fprintf(stderr, "rank %d: hccc_host_proto refused %d\n", rank, want);
      return 1;
    }
    pthread_barrier_wait(&s->barrier);   // every rank finished its previous call
    hccc_host_reset(&c, p, count, sizeof(float));
    pthread_barrier_wait(&s->barrier);   // every rank has reset
    hccc_args a = hccc_host_args(&c, in.data(), dst, scratch.data(), count, 20.0);
    if (hccc_host_launch(&c, kernels[rank], &a, 0) || hccc_host_wait(&c)) {
      fprintf(stderr, "%s\n", c.error_text);
      return 1;
    }
    hccc_error e;
    if (hccc_host_error(&c, &e)) {
      fprintf(stderr, "rank %d: rank %d TB %d stuck in primitive %d for chunk %d\n", rank, e.rank,
              e.tb, e.seq, e.chunk);
      hccc_host_abort(&c);
      return 1;
    }
    printf("rank %d call %zu proto %llu epoch %u zeroings %llu\n", rank, k,
           (unsigned long long)a.proto, (unsigned)a.ll_epoch, (unsigned long long)c.ll_zeroings);
    if (k == 0 && getenv("LL_NEXT")) c.ll_next = (uint32_t)strtoul(getenv("LL_NEXT"), nullptr, 10);
    fflush(stdout);
    std::string path = std::string(out) + "/r" + std::to_string(rank) + "_c" + std::to_string(k) + ".bin";
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(dst, sizeof(float), n_out, f) != n_out || fclose(f) != 0) {
      perror(path.c_str());
      return 1;
    }
  }
  hccc_host_destroy(&c);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s OUT WANT COUNT[:W]...\n", argv[0]);
    return 2;
  }
  const int want = atoi(argv[2]);
  std::vector<uint64_t> counts;
  std::vector<int> wants;   // -100: WANT
  for (int i = 3; i < argc; ++i) {
    char* end = nullptr;
    counts.push_back(strtoull(argv[i], &end, 10));
    wants.push_back(end && *end == ':' ? atoi(end + 1) : -100);
  }
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 2;
  Shared* s = static_cast<Shared*>(mem);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&s->barrier, &attr, HCCC_HOST_NRANKS);
  std::vector<pid_t> kids;
  for (int r = 0; r < HCCC_HOST_NRANKS; ++r) {
    fflush(stdout);
    const pid_t p = fork();
    if (p < 0) return 2;
    if (p == 0) {
      const int rc = run_rank(s, r, argv[1], want, counts, wants);
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
