// What a gated call may touch, read from its arguments as the generated rules
// say (gate_references.inc: scripts/gen_driver_api.py, reference_rule), for the
// reference check of gate.h. The trampolines call gmem_gate_check_references
// with the argument registers they saved; it counts the call in flight itself
// where the check lets it go.
#include <array>
#include <atomic>
#include <cstdint>

#include "interpose/gate.h"
#include "interpose/gate_references.inc"  // generated
#include "interpose/proc_table.h"

extern "C" {
// Read by the trampolines: nonzero while references are checked.
std::atomic<unsigned char> gmem_gate_check_on{0};
unsigned char gmem_gate_check_references(unsigned index, const uint64_t* saved, const uint64_t* stack) noexcept;
// The gate's own (gate.cpp).
extern std::atomic<long> gmem_gate_in_flight;
extern std::atomic<unsigned long> gmem_gate_entries, gmem_gate_untouched;
extern std::atomic<unsigned char> gmem_gate_closed;
void gmem_gate_wait();
}

namespace gmem::gate {

namespace {

std::atomic<ReferenceCheck> installed{nullptr};
std::atomic<UploadCheck> installed_upload{nullptr};
std::atomic<HostSource> installed_host_source{nullptr};
// A check that calls a gated function through our own exports is not checked again.
thread_local bool checking = false;

enum class Reader : uint8_t {
  none,
  arguments,
  upload,
  unified,
  arrays,
  memcpy2d,
  memcpy3d,
  memcpy3d_peer,
  stream_mem_ops,
  unknown
};

struct Rule {
  Reader reader = Reader::none;
  int8_t a[4] = {-1, -1, -1, -1};
  uint8_t scale = 1;
  uint32_t narrow = 0;  // arguments the ABI passes as 32 bits, by position
};

constexpr std::array<Rule, function_count> make_rules() {
  std::array<Rule, function_count> rules{};
#define GMEM_GATE_RULE(index, name, reader, a0, a1, a2, a3, scale, narrow) \
  rules[index] = Rule{Reader::reader, {a0, a1, a2, a3}, scale, narrow};
  GMEM_GATE_REFERENCES(GMEM_GATE_RULE)
#undef GMEM_GATE_RULE
  return rules;
}
constexpr std::array<Rule, function_count> rules = make_rules();

// The arguments of a call as the trampoline saved them: the six register
// arguments below it (last first: %r9, %r8, %rcx, %rdx, %rsi, %rdi), the rest
// on the caller's stack.
class Arguments {
 public:
  Arguments(const uint64_t* saved, const uint64_t* stack, uint32_t narrow)
      : saved_(saved), stack_(stack), narrow_(narrow) {}
  uint64_t operator[](int k) const {
    const uint64_t v = k < 6 ? saved_[5 - k] : stack_[k - 6];
    return narrow_ >> k & 1 ? static_cast<uint32_t>(v) : v;
  }
  template <typename T>
  const T* pointer(int k) const {
    return reinterpret_cast<const T*>((*this)[k]);
  }

