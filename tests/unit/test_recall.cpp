// Recall (pool/recall.h): a request is known by its size and how many of that
// size are live, and finds the ranges that served it last, the most recent first.
#include <gtest/gtest.h>

#include "pool/recall.h"

namespace {

using gmem::pool::Recall;
constexpr std::size_t mib = std::size_t{1} << 20;

TEST(Recall, ARequestIsKnownBySizeAndHowManyOfItsSizeAreLive) {
  Recall recall;
  const uint64_t first = recall.key(96 * mib);
  recall.served(first, 96 * mib, {0x1000, 1});
  const uint64_t second = recall.key(96 * mib);
  EXPECT_NE(second, first);  // the second layer's activation, the first still live
  EXPECT_NE(recall.key(64 * mib), first);
  recall.served(second, 96 * mib, {0x2000, 2});
  recall.freed(96 * mib);
  recall.freed(96 * mib);
  // The next step: the same requests, the same keys, what served them then.
  EXPECT_EQ(recall.key(96 * mib), first);
  EXPECT_EQ(recall.last(first)[0].base, 0x1000u);
  recall.served(first, 96 * mib, {0x1000, 1});
  EXPECT_EQ(recall.key(96 * mib), second);
  EXPECT_EQ(recall.last(second)[0].id, 2u);
  EXPECT_EQ(recall.last(recall.key(32 * mib))[0].base, 0u);  // never served
}

TEST(Recall, ASharedKeyRemembersItsLastRangesMostRecentFirst) {
  Recall recall;
  const uint64_t key = recall.key(64 * mib);
  for (uint64_t id : {1, 2, 1, 3, 4, 5}) {
    recall.served(key, 64 * mib, {0x1000 * id, id});
    recall.freed(64 * mib);
  }
  const Recall::Last last = recall.last(key);
  ASSERT_EQ(last.size(), Recall::remembered);
  EXPECT_EQ(last[0].id, 5u);
  EXPECT_EQ(last[1].id, 4u);
  EXPECT_EQ(last[2].id, 3u);
  EXPECT_EQ(last[3].id, 1u);  // moved up when it served again; 2 is forgotten
}

// A refused request's range is not recalled: the ones before it are.
TEST(Recall, TheRangeOfARefusedRequestIsForgotten) {
  Recall recall;
  const uint64_t key = recall.key(64 * mib);
  recall.served(key, 64 * mib, {0x1000, 1});
  recall.freed(64 * mib);
  recall.served(key, 64 * mib, {0x2000, 2});
  recall.unserve(1);  // not the last served: nothing changes
  EXPECT_EQ(recall.last(key)[1].id, 1u);
  recall.unserve(2);
  recall.freed(64 * mib);
  EXPECT_EQ(recall.last(key)[0].id, 1u);
  EXPECT_EQ(recall.last(key)[1].id, 0u);
}

// Why a last range did not serve: where placed otherwise, whether it would
// also have been kept from serving (its chunks in use, or not yet free).
TEST(Recall, AMissPlacedOtherwiseSaysWhatElseKeptItsRange) {
  using Why = Recall::Missed::Why;
  EXPECT_EQ((Recall::Missed{Why::placed, 8 * mib}.text()), "the request's last range had 8388608 bytes off the device");
  EXPECT_EQ((Recall::Missed{Why::placed, 8 * mib, 2 * mib, 0, 1}.text()),
            "the request's last range had 8388608 bytes off the device, and 2097152 bytes (0 off the device) in use "
            "through 1 other ranges");
  Recall::Missed waiting{Why::placed, 8 * mib};
  waiting.waiting = true;
  EXPECT_EQ(waiting.text(),
            "the request's last range had 8388608 bytes off the device, and was not yet free on its stream");
  EXPECT_EQ((Recall::Missed{Why::held, 0, 2 * mib, 0, 1}.text()),
            "the request's last range had 2097152 bytes (0 off the device) in use through 1 other ranges");
}

}  // namespace
