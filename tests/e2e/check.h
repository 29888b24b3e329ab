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
