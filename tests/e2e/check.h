/* The test programs' check of a driver call: names the call that failed and
 * its error, and returns 1 from main. Define PROGRAM (the program's name) first. */
#define CHECK(call)                                                  \
  do {                                                               \
    CUresult s_ = (call);                                            \
    if (s_ != CUDA_SUCCESS) {                                        \
      fprintf(stderr, "%s: %s failed: %d\n", PROGRAM, #call, s_);    \
      return 1;                                                      \
    }                                                                \
  } while (0)

/* cuInit, and device 0's primary context made current in *context. */
static CUresult use_device0(CUcontext* context) {
  CUdevice device;
  CUresult s = cuInit(0);
  if (s == CUDA_SUCCESS) s = cuDeviceGet(&device, 0);
  if (s == CUDA_SUCCESS) s = cuDevicePrimaryCtxRetain(context, device);
  if (s == CUDA_SUCCESS) s = cuCtxSetCurrent(*context);
  return s;
}
