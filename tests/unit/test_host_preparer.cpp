// The host preparer's thread (pool/host_preparer.h), with a maker that pins
// nothing: how many chunks it keeps ready.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "pool/host_preparer.h"

namespace gmem::pool {
namespace preparer_test {  // named: the unity build puts the tests of unit-pool in one file

constexpr std::size_t mib = 1 << 20;

// Waits up to a second for `made` to reach `count`, and a little longer for
// more that should not come.
bool settles_at(const std::atomic<int>& made, int count) {
  for (int i = 0; i < 1000 && made.load() < count; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return made.load() == count;
}

// Bytes added (pin_ahead) are prepared once beyond the target: the chunks
// taken count against them first and are not prepared again; then the
// target is kept as before.
TEST(HostPreparer, BytesAddedArePreparedOnceBeyondTheTarget) {
  std::atomic<int> made{0};
  HostPreparer preparer(4 * mib, 2 * mib, [&](vmm::Chunk*) {
    ++made;
    return CUDA_SUCCESS;
  });
  preparer.wake();
  ASSERT_TRUE(settles_at(made, 2)) << made.load() << " chunks for a target of two";
  preparer.add(6 * mib);
  ASSERT_TRUE(settles_at(made, 5)) << made.load() << " chunks after three more were added";
  vmm::Chunk out;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(preparer.take(&out));
  EXPECT_TRUE(settles_at(made, 5)) << "the added chunks taken were prepared again";
  ASSERT_TRUE(preparer.take(&out));
  EXPECT_TRUE(settles_at(made, 6)) << "the target's chunk taken was not prepared again";
  // What drain() gives back ends what was added.
  preparer.add(4 * mib);
  ASSERT_TRUE(settles_at(made, 8));
  EXPECT_EQ(preparer.drain().size(), 4u);
  preparer.wake();
  EXPECT_TRUE(settles_at(made, 10)) << "the target alone, after a drain";
}

}  // namespace preparer_test
}  // namespace gmem::pool
