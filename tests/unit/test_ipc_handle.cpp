// gmem's CUDA IPC handle (ipc/handle.h): what it encodes comes back, and only
// bytes that carry its whole magic are taken for one (a driver's handle never is).
#include <gtest/gtest.h>

#include <cstring>

#include "ipc/handle.h"

namespace {

using gmem::ipc::Handle;

TEST(IpcHandle, EncodesAndDecodes) {
  Handle h{};
  h.pid = 4242;
  h.device = 1;
  h.nonce = 0x0123456789abcdefull;
  h.id = 7;
  h.offset = 3 << 20;
  h.size = 123456;
  std::optional<Handle> back = gmem::ipc::decode(gmem::ipc::encode(h));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->pid, 4242u);
  EXPECT_EQ(back->device, 1u);
  EXPECT_EQ(back->nonce, h.nonce);
  EXPECT_EQ(back->id, 7u);
  EXPECT_EQ(back->offset, h.offset);
  EXPECT_EQ(back->size, h.size);
}

TEST(IpcHandle, OtherBytesAreNotGmemHandles) {
  CUipcMemHandle zero{};
  EXPECT_FALSE(gmem::ipc::decode(zero));
  // The readable half of the magic alone does not make one.
  CUipcMemHandle near = gmem::ipc::encode(Handle{});
  near.reserved[15] ^= 1;
  EXPECT_FALSE(gmem::ipc::decode(near));
  // A handle as the driver gives them (cupy issue 9436, from a real GPU).
  const unsigned char driver[] = {0xe0, 0xdf, 0x23, 0x62, 0xe8, 0x5f, 0x00, 0x00, 0xd8, 0x29, 0x10, 0x00, 0x00,
                                  0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02};
  CUipcMemHandle theirs{};
  std::memcpy(theirs.reserved, driver, sizeof driver);
  EXPECT_FALSE(gmem::ipc::decode(theirs));
}

TEST(IpcHandle, TheSocketIsAbstractAndNamedFromPidAndNonce) {
  const std::string name = gmem::ipc::socket_name(4242, 0xabc);
  ASSERT_FALSE(name.empty());
  EXPECT_EQ(name[0], '\0');
  EXPECT_NE(name.find("4242"), std::string::npos);
  EXPECT_NE(name, gmem::ipc::socket_name(4242, 0xabd));
}

}  // namespace
