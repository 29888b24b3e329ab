// The C++ trace reader (tests/bench/trace.cpp): what the format allows, what it
// rejects with the line named, and the peak requested it computes.
#include <gtest/gtest.h>

#include <sstream>

#include "trace.h"

namespace {

using gmem::trace::parse;

std::optional<gmem::trace::Trace> read(const std::string& text, std::string* error) {
  std::istringstream in(text);
  return parse(in, "t", error);
}

const std::string header = "# gmem allocation trace v1\n";

TEST(Trace, ReadsEventsStreamsAndThePeak) {
  std::string error;
  auto t = read(header + "# from a test\n\na 0 100 0\na 1 50 2\nf 0\na 0 70 1\nf 1\nf 0\na 3 5 0\n", &error);
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->events.size(), 7u);
  EXPECT_TRUE(t->events[0].alloc);
  EXPECT_EQ(t->events[1].bytes, 50u);
  EXPECT_EQ(t->events[1].stream, 2u);
  EXPECT_FALSE(t->events[2].alloc);
  EXPECT_EQ(t->events[2].id, 0u);
  EXPECT_EQ(t->peak_requested, 150u);  // 100 + 50; later 70 + 50 = 120
  EXPECT_EQ(t->events[0].off_device, 0u);
  EXPECT_EQ(t->streams, 3u);
  EXPECT_EQ(t->ids, 4u);
}

TEST(Trace, AScaledTraceIsTheSameJobWithItsLargeRequestsScaled) {
  std::string error;
  std::istringstream in(header + "a 0 4194304 0 2097152\na 1 100 0\nf 0\na 0 3145728 0\n");
  auto t = parse(in, "t", &error, 0.5);
  ASSERT_TRUE(t) << error;
  EXPECT_EQ(t->events[0].bytes, 2097152u);
  EXPECT_EQ(t->events[0].off_device, 1048576u);
  EXPECT_EQ(t->events[1].bytes, 100u) << "below 1 MiB: kept";
  EXPECT_EQ(t->events[3].bytes, 1572864u);
  EXPECT_EQ(t->peak_requested, 2097152u + 100u);
}

TEST(Trace, GmemsOwnTracesSayWhatWasPlacedOffTheDevice) {
  std::string error;
  auto t = read(header + "a 0 100 0 40\na 1 50 1 0\nf 0\n", &error);
  ASSERT_TRUE(t) << error;
  EXPECT_EQ(t->events[0].off_device, 40u);
  EXPECT_EQ(t->events[0].stream, 0u);
  EXPECT_EQ(t->events[1].off_device, 0u);
  EXPECT_EQ(t->events[1].stream, 1u);
  EXPECT_EQ(t->device_full, 0u);  // not said
}

TEST(Trace, GmemsOwnTracesSayHowMuchOfTheDeviceThePoolHeldWhenItFilled) {
  std::string error;
  auto t = read(header + "a 0 100 0\n# made: 1 mappings in 0.1 ms, 0 bytes on the host\n"
                         "# device full: the pool held 78123456512 bytes of the device\na 1 50 0 50\n",
                &error);
  ASSERT_TRUE(t) << error;
  EXPECT_EQ(t->device_full, 78123456512u);
  EXPECT_EQ(t->events.size(), 2u);
  EXPECT_EQ(t->counting_from, 0u);  // not said: from the start
  auto counted = read(header + "a 0 100 0\nf 0\n# counting launches from the next allocation\na 1 50 0\n", &error);
  ASSERT_TRUE(counted) << error;
  EXPECT_EQ(counted->counting_from, 2u);
}

TEST(Trace, GmemsOwnTracesSayWhatEachLaunchUsedBetweenWhichEvents) {
  std::string error;
  auto t = read(header + "a 0 100 0\na 1 50 0\nu 12 0\nu 15 1 0\nf 0\n", &error);
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->uses.size(), 2u);
  EXPECT_EQ(t->uses[0].before, 2u);
  EXPECT_EQ(t->uses[0].ids, std::vector<std::uint32_t>{0});
  EXPECT_EQ(t->uses[1].ids, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_EQ(t->events.size(), 3u);
}

// `# ran` lines time a use line's launch (counted from 0): its GPU time and
// its bytes in host memory then.
TEST(Trace, RanLinesTimeAnEarlierUseLine) {
  std::string error;
  auto t = read(header + "a 0 100 0\nu 12 0\nu 15 0\n# ran: use 1 in 1667.5 us, 64 bytes on the host\nf 0\n", &error);
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->uses.size(), 2u);
  EXPECT_EQ(t->uses[0].ran_host, 0u);
  EXPECT_DOUBLE_EQ(t->uses[1].ran_us, 1667.5);
  EXPECT_EQ(t->uses[1].ran_host, 64u);
}

// A `# mover` line names a live allocation the mover moved onto the device,
// before the next event (pool-policy --moves brings it in there).
TEST(Trace, MoverLinesNameALiveAllocationBeforeTheNextEvent) {
  std::string error;
  auto t = read(header + "a 0 100 0\na 1 50 0\n# mover 99423899 1 moved\nf 1\n# mover 99423950 0 moved\n", &error);
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->moves.size(), 2u);
  EXPECT_EQ(t->moves[0].id, 1u);
  EXPECT_EQ(t->moves[0].before, 2u);
  EXPECT_EQ(t->moves[1].id, 0u);
  EXPECT_EQ(t->moves[1].before, 3u);
}

