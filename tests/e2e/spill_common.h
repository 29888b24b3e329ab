/* What spill.c, spill_bw.c and migrate.c share: the real driver opened past
 * the shim (GMEM_REAL_LIBCUDA), where it says each 2 MiB of an allocation
 * lives (the location of the physical allocation mapped there), raw VMM memory
 * made with its own functions (no pool, no budget) for the figures that the
 * spilled memory's are compared with, and the embedded kernels' loading.
 * Include after cuda.h and check.h; each program uses some of it (inline). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const size_t spill_step = 2 << 20;

/* The real driver's VMM calls, which the shim answers (or serves from its
 * pool) itself. */
struct real_driver {
  __typeof__(cuMemRetainAllocationHandle)* retain;
  __typeof__(cuMemGetAllocationPropertiesFromHandle)* properties;
  __typeof__(cuMemCreate)* create;
  __typeof__(cuMemAddressReserve)* reserve;
  __typeof__(cuMemMap)* map;
  __typeof__(cuMemSetAccess)* set_access;
  __typeof__(cuMemUnmap)* unmap;
  __typeof__(cuMemAddressFree)* address_free;
  __typeof__(cuMemRelease)* release;
};

/* 0 when every function of the real driver named by GMEM_REAL_LIBCUDA was found. */
static inline int open_real_driver(struct real_driver* r) {
  const char* path = getenv("GMEM_REAL_LIBCUDA");
  void* lib = path ? dlopen(path, RTLD_NOW) : NULL;
  if (!lib) return -1;
  r->retain = (__typeof__(r->retain))dlsym(lib, "cuMemRetainAllocationHandle");
  r->properties = (__typeof__(r->properties))dlsym(lib, "cuMemGetAllocationPropertiesFromHandle");
  r->create = (__typeof__(r->create))dlsym(lib, "cuMemCreate");
  r->reserve = (__typeof__(r->reserve))dlsym(lib, "cuMemAddressReserve");
  r->map = (__typeof__(r->map))dlsym(lib, "cuMemMap");
  r->set_access = (__typeof__(r->set_access))dlsym(lib, "cuMemSetAccess");
  r->unmap = (__typeof__(r->unmap))dlsym(lib, "cuMemUnmap");
  r->address_free = (__typeof__(r->address_free))dlsym(lib, "cuMemAddressFree");
  r->release = (__typeof__(r->release))dlsym(lib, "cuMemRelease");
  return r->retain && r->properties && r->create && r->reserve && r->map && r->set_access && r->unmap &&
                 r->address_free && r->release
             ? 0
             : -1;
}

/* The programs' common start: FILL_MIB BLOCK_MIB SPAN_MIB from `sizes`, the
 * real driver, and device 0's context current; 0, or the exit status. */
static inline int spill_start(char** sizes, size_t* fill, size_t* block, size_t* span, struct real_driver* real,
                       CUcontext* ctx) {
  *fill = strtoull(sizes[0], NULL, 10) << 20;
  *block = strtoull(sizes[1], NULL, 10) << 20;
  *span = strtoull(sizes[2], NULL, 10) << 20;
  if (open_real_driver(real) != 0) {
    fprintf(stderr, "%s: set GMEM_REAL_LIBCUDA to the real driver (to ask it past the shim)\n", PROGRAM);
    return 2;
  }
  CHECK(use_device0(ctx));
  return 0;
}

/* Seconds on a monotonic clock. */
static inline double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* 0 where device `dev` can map memory of device `other` (a second GPU, P2P);
 * else 77 (skipped), or 1. */
static inline int peer_ready(CUdevice dev, CUdevice other) {
  int count = 0, can = 0;
  CHECK(cuDeviceGetCount(&count));
  if (count > other) CHECK(cuDeviceCanAccessPeer(&can, dev, other));
  if (!can) {
    printf("%s: peer skipped: needs a second GPU that device %d can map (%d GPUs, P2P %d)\n", PROGRAM, dev, count,
           can);
    return 77;
  }
  return 0;
}

/* A run of a program started as "PROGRAM host|peer FILL_MIB BLOCK_MIB SPAN_MIB". */
struct tier_run {
  int peer;         /* the tier: a peer GPU (device 1), else the host */
  const char* name; /* "host" or "peer" */
  size_t fill, block, span;
  struct real_driver real;
  CUcontext ctx;
};

/* Reads `run` from argv, with up to `optional` arguments more (`usage` shows
 * them), and starts as spill_start does; for peer, device 0 must be able to
 * map device 1. 0, or the exit status. */
static inline int tier_start(int argc, char** argv, int optional, const char* usage, struct tier_run* run) {
  run->peer = argc >= 5 && strcmp(argv[1], "peer") == 0;
  run->name = argv[1];
  if (argc < 5 || argc > 5 + optional || (!run->peer && strcmp(argv[1], "host") != 0)) {
    fprintf(stderr, "usage: %s host|peer FILL_MIB BLOCK_MIB SPAN_MIB%s\n", PROGRAM, usage);
    return 2;
  }
  const int started = spill_start(argv + 2, &run->fill, &run->block, &run->span, &run->real, &run->ctx);
  if (started) return started;
  return run->peer ? peer_ready(0, 1) : 0;
}

/* Loads the kernels embedded as `image` (a fatbin that nvcc made at build
 * time; `size` 0 in a build without nvcc) into the current context: 0, 77
 * (skipped) where there are none or the driver loads no modules
 * (CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_SUPPORTED), or 1 (the emulator, which
 * loads only its own kernel text, answers a fatbin CUDA_ERROR_INVALID_PTX). */
