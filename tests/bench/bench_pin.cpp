// How fast the driver pins host memory for the pool's host tier: cuMemCreate
// of host-located chunks (CU_MEM_LOCATION_TYPE_HOST_NUMA, the GPU's node), one
// thread against several at once, as a spill's first step pays it; and how
// fast another process takes the same chunks over, exported as POSIX fds and
// imported, mapped and given access to (what a job pays for host memory that
// gmemd pinned ahead: gmemd --host-pool, ipc/host_pool.h).
//   bench-pin [SHIM REAL]   (the suite's two arguments; unused: it runs on the driver it is linked to)
// Environment: GMEM_BENCH_PIN_GIB (default 16) in chunks of GMEM_BENCH_PIN_CHUNK_MIB (default 1024).
// Prints BENCH pin_gbs_threads_N, each count's speed against one thread's, and
// BENCH lease_import_gbs.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "driver_call.h"
#include "ipc/fd_passing.h"

namespace {

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* text = std::getenv(name);
  return text ? std::strtoull(text, nullptr, 10) : fallback;
}

bool ok(CUresult status, const char* call) { return gmem::bench::call_ok("bench-pin", status, call); }

// Creates every chunk of `handles` with `threads` threads taking the next one
// in turn; seconds taken, or a negative value if a creation failed.
double create_all(std::vector<CUmemGenericAllocationHandle>& handles, std::size_t chunk,
                  const CUmemAllocationProp& prop, unsigned threads) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (std::size_t i = next++; i < handles.size() && !failed; i = next++) {
        if (!ok(cuMemCreate(&handles[i], chunk, &prop, 0), "cuMemCreate")) failed = true;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return failed ? -1 : seconds;
}

bool open_device(CUdevice* device, CUcontext* context) {
  return ok(cuInit(0), "cuInit") && ok(cuDeviceGet(device, 0), "cuDeviceGet") &&
         ok(cuDevicePrimaryCtxRetain(context, *device), "cuDevicePrimaryCtxRetain") &&
         ok(cuCtxSetCurrent(*context), "cuCtxSetCurrent");
}

// The importing process: takes `count` chunks of `chunk` bytes as fds from
// `socket`, imports each, maps it into one reserved range with read-write
// access for device 0, and sets every byte with a kernel (the memory works).
// Prints the import speed; exit status 0 on success.
int import_all(int socket, std::size_t count, std::size_t chunk) {
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (!open_device(&device, &context)) return 1;
  CUdeviceptr base = 0;
  if (!ok(cuMemAddressReserve(&base, count * chunk, 0, 0, 0), "cuMemAddressReserve")) return 1;
  std::vector<CUmemGenericAllocationHandle> handles;
  double seconds = 0;
  while (handles.size() < count) {
    std::vector<int> fds;
    char tag = 0;
    if (!gmem::fds::receive(socket, &tag, 1, &fds)) return 1;
    const auto start = std::chrono::steady_clock::now();
    for (int fd : fds) {
      CUmemGenericAllocationHandle h = 0;
      const CUdeviceptr at = base + handles.size() * chunk;
      CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      if (!ok(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              "cuMemImportFromShareableHandle") ||
          !ok(cuMemMap(at, chunk, 0, h, 0), "cuMemMap") || !ok(cuMemSetAccess(at, chunk, &access, 1), "cuMemSetAccess")) {
        return 1;
      }
      handles.push_back(h);
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    gmem::fds::close_all(fds);
  }
  if (!ok(cuMemsetD8(base, 0x5a, count * chunk), "cuMemsetD8") || !ok(cuCtxSynchronize(), "cuCtxSynchronize")) return 1;
  unsigned char first = 0, last = 0;
  if (!ok(cuMemcpyDtoH(&first, base, 1), "cuMemcpyDtoH") ||
      !ok(cuMemcpyDtoH(&last, base + count * chunk - 1, 1), "cuMemcpyDtoH") || first != 0x5a || last != 0x5a) {
    std::fprintf(stderr, "bench-pin: imported memory does not hold what was set\n");
    return 1;
  }
  std::printf("BENCH lease_import_gbs %.2f GB/s\n", static_cast<double>(count * chunk) / seconds / 1e9);
  std::fflush(stdout);
  cuMemUnmap(base, count * chunk);
  for (CUmemGenericAllocationHandle h : handles) cuMemRelease(h);
  cuMemAddressFree(base, count * chunk);
  cuDevicePrimaryCtxRelease(device);
  return 0;
}

// Pins `handles` (one thread), hands them to a child process as fds, and waits
// for it to import them; false if either side failed.
bool lease(std::vector<CUmemGenericAllocationHandle>& handles, std::size_t chunk, const CUmemAllocationProp& prop,
           int socket, pid_t child) {
  bool sent = create_all(handles, chunk, prop, 1) >= 0;
  for (std::size_t i = 0; sent && i < handles.size(); i += gmem::fds::max_per_message) {
    std::vector<int> fds;
    for (std::size_t j = i; j < std::min(handles.size(), i + gmem::fds::max_per_message); ++j) {
      int fd = -1;
      if (!ok(cuMemExportToShareableHandle(&fd, handles[j], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              "cuMemExportToShareableHandle")) {
        sent = false;
        break;
      }
      fds.push_back(fd);
    }
    const char tag = 0;
    sent = sent && gmem::fds::send(socket, &tag, 1, fds);
    gmem::fds::close_all(fds);
  }
  close(socket);
  int status = 0;
  waitpid(child, &status, 0);
  return sent && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main() {
  const std::size_t chunk = env_size("GMEM_BENCH_PIN_CHUNK_MIB", 1024) << 20;
  const std::size_t total = env_size("GMEM_BENCH_PIN_GIB", 16) << 30;
  if (chunk == 0 || total < chunk) {
    std::fprintf(stderr, "bench-pin: GMEM_BENCH_PIN_GIB must hold at least one chunk\n");
    return 2;
  }
  // The importer is forked before either process touches the driver.
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pair) != 0) return 1;
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(pair[0]);
    _exit(import_all(pair[1], total / chunk, chunk));
  }
  close(pair[1]);
  CUdevice device = 0;
  CUcontext context = nullptr;
  int node = -1;
  if (!open_device(&device, &context) ||
      !ok(cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device), "cuDeviceGetAttribute")) {
    return 1;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, node < 0 ? 0 : node};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // as the pool makes them
  std::printf("bench-pin: %zu GiB of host-located chunks of %zu MiB on NUMA node %d\n", total >> 30, chunk >> 20,
              node);
  double one = 0;
  for (unsigned threads : {1u, 2u, 4u, 8u}) {
    std::vector<CUmemGenericAllocationHandle> handles(total / chunk);
    const double seconds = create_all(handles, chunk, prop, threads);
    for (CUmemGenericAllocationHandle h : handles) {
      if (h) cuMemRelease(h);
    }
    if (seconds < 0) return 1;
    const double gbs = static_cast<double>(handles.size() * chunk) / seconds / 1e9;
    if (threads == 1) one = gbs;
    std::printf("BENCH pin_gbs_threads_%u %.2f GB/s\n", threads, gbs);
    std::printf("BENCH pin_speedup_threads_%u %.2f x\n", threads, gbs / one);
  }
  std::fflush(stdout);
  std::vector<CUmemGenericAllocationHandle> handles(total / chunk);
  const bool leased = lease(handles, chunk, prop, pair[0], child);
  for (CUmemGenericAllocationHandle h : handles) {
    if (h) cuMemRelease(h);
  }
  if (!leased) return 1;
  cuDevicePrimaryCtxRelease(device);
  return 0;
}
