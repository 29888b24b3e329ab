// The pool's allocation trace (GMEM_CONF trace:FILE): what TraceRecorder
// writes is a valid trace, read back by the replays' reader as written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "pool/trace_recorder.h"
#include "trace.h"

namespace {

using gmem::pool::TraceRecorder;

std::string temp_pattern() { return testing::TempDir() + "gmem-trace-test-%p.trace"; }
std::string temp_path() { return testing::TempDir() + "gmem-trace-test-" + std::to_string(getpid()) + ".trace"; }

// The text of the trace the test wrote.
std::string written() {
  std::string text;
  if (FILE* f = std::fopen(temp_path().c_str(), "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) text += line;
    std::fclose(f);
  }
  return text;
}

TEST(TraceRecorder, WritesATraceTheReplaysRead) {
  std::string error;
  {
    auto trace = TraceRecorder::open(temp_pattern(), &error);
    ASSERT_TRUE(trace) << error;
    const gmem::pool::StreamId legacy = reinterpret_cast<gmem::pool::StreamId>(CU_STREAM_LEGACY);
    trace->allocated(0x1000, 100, 0, 0);
    // A stream of its own, part placed off the device, and a range made for it.
    const TraceRecorder::Made made{3, 2'500'000, std::size_t{64} << 20, false, {}};
    trace->allocated(0x2000, 200 << 20, 77, 64 << 20, &made);
    trace->freed(0x1000);
    trace->counting();
    trace->counting();  // said once
    trace->allocated(0x3000, 50, legacy, 0);  // takes id 0 again, on stream 0
    trace->freed(0x9000);                     // never allocated: not written
    trace->allocated(0x4000, 60, 88, 0);      // another stream
    trace->mover(0x4000);                     // moved onto the device: by its id
    trace->evictor(0, "unparked-all");        // no allocation: -
    trace->freed(0x2000);
    // A range made while the GPU ran out of work, the request's last range
    // being held by two others.
    using Why = gmem::pool::Recall::Missed::Why;
    const TraceRecorder::Made drained{2, 1'000'000, 0, true, {Why::held, 0, 6 << 20, 2 << 20, 2}};
    trace->allocated(0x5000, 300 << 20, 0, 0, &drained);
    // No range made, but two frees waited for meanwhile, as the stream ran dry.
    const TraceRecorder::Made waited{0, 0, 0, true, {}, 2, 1'500'000'000, false};
    trace->allocated(0x6000, 400 << 20, 0, 0, &waited);
    // A cached range served it, 32 MiB of it on the host; and one on the device alone.
    const TraceRecorder::Made took{0, 0, std::size_t{32} << 20, false, {}, 0, 0, false};
    trace->allocated(0x7000, 100 << 20, 0, 0, &took);
    const TraceRecorder::Made device_only{0, 0, 0, false, {}, 0, 0, false};
    trace->allocated(0x8000, 90 << 20, 0, 0, &device_only);
    trace->device_full(std::size_t{78} << 30);
    trace->device_full(std::size_t{77} << 30);  // said once
  }
  const std::string text = written();
  EXPECT_NE(text.find("a 1 209715200 1 67108864\n# made: 3 mappings in 2.5 ms, 67108864 bytes on the host\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# made: 2 mappings in 1.0 ms, 0 bytes on the host; its stream ran out of work meanwhile; "
                      "the request's last range had 6291456 bytes (2097152 off the device) in use through 2 other "
                      "ranges\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(" 104857600 0 0\n# took: a cached range, 33554432 bytes on the host\n# at "), std::string::npos)
      << text;
  EXPECT_NE(text.find(" 94371840 0 0\n# at "), std::string::npos) << text;
  EXPECT_EQ(text.find("# took: a cached range, 0 bytes"), std::string::npos) << text;
  EXPECT_NE(text.find(" 419430400 0 0\n# waited: 2 frees in 1500.0 ms; its stream ran out of work meanwhile\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("# made: 0 mappings"), std::string::npos) << text;
  EXPECT_NE(text.find("# device full: the pool held 83751862272 bytes of the device\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("82678120448"), std::string::npos) << text;
  // The movers' lines: who, a time, the allocation's id, what.
  auto line_of = [&](const std::string& who) {
    const std::size_t at = text.find("# " + who + " ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  const std::string mover = line_of("mover"), evictor = line_of("evictor");
  EXPECT_TRUE(mover.ends_with(" 2 moved") && mover.size() > 16) << mover;
  EXPECT_TRUE(evictor.ends_with(" - unparked-all")) << evictor;
  auto t = gmem::trace::load(temp_path(), &error);
  std::remove(temp_path().c_str());
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->events.size(), 10u);
  EXPECT_EQ(t->events[1].bytes, std::size_t{200} << 20);
  EXPECT_EQ(t->events[1].stream, 1u);
  EXPECT_EQ(t->events[1].off_device, std::size_t{64} << 20);
  EXPECT_FALSE(t->events[2].alloc);
  EXPECT_EQ(t->events[2].id, 0u);
  EXPECT_EQ(t->events[3].id, 0u);
  EXPECT_EQ(t->events[3].stream, 0u);
  EXPECT_EQ(t->events[4].id, 2u);
  EXPECT_EQ(t->events[4].stream, 2u);
  EXPECT_EQ(t->ids, 6u);
  EXPECT_EQ(t->events[6].bytes, std::size_t{300} << 20);
  EXPECT_EQ(t->peak_requested, (std::size_t{890} << 20) + 110);
  EXPECT_EQ(t->device_full, std::size_t{78} << 30);
  EXPECT_EQ(t->counting_from, 3u);  // from the allocation after the line
  EXPECT_EQ(text.find("# counting launches"), text.rfind("# counting launches")) << text;
}

TEST(TraceRecorder, AFileThatCannotBeWrittenIsSaid) {
  std::string error;
  EXPECT_FALSE(TraceRecorder::open("/nonexistent-dir/t.trace", &error));
  EXPECT_NE(error.find("/nonexistent-dir/t.trace"), std::string::npos) << error;
}

// A use names the launching thread and function by numbers in the order
// first seen (no function: a graph), and the offset of each range's first
// address; what the trace never saw allocated, and a word past an
// allocation's size, are left out.
TEST(TraceRecorder, UsesNameTheirThreadTheirFunctionAndOffsets) {
  std::string error;
  {
    auto trace = TraceRecorder::open(temp_pattern(), &error);
    ASSERT_TRUE(trace) << error;
    constexpr CUdeviceptr a = 0x10000000, b = 0x20000000, unseen = 0x30000000;
    trace->allocated(a, 256 << 20, 0, 0);
    trace->allocated(b, 128 << 20, 0, 0);
    const int f = 0, g = 0;
    trace->used(&f, {{a, 0}, {b, 4096}});
    trace->used(&g, {{b, 0}});
    trace->used(&f, {{unseen, 8}, {a, 64}});
    std::thread([&] { trace->used(nullptr, {{b, 8}}); }).join();
    trace->used(&g, {{unseen, 0}});  // nothing it saw: no line
    trace->used(&g, {{b, 128 << 20}});  // past b's size, in the range that served it: no line
  }
  const std::string text = written();
  EXPECT_NE(text.find(" t0 k0 0 1+4096\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" t0 k1 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" t0 k0 0+64\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" t1 1+8\n"), std::string::npos) << text;
  auto t = gmem::trace::load(temp_path(), &error);
  std::remove(temp_path().c_str());
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->uses.size(), 4u);
  EXPECT_EQ(t->uses[0].function, 1u);
  EXPECT_EQ(t->uses[0].offsets, (std::vector<std::uint64_t>{0, 4096}));
  EXPECT_EQ(t->uses[1].function, 2u);
  EXPECT_EQ(t->uses[2].ids, std::vector<std::uint32_t>{0});
  EXPECT_EQ(t->uses[2].offsets, std::vector<std::uint64_t>{64});
  EXPECT_EQ(t->uses[3].thread, 1u);
  EXPECT_EQ(t->uses[3].function, 0u);
}

// With name_kernels, a function's first use follows a comment line that
// names it, once; a function with no name gets none. An allocation of
// large_range or more is followed by its address. Readers skip both.
TEST(TraceRecorder, KernelsAreNamedAndLargeAllocationsAddressed) {
  std::string error;
  {
    auto trace = TraceRecorder::open(temp_pattern(), &error);
    ASSERT_TRUE(trace) << error;
    const int f = 0, g = 0, unnamed = 0;
    trace->name_kernels([&](const void* function) {
      return function == &f ? std::string("_Z6gemmv") : function == &g ? std::string("softmax") : std::string();
    });
    constexpr CUdeviceptr a = 0x10000000;
    trace->allocated(a, 256 << 20, 0, 0);
    trace->allocated(0x40000000, 4096, 0, 0);  // below large_range: no address line
    trace->used(&f, {{0x30000000, 0}});  // nothing it saw: no line, and no name yet
    trace->used(&f, {{a, 0}});
    trace->used(&g, {{a, 8}});
    trace->used(&f, {{a, 16}});
    trace->used(&unnamed, {{a, 24}});
  }
  const std::string text = written();
  EXPECT_NE(text.find("a 0 268435456 0 0\n# at 0 0x10000000\na 1 4096 0 0\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("# at 1"), std::string::npos) << text;
  EXPECT_NE(text.find("# k0 _Z6gemmv\nu "), std::string::npos) << text;
  EXPECT_NE(text.find(" t0 k0 0\n# k1 softmax\nu "), std::string::npos) << text;
  EXPECT_EQ(text.find("# k0", text.find("# k0") + 1), std::string::npos) << text;  // once
  EXPECT_EQ(text.find("# k2"), std::string::npos) << text;
  EXPECT_NE(text.find(" t0 k2 0+24\n"), std::string::npos) << text;
  auto t = gmem::trace::load(temp_path(), &error);
  std::remove(temp_path().c_str());
  ASSERT_TRUE(t) << error;
  EXPECT_EQ(t->uses.size(), 4u);
}

}  // namespace