static inline int load_kernels(const unsigned char* image, size_t size, CUmodule* module) {
  if (size == 0) {
    printf("%s: skipped: built without nvcc (no kernels)\n", PROGRAM);
    return 77;
  }
  CUresult s = cuModuleLoadData(module, image);
  if (s == CUDA_ERROR_NOT_FOUND || s == CUDA_ERROR_NOT_SUPPORTED) {
    printf("%s: skipped: the driver cannot load kernels (cuModuleLoadData: %d)\n", PROGRAM, s);
    return 77;
  }
  CHECK(s);
  return 0;
}

/* load_kernels, then the kernel `name` of them and the SM count of `dev`. */
static inline int load_step(const unsigned char* image, size_t size, const char* name, CUdevice dev,
                            CUmodule* module, CUfunction* step, int* sms) {
  const int loaded = load_kernels(image, size, module);
  if (loaded != 0) return loaded;
  CHECK(cuModuleGetFunction(step, *module, name));
  CHECK(cuDeviceGetAttribute(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  return 0;
}

enum tier { tier_device, tier_peer, tier_host, tiers };
static const char* const tier_names[tiers] = {"device", "peer", "host"};

/* Where the real driver places an allocation: how much of it each tier holds,
 * and each tier's first contiguous run of it. */
struct placement {
  size_t bytes[tiers];
  size_t start[tiers], run[tiers]; /* offsets in the allocation */
};

/* The placement of [base, base + span), asking the real driver about each 2 MiB. */
static inline CUresult locate(const struct real_driver* r, CUdeviceptr base, size_t span, CUdevice dev,
                       struct placement* p) {
  memset(p, 0, sizeof *p);
  for (size_t off = 0; off < span; off += spill_step) {
    CUmemGenericAllocationHandle handle;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    CUresult s = r->retain(&handle, (void*)(base + off));
    if (s != CUDA_SUCCESS) return s;
    s = r->properties(&prop, handle);
    const CUresult released = r->release(handle);
    if (s == CUDA_SUCCESS) s = released;
    if (s != CUDA_SUCCESS) return s;
    const enum tier t = prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE ? tier_host
                        : prop.location.id == dev                         ? tier_device
                                                                          : tier_peer;
    if (!p->bytes[t]) p->start[t] = off;
    if (p->start[t] + p->run[t] == off) p->run[t] += spill_step;
    p->bytes[t] += spill_step;
  }
  return CUDA_SUCCESS;
}


/* A filled device, then a spilling allocation: FILL_MIB in BLOCK_MIB
 * allocations (at most spill_blocks), then SPAN_MIB (big), whose placement
 * the driver gives (where, printed); tier: the run's tier. */
enum { spill_blocks = 1024 };
struct filled {
  CUdeviceptr blocks[spill_blocks];
  int n;
  CUdeviceptr big;
  struct placement where;
  enum tier tier;
};

/* 0, or 1 where a call failed. */
static inline int fill_then_spill(const struct tier_run* run, CUdevice dev, struct filled* f) {
  const size_t mib = 1 << 20;
  f->n = 0;
  f->tier = run->peer ? tier_peer : tier_host;
  for (size_t held = 0; held < run->fill && f->n < spill_blocks; held += run->block) {
    CHECK(cuMemAlloc(&f->blocks[f->n++], run->block));
  }
  CHECK(cuMemAlloc(&f->big, run->span));
  CHECK(locate(&run->real, f->big, run->span, dev, &f->where));
  printf("%s: the driver places the %zu MiB allocation on device %zu MiB, peer %zu MiB, host %zu MiB\n", PROGRAM,
         run->span / mib, f->where.bytes[tier_device] / mib, f->where.bytes[tier_peer] / mib,
         f->where.bytes[tier_host] / mib);
  return 0;
}
/* Pinned memory of `dev`'s host NUMA node, or plain pinned host memory where
 * the system has none (as the pool's host tier does). */
static inline CUresult host_location(CUdevice dev, CUmemLocation* where) {
  int node = -1;
  CUresult s = cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
  where->type = node >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
  where->id = node >= 0 ? node : 0;
  return s;
}

/* Physical memory at `where`, mapped read-write for device `dev` by the real
 * driver itself: the raw memory of a tier. */
struct raw_memory {
  CUmemGenericAllocationHandle handle;
  CUdeviceptr ptr;
  size_t size;
};

static inline CUresult raw_map(const struct real_driver* r, CUmemLocation where, size_t size, CUdevice dev,
                        struct raw_memory* m) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = where;
  const CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  m->size = size;
  CUresult s = r->create(&m->handle, size, &prop, 0);
  if (s == CUDA_SUCCESS) s = r->reserve(&m->ptr, size, 0, 0, 0);
  if (s == CUDA_SUCCESS) s = r->map(m->ptr, size, 0, m->handle, 0);
  if (s == CUDA_SUCCESS) s = r->set_access(m->ptr, size, &access, 1);
  return s;
}

static inline CUresult raw_unmap(const struct real_driver* r, struct raw_memory* m) {
  CUresult s = r->unmap(m->ptr, m->size);
  if (s == CUDA_SUCCESS) s = r->address_free(m->ptr, m->size);
  if (s == CUDA_SUCCESS) s = r->release(m->handle);
  return s;
}
