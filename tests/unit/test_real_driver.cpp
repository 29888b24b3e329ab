// Finding the real driver: the loader's order, and never a gmem shim.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "interpose/real_driver.h"

namespace gmem {
namespace {

namespace fs = std::filesystem;

TEST(RealDriver, LibraryPathComesFirstThenDefaults) {
  auto c = loader_candidates("/opt/a::/opt/b;/opt/c", "/nonexistent-cache");
  ASSERT_GE(c.size(), 4u);
  EXPECT_EQ(c[0], "/opt/a/libcuda.so.1");
  EXPECT_EQ(c[1], "/opt/b/libcuda.so.1");
  EXPECT_EQ(c[2], "/opt/c/libcuda.so.1");
  EXPECT_EQ(c[3], "/lib/x86_64-linux-gnu/libcuda.so.1");
}

TEST(RealDriver, ReadsTheLdSoCache) {
  // A real cache, built by ldconfig from a directory holding a libcuda.so.1.
  fs::path dir = fs::temp_directory_path() / ("gmem-ldcache-" + std::to_string(getpid()));
  fs::create_directories(dir / "lib");
  fs::copy_file(GMEM_SHIM_PATH, dir / "lib" / "libcuda.so.1", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "ld.so.conf") << (dir / "lib").string() << "\n";
  std::string cmd = "ldconfig -X -C " + (dir / "ld.so.cache").string() + " -f " + (dir / "ld.so.conf").string();
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "ldconfig could not build a cache: " << cmd;
  auto c = loader_candidates(nullptr, (dir / "ld.so.cache").c_str());
  EXPECT_NE(std::find(c.begin(), c.end(), (dir / "lib" / "libcuda.so.1").string()), c.end());
  EXPECT_LT(std::find(c.begin(), c.end(), (dir / "lib" / "libcuda.so.1").string()) - c.begin(),
            std::find(c.begin(), c.end(), "/lib/x86_64-linux-gnu/libcuda.so.1") - c.begin());
  fs::remove_all(dir);
}

TEST(RealDriver, RecognisesTheShimByItsNote) {
  EXPECT_TRUE(is_gmem_shim(GMEM_SHIM_PATH));
  EXPECT_FALSE(is_gmem_shim(GMEM_EMU_PATH));
  EXPECT_FALSE(is_gmem_shim("/bin/sh"));
  EXPECT_FALSE(is_gmem_shim("/nonexistent"));
}

TEST(RealDriver, ForcedPathThatIsTheShimIsRefused) {
  setenv("GMEM_REAL_LIBCUDA", GMEM_SHIM_PATH, 1);
  RealDriver r = open_real_driver();
  unsetenv("GMEM_REAL_LIBCUDA");
  EXPECT_EQ(r.handle, nullptr);
  ASSERT_EQ(r.tried.size(), 1u);
  EXPECT_NE(r.tried[0].find("(a gmem shim)"), std::string::npos);
}

TEST(RealDriver, SkipsShimsInTheLibraryPath) {
  setenv("LD_LIBRARY_PATH", (fs::path(GMEM_SHIM_PATH).parent_path().string() + ":" +
                             fs::path(GMEM_EMU_PATH).parent_path().string()).c_str(), 1);
  RealDriver r = open_real_driver();
  ASSERT_NE(r.handle, nullptr);
  EXPECT_EQ(r.path, fs::path(GMEM_EMU_PATH).parent_path().string() + "/libcuda.so.1");
}

}  // namespace
}  // namespace gmem
