// What publishing stats costs the shim per allocation and free: the ledger's
// accounting of an alloc+free pair with a publisher (per-device figures and
// the placement table in a stats file) against the same without one, in
// interleaved rounds. Prints BENCH lines; the target is <= 50 ns per call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pool/registry.h"

namespace {

double pair_ns(gmem::pool::Ledger& ledger, long pairs) {
  gmem::pool::Allocation a;
  a.size = 2 << 20;
  a.device = 0;
  a.kind = gmem::pool::Kind::async;
  a.pooled = true;  // as under pool:vmm, where chunks, not allocations, count as reserved
  auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < pairs; ++i) {
    a.key = 0x7f0000000000 + (uint64_t(i) << 21);
    ledger.count_allocation(a);
    ledger.count_free(a);
  }
  std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
  return took.count() / double(pairs);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  char dir[] = "/tmp/gmem-bench-publish-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  std::string error;
  auto publisher = gmem::pool::Publisher::create(dir, "", &error);
  if (!publisher) {
    fprintf(stderr, "bench-publish: %s\n", error.c_str());
    return 1;
  }
  gmem::pool::Ledger with(publisher.get()), without;
  std::vector<double> published, plain;
  for (int r = 0; r < 15; ++r) {
    published.push_back(pair_ns(with, 200000));
    plain.push_back(pair_ns(without, 200000));
  }
  publisher.reset();
  rmdir(dir);
  printf("BENCH publish_alloc_free_pair %.1f ns\n", median(published));
  printf("BENCH publish_alloc_free_pair_native %.1f ns\n", median(plain));
  printf("BENCH publish_cost_per_call %.1f ns\n", (median(published) - median(plain)) / 2);
  return 0;
}
