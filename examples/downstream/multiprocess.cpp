// One rank per process through the emitted host API (gen/hccc_host.h): the program forks one
// process per rank; each sets up its rank (hccc_host_init), exports its handle as plain bytes,
// and the ranks exchange those bytes -- here through files in a directory, standing in for the
// MPI / torch.distributed / socket transport of a real job -- then connect, and run the
// algorithm's AllReduce a few times at uneven sizes, checking every element.
//
//   hccc_multiprocess DIR [TIMEOUT_S]     DIR: an empty directory for the exchange files
//
// Exit status 0 when every rank got the right sums; a rank that fails says why on stderr.
#include "hccc_host.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::string g_dir;
double g_timeout = 30.0;

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Publish `bytes` as DIR/<name>.<rank> (write, then rename: readers never see half a file).
void publish(const std::string& name, int rank, const void* data, size_t n) {
  std::string path = g_dir + "/" + name + "." + std::to_string(rank);
  std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
    perror(tmp.c_str());
    exit(2);
  }
  rename(tmp.c_str(), path.c_str());
}

// Every rank's DIR/<name>.<r> (n bytes each), waiting at most g_timeout seconds.
bool gather(const std::string& name, void* out, size_t n, int self) {
  const double deadline = now_s() + g_timeout;
  for (int r = 0; r < HCCC_HOST_NRANKS; ++r) {
    std::string path = g_dir + "/" + name + "." + std::to_string(r);
    for (;;) {
      FILE* f = fopen(path.c_str(), "rb");
      if (f) {
        size_t got = fread((char*)out + r * n, 1, n, f);
        fclose(f);
        if (got == n) break;
      }
      if (now_s() > deadline) {
        fprintf(stderr, "rank %d: rank %d did not arrive at '%s' within %.0f s\n", self, r,
                name.c_str(), g_timeout);
        return false;
      }
      usleep(1000);
    }
  }
  return true;
}

bool barrier(const std::string& name, int rank) {
  char one = 1;
  publish(name, rank, &one, 1);
  std::vector<char> all(HCCC_HOST_NRANKS);
  return gather(name, all.data(), 1, rank);
}

int run_rank(int rank) {
  hccc_host_comm c;
  if (hccc_host_init(&c, rank)) {
    fprintf(stderr, "%s\n", c.error_text);
    return 1;
  }
  hccc_host_handle mine;
  hccc_host_export(&c, &mine);
  publish("handle", rank, &mine, sizeof mine);
  std::vector<hccc_host_handle> all(HCCC_HOST_NRANKS);
  if (!gather("handle", all.data(), sizeof mine, rank)) return 1;
  if (hccc_host_connect(&c, all.data())) {
    fprintf(stderr, "%s\n", c.error_text);
    return 1;
  }
  if (!barrier("connected", rank)) return 1;
  hccc_host_seal(&c);

  hccc_host_kernel kernels[] = HCCC_HOST_KERNELS(float32, sum);
  const uint64_t counts[] = {1001, 4096, 7};
  int call = 0, bad = 0;
  for (uint64_t count : counts) {
    ++call;
    uint64_t n_in, n_out, n_scr;
    int64_t in_off, out_off;
    hccc_host_layout(rank, count, &n_in, &n_out, &n_scr, &in_off, &out_off);
    std::vector<float> in(n_in), out(n_out + 1, NAN), scratch(n_scr + 1);
    for (uint64_t i = 0; i < n_in; ++i) in[i] = float((rank + 1) * ((i % 5) + 1));
    if (!barrier("done" + std::to_string(call), rank)) return 1;   // previous call finished
    hccc_host_reset(&c);
    if (!barrier("reset" + std::to_string(call), rank)) return 1;  // every rank has reset
    hccc_args a = hccc_host_args(&c, in.data(), out.data(), scratch.data(), count, g_timeout);
    if (hccc_host_launch(&c, kernels[rank], &a, 0) || hccc_host_wait(&c)) {
      fprintf(stderr, "%s\n", c.error_text);
      return 1;
    }
    hccc_error e;
    if (hccc_host_error(&c, &e)) {
      fprintf(stderr, "rank %d: rank %d TB %d stuck in primitive %d (op %d) for chunk %d\n", rank,
              e.rank, e.tb, e.seq, e.op, e.chunk);
      hccc_host_abort(&c);
      return 1;
    }
    // sum over ranks of (r + 1) * ((i % 5) + 1)
    const float ranks_sum = HCCC_HOST_NRANKS * (HCCC_HOST_NRANKS + 1) / 2.0f;
    for (uint64_t i = 0; i < n_out; ++i)
      if (out[i] != ranks_sum * float((i % 5) + 1)) ++bad;
    if (bad) {
      fprintf(stderr, "rank %d: %d wrong elements in call %d (%llu elements)\n", rank, bad, call,
              (unsigned long long)count);
      return 1;
    }
  }
  hccc_host_destroy(&c);
  printf("rank %d: OK (%d calls)\n", rank, call);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR [TIMEOUT_S]\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  if (argc > 2) g_timeout = atof(argv[2]);
  std::vector<pid_t> kids;
  for (int r = 0; r < HCCC_HOST_NRANKS; ++r) {
    fflush(stdout);
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      return 2;
    }
    if (p == 0) {
      const int rc = run_rank(r);
      fflush(stdout);
      fflush(stderr);
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
  if (failed) fprintf(stderr, "%d of %d ranks failed\n", failed, HCCC_HOST_NRANKS);
  return failed ? 1 : 0;
}
