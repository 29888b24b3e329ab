// spill_bw.c's kernels, compiled by nvcc at build time and embedded as a fatbin
// (tests/meson.build): a grid-stride read of 16-byte vectors that sums their
// 32-bit words (so the data is checked), and a grid-stride store.

__device__ __forceinline__ unsigned long long words(uint4 v) {
  return (unsigned long long)v.x + v.y + v.z + v.w;
}

// *sum += the sum of the 32-bit words of data[0, n). Four loads in flight per
// thread, so that far memory (PCIe, NVLink) has enough requests outstanding.
extern "C" __global__ void gmem_bw_read(const uint4* data, unsigned long long n, unsigned long long* sum) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
    acc += words(a) + words(b) + words(c) + words(d);
  }
  for (; i < n; i += stride) acc += words(data[i]);
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, s);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, acc);
}

// data[0, n) = value in every 32-bit word.
extern "C" __global__ void gmem_bw_write(uint4* data, unsigned long long n, unsigned value) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const uint4 v = make_uint4(value, value, value, value);
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i < n; i += stride) data[i] = v;
}