 private:
  const uint64_t* saved_;
  const uint64_t* stack_;
  uint32_t narrow_;
};

std::size_t times(std::size_t a, std::size_t b) {
  std::size_t r;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
std::size_t plus(std::size_t a, std::size_t b) {
  std::size_t r;
  return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

// The references of one call, handed to the check a bufferful at a time.
class Seen {
 public:
  Seen(ReferenceCheck check, bool act) : check_(check), act_(act) {}
  void add(CUdeviceptr ptr, std::size_t bytes) {
    if (count_ == capacity) flush();
    refs_[count_++] = Reference{ptr, bytes};
  }
  // What the check found in all shown so far.
  Found flush() {
    if (count_) {
      const Found found = check_(refs_, count_, act_);
      found_.work |= found.work;
      found_.moves |= found.moves;
    }
    count_ = 0;
    return found_;
  }

 private:
  static constexpr int capacity = 32;
  ReferenceCheck check_;
  bool act_;
  Found found_;
  Reference refs_[capacity];
  int count_ = 0;
};

// One side of a 2D or 3D copy, where it is device memory (or unified, which
// cuda.h places in the same field): from its first byte to its last row's end.
void copy_side(Seen& seen, CUmemorytype type, CUdeviceptr base, std::size_t x, std::size_t y, std::size_t z,
               std::size_t pitch, std::size_t height, std::size_t width, std::size_t rows, std::size_t depth) {
  if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED) return;
  const std::size_t first = plus(x, times(plus(times(z, height), y), pitch));
  const std::size_t rows_before_last = plus(times(depth ? depth - 1 : 0, height), rows ? rows - 1 : 0);
  const std::size_t bytes = rows && depth && width ? plus(times(rows_before_last, pitch), width) : 0;
  seen.add(base + first, bytes);
}

void read_memcpy2d(Seen& seen, const CUDA_MEMCPY2D* c) {
  if (!c) return;
  copy_side(seen, c->srcMemoryType, c->srcDevice, c->srcXInBytes, c->srcY, 0, c->srcPitch, 0, c->WidthInBytes,
            c->Height, 1);
  copy_side(seen, c->dstMemoryType, c->dstDevice, c->dstXInBytes, c->dstY, 0, c->dstPitch, 0, c->WidthInBytes,
            c->Height, 1);
}

// CUDA_MEMCPY3D and CUDA_MEMCPY3D_PEER name their fields alike.
template <typename Copy>
void read_memcpy3d(Seen& seen, const Copy* c) {
  if (!c) return;
  copy_side(seen, c->srcMemoryType, c->srcDevice, c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight,
            c->WidthInBytes, c->Height, c->Depth);
  copy_side(seen, c->dstMemoryType, c->dstDevice, c->dstXInBytes, c->dstY, c->dstZ, c->dstPitch, c->dstHeight,
            c->WidthInBytes, c->Height, c->Depth);
}

// Arrays of device pointers (one or two: destinations and sources) with
// their sizes.
void read_arrays(Seen& seen, const Arguments& args, const Rule& rule) {
  const auto* sizes = args.pointer<std::size_t>(rule.a[2]);
  const std::size_t count = args[rule.a[3]];
  for (int side = 0; side < 2; ++side) {
    if (rule.a[side] < 0) continue;
    const auto* pointers = args.pointer<CUdeviceptr>(rule.a[side]);
    if (!pointers || !sizes) {
      if (count) seen.add(unknown_reference.ptr, unknown_reference.bytes);
      continue;
    }
    for (std::size_t i = 0; i < count; ++i) seen.add(pointers[i], sizes[i]);
  }
}

void read_stream_mem_ops(Seen& seen, const Arguments& args, const Rule& rule) {
  const auto* ops = args.pointer<CUstreamBatchMemOpParams>(rule.a[0]);
  const std::size_t count = args[rule.a[1]];
  if (!ops) return;
  for (std::size_t i = 0; i < count; ++i) {
    switch (ops[i].operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        seen.add(ops[i].waitValue.address, 4);
        break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        seen.add(ops[i].waitValue.address, 8);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        seen.add(ops[i].writeValue.address, 4);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        seen.add(ops[i].writeValue.address, 8);
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
      case CU_STREAM_MEM_OP_BARRIER:
        break;
      default:  // an operation newer than this reader
        seen.add(unknown_reference.ptr, unknown_reference.bytes);
    }
  }
}

void read_references(Seen& seen, const Arguments& args, const Rule& rule) {
  switch (rule.reader) {
    case Reader::none:
      return;
    case Reader::arguments:
    case Reader::unified: {
      const std::size_t bytes =
          times(times(rule.a[2] >= 0 ? args[rule.a[2]] : 1, rule.a[3] >= 0 ? args[rule.a[3]] : 1), rule.scale);
      for (int k : {rule.a[0], rule.a[1]}) {
        if (k >= 0) seen.add(args[k], bytes);
      }
      return;
    }
    case Reader::upload:
      return seen.add(args[rule.a[0]], args[rule.a[2]]);
    case Reader::arrays:
      return read_arrays(seen, args, rule);
    case Reader::memcpy2d:
      return read_memcpy2d(seen, args.pointer<CUDA_MEMCPY2D>(rule.a[0]));
    case Reader::memcpy3d:
      return read_memcpy3d(seen, args.pointer<CUDA_MEMCPY3D>(rule.a[0]));
    case Reader::memcpy3d_peer:
      return read_memcpy3d(seen, args.pointer<CUDA_MEMCPY3D_PEER>(rule.a[0]));
    case Reader::stream_mem_ops:
      return read_stream_mem_ops(seen, args, rule);
    case Reader::unknown:
      return seen.add(unknown_reference.ptr, unknown_reference.bytes);
  }
}

}  // namespace

void set_reference_check(ReferenceCheck check) { installed.store(check); }

void set_upload_check(UploadCheck check, HostSource host_source) {
  installed_host_source.store(host_source);
  installed_upload.store(check);
}

void check_references(bool on) { gmem_gate_check_on.store(on ? 1 : 0); }

}  // namespace gmem::gate

// 1: the call is counted in flight (as the trampoline counts it) and may go
// on; 0: not checked (no check, or none for this call), the trampoline enters
// the gate as without a check. A call that finds the gate closed waits here
// and is looked at again once it opens: the moves behind it may have parked
// what it touches. (Left to the trampoline's own entry, it went on unchecked
// wherever the gate opened in between: under TSan a set of a range just
// parked failed with CUDA_ERROR_INVALID_VALUE.)
extern "C" unsigned char gmem_gate_check_references(unsigned index, const uint64_t* saved,
                                                     const uint64_t* stack) noexcept {
  using namespace gmem::gate;
  const ReferenceCheck check = installed.load();
  if (!check || checking || index >= gmem::function_count) return 0;
  const Rule& rule = rules[index];
  if (rule.reader == Reader::none) return 0;
  const Arguments args(saved, stack, rule.narrow);
  checking = true;
  // The host bytes the upload check sees: a unified copy's source only where it is host memory.
  UploadCheck upload = nullptr;
  if ((rule.reader == Reader::upload || rule.reader == Reader::unified) && args[rule.a[2]] <= upload_bytes) {
    const HostSource host_source = installed_host_source.load();
    const bool host = rule.reader == Reader::upload || (host_source && host_source(args[rule.a[1]]));
    if (host) upload = installed_upload.load();
  }
  auto look = [&](bool act) {
    Seen seen(check, act);
    read_references(seen, args, rule);
    Found found = seen.flush();
    if (upload && upload(args.pointer<void>(rule.a[1]), args[rule.a[2]], act)) found.work = true;
    return found;
  };
  unsigned char counted = 0;
  while (true) {
    gmem_gate_entries.fetch_add(1);
    gmem_gate_in_flight.fetch_add(1);
    if (gmem_gate_closed.load()) {
      gmem_gate_in_flight.fetch_sub(1);
      gmem_gate_wait();
      continue;
    }
    if (const Found found = look(false); !found.work) {
      if (!found.moves) gmem_gate_untouched.fetch_add(1);  // after its entry: entries() never goes back
      counted = 1;
      break;
    }
    gmem_gate_in_flight.fetch_sub(1);
    look(true);
  }
  checking = false;
  return counted;
}
