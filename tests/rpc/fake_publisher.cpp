// A process that publishes a stats file for itself, as a job under the shim
// would, and then waits to be killed: the live (and dying) processes that the
// gmemd tests and benchmark watch. Usage: fake-publisher DIR [DEVICES] [ALLOCATIONS]
// Device d reserves (d+1) GiB, uses half of it, and lists ALLOCATIONS ranges.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "processes.h"
#include "stats_writer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fake-publisher DIR [DEVICES] [ALLOCATIONS]\n");
    return 2;
  }
  int devices = argc > 2 ? std::atoi(argv[2]) : 1, allocations = argc > 3 ? std::atoi(argv[3]) : 4;
  gmem::test::StatsWriter writer(argv[1], getpid(), gmem::test::start_ticks_of(getpid()), 1024,
                                 "fake-publisher " + std::to_string(devices));
  for (int d = 0; d < devices; ++d) {
    uint64_t reserved = (uint64_t(d) + 1) << 30;
    writer.set_uuid(d, static_cast<uint8_t>(0xa0 + d));
    writer.set(d, GMEM_STAT_reserved_bytes, reserved);
    writer.set(d, GMEM_STAT_in_use_bytes, reserved / 2);
    writer.set(d, GMEM_STAT_device_bytes, reserved / 2);
    writer.set(d, GMEM_STAT_allocations, static_cast<uint64_t>(allocations));
    writer.set(d, GMEM_STAT_stitched_ranges, 1);
    writer.set(d, GMEM_STAT_moved_back_bytes, reserved / 8);
    writer.set(d, GMEM_STAT_access_launches, 1);
    for (int a = 0; a < allocations; ++a) {
      writer.place((0x7f0000000000ull + (uint64_t(d) << 36)) + (uint64_t(a) << 24), 1u << 20, d, GMEM_TIER_DEVICE,
                   GMEM_KIND_DEVICE, static_cast<uint16_t>(a == 0 ? 2 : 1));
    }
  }
  printf("ready %d\n", getpid());
  fflush(stdout);
  // Counts on: an allocation, a launch and 1 MiB of host access per 10 ms on
  // device 0, for the rates of top and stats.
  for (uint64_t n = static_cast<uint64_t>(allocations);; ++n) {
    usleep(10000);
    if (devices > 0) {
      writer.set(0, GMEM_STAT_allocations, n);
      writer.set(0, GMEM_STAT_access_launches, n);
      writer.set(0, GMEM_STAT_host_access_bytes, n << 20);
    }
  }
}
