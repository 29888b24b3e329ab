// The submission gate (interpose/gate.h) as the mover and the C++ hooks use
// it; the generated trampolines follow the same protocol in assembly (covered
// end to end by pool-tiers-move and, on a GPU, tests/e2e/migrate.c).
#include "interpose/gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

namespace gmem::gate {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A thread that makes one gated call once started (a kernel launch with
// `launch`): it holds a Pass for `hold`.
class Caller {
 public:
  explicit Caller(std::chrono::milliseconds hold = 0ms, bool launch = false)
      : thread_([this, hold, launch] {
          Pass pass(launch);
          passed_ = true;
          std::this_thread::sleep_for(hold);
        }) {}
  ~Caller() { thread_.join(); }
  bool passed() const { return passed_; }

 private:
  std::atomic<bool> passed_{false};
  std::thread thread_;
};

class Gate : public ::testing::Test {
 protected:
  void SetUp() override { turn_on(); }
  Submissions gate_;
};

TEST_F(Gate, ACallWaitsWhileTheMoverHoldsTheGateAndGoesOnWhenItResumes) {
  ASSERT_TRUE(gate_.stop());
  ASSERT_TRUE(gate_.hold());
  Caller caller;
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(caller.passed());
  gate_.resume();
  for (int i = 0; i < 500 && !caller.passed(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(caller.passed());
}

// Calls other than launches count as they enter (pool/evictor.h compares the
// count across a move); launches do not.
TEST_F(Gate, EntriesCountCallsOtherThanLaunches) {
  const uint64_t before = gate_.entries();
  { Pass launch(true); }
  EXPECT_EQ(gate_.entries(), before);
  { Pass copy; }
  EXPECT_EQ(gate_.entries(), before + 1);
}

TEST_F(Gate, StopWaitsForTheCallsInFlight) {
  auto start = Clock::now();
  {
    Caller caller(200ms);
    while (!caller.passed()) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(in_flight(), 1);
    EXPECT_TRUE(gate_.stop());
    EXPECT_GE(Clock::now() - start, 150ms);
    EXPECT_EQ(in_flight(), 0);
    gate_.resume();
  }
}

// A call that stays in flight longer than `patience` (a copy waiting on work
// that never ends): the mover gives up, and the gate is open again.
TEST_F(Gate, StopGivesUpOnACallThatStaysInFlight) {
  Caller caller(patience + 1s);
  while (!caller.passed()) std::this_thread::sleep_for(1ms);
  auto start = Clock::now();
  EXPECT_FALSE(gate_.stop());
  EXPECT_GE(Clock::now() - start, patience);
  Caller another;
  for (int i = 0; i < 500 && !another.passed(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(another.passed()) << "the gate stayed closed";
}

// The mover stopped the gate but has not begun moving (it waits for the
// device): a caller held longer than `patience` opens the gate again, and the
// mover learns it may not move.
TEST_F(Gate, ACallerHeldTooLongReopensAGateNotYetHeld) {
  ASSERT_TRUE(gate_.stop());
  auto start = Clock::now();
  {
    Caller caller;
    while (!caller.passed() && Clock::now() - start < 3 * patience) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(caller.passed());
    EXPECT_GE(Clock::now() - start, patience);
  }
  EXPECT_FALSE(gate_.hold());
  gate_.resume();
}

// While ranges move, launches pass and other calls wait; mark_more runs its
// mark once the launches in flight have left, holding new ones meanwhile.
TEST_F(Gate, MarkMoreRunsOnceNoLaunchIsInFlightAndHoldsNewOnes) {
  ASSERT_TRUE(gate_.begin_moves([] {}));
  Caller copy;
  std::optional<Caller> later;
  {
    Caller launch(200ms, true);
    while (!launch.passed()) std::this_thread::sleep_for(1ms);
    const auto start = Clock::now();
    long in_flight_at_mark = -1;
    EXPECT_TRUE(gate_.mark_more([&] {
      in_flight_at_mark = in_flight();
      later.emplace(0ms, true);
      std::this_thread::sleep_for(100ms);
      EXPECT_FALSE(later->passed()) << "a launch passed while ranges were marked";
    }));
    EXPECT_GE(Clock::now() - start, 150ms);
    EXPECT_EQ(in_flight_at_mark, 0);
  }
  for (int i = 0; i < 500 && !later->passed(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(later->passed()) << "launches stayed held after the mark";
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(copy.passed()) << "a call other than a launch passed while ranges move";
  gate_.end_moves();
  for (int i = 0; i < 500 && !copy.passed(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(copy.passed());
}

TEST_F(Gate, MarkMoreNeedsMovesUnderWay) {
  bool marked = false;
  EXPECT_FALSE(gate_.mark_more([&] { marked = true; }));
  EXPECT_FALSE(marked);
  Caller copy;
  for (int i = 0; i < 500 && !copy.passed(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(copy.passed()) << "the gate closed";
}

}  // namespace
}  // namespace gmem::gate
