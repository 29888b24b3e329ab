/* The quickstart's job (scripts/quickstart-demo.sh): a training-like loop that
 * holds more memory at once than its device has, TIMES (1.5) the device's.
 * Weights take half the device and small buffers sit beside them; each step
 * then allocates activations of a size of its own, so that memory freed by
 * one step must serve the next step's other sizes, writes and reads them, and
 * frees them. It writes a word in every 2 MiB of each buffer (so in every
 * physical chunk a pool may map there) and reads them back: not every byte,
 * which on the emulated driver would cost the host as much memory as the job.
 * With --hold it prints "holding" before the last step frees and waits for
 * its standard input to close, so that gmemctl can look at it.
 * Exit 0 when every word read back as written; 1, naming the call that the
 * driver refused (without gmem: out of memory), otherwise.
 *   quickstart-job [--hold] [TIMES] */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { max_buffers = 4096, small_buffers = 256, steps = 6 };
static const size_t mib = 1 << 20, stride = 2 << 20;

static CUdeviceptr buffers[max_buffers];
static size_t sizes[max_buffers];
static int count;
static size_t held;

/* Writes `value` at the start of every 2 MiB of a buffer, and at its end. */
static CUresult stamp(CUdeviceptr p, size_t size, unsigned value) {
  CUresult s = CUDA_SUCCESS;
  for (size_t at = 0; at < size && s == CUDA_SUCCESS; at += stride) s = cuMemsetD32(p + at, value, 1);
  return s == CUDA_SUCCESS ? cuMemsetD32(p + size - 4, value, 1) : s;
}

/* Whether a buffer reads back what stamp() wrote. */
static int stamped(CUdeviceptr p, size_t size, unsigned value) {
  unsigned seen = 0;
  for (size_t at = 0; at < size; at += stride) {
    if (cuMemcpyDtoH(&seen, p + at, 4) != CUDA_SUCCESS || seen != value) return 0;
  }
  return cuMemcpyDtoH(&seen, p + size - 4, 4) == CUDA_SUCCESS && seen == value;
}

/* Allocates `size` bytes and stamps them with `value`; 0, or 1 when the driver refuses. */
static int take(size_t size, unsigned value, size_t want) {
  CUresult s = count < max_buffers ? cuMemAlloc(&buffers[count], size) : CUDA_ERROR_OUT_OF_MEMORY;
  if (s == CUDA_SUCCESS) s = stamp(buffers[count], size, value);
  if (s != CUDA_SUCCESS) {
    const char* name = "?";
    cuGetErrorName(s, &name);
    printf("quickstart-job: cuMemAlloc of %.1f MiB failed (%s) while holding %zu MiB of %zu MiB\n",
           (double)size / mib, name, held / mib, want / mib);
    return 1;
  }
  sizes[count++] = size;
  held += size;
  return 0;
}

/* Whether buffers [first, count) still hold what they were stamped with. */
static int intact(int first, unsigned (*value)(int)) {
  for (int i = first; i < count; ++i) {
    if (!stamped(buffers[i], sizes[i], value(i))) return 0;
  }
  return 1;
}

/* Frees buffers [first, count). */
static void drop(int first) {
  while (count > first) {
    --count;
    cuMemFree(buffers[count]);
    held -= sizes[count];
  }
}

static int step_now;
static unsigned weight_value(int i) { return 0x7e160000u + (unsigned)i; }
static unsigned step_value(int i) { return (unsigned)step_now << 24 | (unsigned)i; }

int main(int argc, char** argv) {
  int hold = argc > 1 && strcmp(argv[1], "--hold") == 0;
  double times = argc > 1 + hold ? atof(argv[1 + hold]) : 1.5;
  CUdevice device;
  CUcontext context;
  size_t total = 0;
  char name[128] = "";
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS || cuCtxSetCurrent(context) != CUDA_SUCCESS ||
      cuDeviceTotalMem(&total, device) != CUDA_SUCCESS || cuDeviceGetName(name, sizeof name, device) != CUDA_SUCCESS) {
    fprintf(stderr, "quickstart-job: no CUDA device to use\n");
    return 1;
  }
  const size_t want = (size_t)(times * (double)total), unit = total / 64 / (2 * mib) * (2 * mib);
  printf("quickstart-job: %s, %zu MiB; holds %zu MiB at once (%.1fx): weights, then %d steps\n", name, total / mib,
         want / mib, times, steps);
  fflush(stdout);

  for (int i = 0; i < 8; ++i) {
    if (take(total / 16, weight_value(i), want)) return 1;
  }
  for (int i = 0; i < small_buffers; ++i) {
    if (take(4096 * (1 + i % 4), weight_value(count), want)) return 1;
  }
  const int weights = count;
  /* Each step's activation size, in units of 1/64 of the device. */
  static const size_t units[steps] = {2, 3, 5, 4, 3, 2};
  for (step_now = 0; step_now < steps; ++step_now) {
    const size_t size = (unit ? unit : 2 * mib) * units[step_now];
    while (held < want) {
      if (take(size, step_value(count), want)) return 1;
    }
    if (!intact(weights, step_value)) {
      fprintf(stderr, "quickstart-job: step %d read back other data than it wrote\n", step_now + 1);
      return 1;
    }
    if (hold && step_now == steps - 1) {
      printf("holding %zu MiB in %d allocations (close standard input to finish)\n", held / mib, count);
      fflush(stdout);
      char byte;
      while (read(0, &byte, 1) > 0) {
      }
    }
    drop(weights);
  }
  if (!intact(0, weight_value)) {
    fprintf(stderr, "quickstart-job: the weights changed\n");
    return 1;
  }
  drop(0);
  printf("quickstart-job: ok: %d steps at %.1fx the device, every word read back as written\n", steps, times);
  return 0;
}