// Lines since 2026-11-27 name the launching thread and function, and offsets.
TEST(Trace, UseLinesMayNameTheirThreadTheirFunctionAndOffsets) {
  std::string error;
  auto t = read(header + "a 0 100 0\na 1 50 0\nu 12 t3 k0 0+99 1\nu 15 t1 1+8\nu 16 0\n", &error);
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->uses.size(), 3u);
  EXPECT_EQ(t->uses[0].thread, 3u);
  EXPECT_EQ(t->uses[0].function, 1u);  // k0
  EXPECT_EQ(t->uses[0].ids, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(t->uses[0].offsets, (std::vector<std::uint64_t>{99, 0}));
  EXPECT_EQ(t->uses[1].thread, 1u);
  EXPECT_EQ(t->uses[1].function, 0u);  // a graph: no function
  EXPECT_EQ(t->uses[1].offsets, std::vector<std::uint64_t>{8});
  EXPECT_EQ(t->uses[2].thread, 0u);
  EXPECT_EQ(t->uses[2].function, 0u);
  EXPECT_EQ(t->uses[2].offsets, std::vector<std::uint64_t>{0});
}

TEST(Trace, RejectsWhatBreaksTheFormatNamingTheLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"# gmem allocation trace v2\n", "t:1: expected '# gmem allocation trace v1'"},
      {"", "t:0: empty"},
      {header + "a 0 100 0\na 0 5 0\n", "t:3: allocation of id 0, which is live"},
      {header + "f 1\n", "t:2: free of id 1, which is not live"},
      {header + "a 0 100 0\nf 0\nf 0\n", "t:4: free of id 0, which is not live"},
      {header + "a 0 0 0\n", "t:2: allocation of 0 bytes"},
      {header + "a 0 10 256\n", "t:2: expected 'a ID BYTES STREAM [OFF_DEVICE]'"},
      {header + "a 16777216 10 0\n", "t:2: expected"},
      {header + "a 0 -1 0\n", "t:2: expected"},
      {header + "a 0 10\n", "t:2: expected"},
      {header + "x 0\n", "t:2: expected"},
      {header + "a 0 10 0 11\n", "t:2: unexpected '11'"},  // more off the device than allocated
      {header + "a 0 10 0 7 1\n", "t:2: unexpected '1'"},
      {header + "a 0 99999999999999999999999 0\n", "t:2: expected"},
      {header + "# device full: the pool held many bytes of the device\n", "t:2: expected '# device full: the pool held BYTES"},
      {header + "a 0 10 0\nu 5\n", "t:3: expected 'u TIME_US [tTHREAD [kFUNCTION]] ID[+OFFSET]...'"},
      {header + "a 0 10 0\nu 5 0 x\n", "t:3: expected 'u TIME_US"},
      {header + "a 0 10 0\nu x 0\n", "t:3: expected 'u TIME_US"},
      {header + "a 0 10 0\nu 5 t0 k1\n", "t:3: expected 'u TIME_US"},  // no id
      {header + "a 0 10 0\nu 5 k1 t0 0\n", "t:3: expected 'u TIME_US"},  // the function before the thread
      {header + "a 0 10 0\nu 5 t 0\n", "t:3: expected 'u TIME_US"},
      {header + "a 0 10 0\nu 5 t0 0+\n", "t:3: expected 'u TIME_US"},
      {header + "a 0 10 0\nu 5 t0 0+x\n", "t:3: expected 'u TIME_US"},
      {header + "a 0 10 0\nu 5 t0 0 t1\n", "t:3: expected 'u TIME_US"},
      {header + "a 0 10 0\nu 5 t0 0+10\n", "t:3: an offset past the end of id 0"},
      {header + "a 0 10 0\nu 5 1\n", "t:3: use of id 1, which is not live"},
      {header + "a 0 10 0\nf 0\nu 5 0\n", "t:4: use of id 0, which is not live"},
      {header + "a 0 10 0\nu 12 0\nu 15 0\n# ran: use 2 in 5 us, 64 bytes on the host\n",  // no third use
       "t:5: expected '# ran: use N in US us, BYTES bytes on the host'"},
      {header + "a 0 10 0\nu 12 0\nu 15 0\n# ran: use 0 in -5 us, 64 bytes on the host\n",
       "t:5: expected '# ran: use N in US us, BYTES bytes on the host'"},
      {header + "a 0 10 0\nu 12 0\nu 15 0\n# ran: use 0 in 5 us, 64 bytes\n",
       "t:5: expected '# ran: use N in US us, BYTES bytes on the host'"},
      {header + "a 0 10 0\n# mover 5 0 parked\n", "t:3: expected '# mover TIME_US ID moved'"},
      {header + "a 0 10 0\n# mover 5 0 moved twice\n", "t:3: expected '# mover TIME_US ID moved'"},
      {header + "a 0 10 0\n# mover 0 moved\n", "t:3: expected '# mover TIME_US ID moved'"},
      {header + "a 0 10 0\nf 0\n# mover 5 0 moved\n", "t:4: move of id 0, which is not live"},
  };
  for (const auto& [text, message] : cases) {
    std::string error;
    EXPECT_FALSE(read(text, &error)) << text;
    EXPECT_EQ(error.rfind(message, 0), 0u) << "got: " << error << "\nwanted: " << message;
  }
}

TEST(Trace, NamesAreWordsWithoutTheSuffix) {
  EXPECT_EQ(gmem::trace::name_of("/x/y/gnn-gcn.v1.trace"), "gnn_gcn_v1");
  EXPECT_EQ(gmem::trace::name_of("lm"), "lm");
}

TEST(Trace, CompressedTracesAreRefusedWithAWayOut) {
  std::string error;
  EXPECT_FALSE(gmem::trace::load("x.trace.gz", &error));
  EXPECT_NE(error.find("gunzip"), std::string::npos) << error;
}

}  // namespace
