#include <gtest/gtest.h>

#include "interpose/proc_table.h"

namespace gmem {
namespace {

std::string lookup(const char* symbol, int version, unsigned long long flags = 0) {
  ProcLookup found = find_proc(symbol, version, flags);
  return found.index < 0 ? "" : function_names[found.index];
}

TEST(ProcTable, VersionSelectsTheAbi) {
  EXPECT_EQ(lookup("cuMemAlloc", 2000), "cuMemAlloc");
  EXPECT_EQ(lookup("cuMemAlloc", 3020), "cuMemAlloc_v2");
  EXPECT_EQ(lookup("cuMemAlloc", 13000), "cuMemAlloc_v2");
  EXPECT_EQ(lookup("cuCtxCreate", 11040), "cuCtxCreate_v3");
  EXPECT_EQ(lookup("cuCtxCreate", 13000), "cuCtxCreate_v4");
  EXPECT_EQ(lookup("cuGetProcAddress", 12000), "cuGetProcAddress_v2");
}

TEST(ProcTable, PerThreadFlagSelectsPtszAndPtds) {
  constexpr auto per_thread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  EXPECT_EQ(lookup("cuMemAllocAsync", 13000, per_thread), "cuMemAllocAsync_ptsz");
  EXPECT_EQ(lookup("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM), "cuMemAllocAsync");
  EXPECT_EQ(lookup("cuMemFreeAsync", 13000, per_thread), "cuMemFreeAsync_ptsz");
  EXPECT_EQ(lookup("cuMemcpyHtoD", 13000, per_thread), "cuMemcpyHtoD_v2_ptds");
  EXPECT_EQ(lookup("cuStreamGetCaptureInfo", 11030, per_thread), "cuStreamGetCaptureInfo_v2_ptsz");
  // A function without a per-thread variant gives its plain ABI.
  EXPECT_EQ(lookup("cuMemAlloc", 13000, per_thread), "cuMemAlloc_v2");
}

TEST(ProcTable, TooOldOrUnknown) {
  ProcLookup old = find_proc("cuMemAllocAsync", 11000, 0);
  EXPECT_EQ(old.index, -1);
  EXPECT_TRUE(old.name_known);
  ProcLookup unknown = find_proc("cuNoSuchFunction", 13000, 0);
  EXPECT_EQ(unknown.index, -1);
  EXPECT_FALSE(unknown.name_known);
  // Only base names are looked up, as the driver does.
  EXPECT_FALSE(find_proc("cuMemAlloc_v2", 13000, 0).name_known);
}

TEST(ProcTable, EverySymbolIsAnExportedFunction) {
  for (const ProcEntry& e : proc_table) {
    ASSERT_LT(e.index, static_cast<unsigned>(function_count));
    EXPECT_EQ(std::string_view(function_names[e.index]).substr(0, e.base.size()), e.base);
  }
}

}  // namespace
}  // namespace gmem
