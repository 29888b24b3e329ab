// gmem's CUDA IPC handle for pool memory, in the 64 bytes of a CUipcMemHandle,
// and the exporter's protocol. The driver cannot export pool memory (VMM
// memory is not legacy-IPC capable), so gmem hands out its own handles: the
// exporting process's pid and a nonce name the abstract unix socket its
// listener serves; the id names the export there. The 16-byte magic keeps a
// driver's handle from being taken for gmem's (and gmem's from reaching the
// driver).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

namespace gmem::ipc {

struct Handle {
  static constexpr uint8_t magic_bytes[16] = {'g', 'm', 'e', 'm', '-', 'i', 'p', 'c',
                                              0x9e, 0x37, 0x79, 0xb9, 0x7f, 0x4a, 0x7c, 0x01};
  uint8_t magic[16];
  uint32_t pid;     // the exporting process
  uint32_t device;  // the exporter's device (for messages)
  uint64_t nonce;   // its listener's: with the pid, the socket's name
  uint64_t id;      // the export, in that process
  uint64_t offset;  // of the allocation in the exported memory (a slab's block)
  uint64_t size;    // of the allocation, as requested
  uint64_t reserved;
};
static_assert(sizeof(Handle) == sizeof(CUipcMemHandle) && std::is_trivially_copyable_v<Handle>,
              "a gmem handle fills a CUipcMemHandle");

CUipcMemHandle encode(const Handle& h);
// The gmem handle in `raw`; nullopt for anything else (a driver's handle).
std::optional<Handle> decode(const CUipcMemHandle& raw);

// The abstract unix socket (a leading NUL) the exporter `pid` listens on.
std::string socket_name(uint32_t pid, uint64_t nonce);

// The protocol on that socket (SOCK_SEQPACKET): the importer sends a Request;
// the exporter answers with a Reply, then one ChunkMessage per chunk, each
// with that chunk's POSIX fd attached, in address order.
constexpr uint32_t protocol_magic = 0x43504947;  // "GIPC"
struct Request {
  uint32_t magic = protocol_magic;
  uint32_t reserved = 0;
  uint64_t id = 0;
};
struct Reply {
  uint32_t magic = protocol_magic;
  int32_t status = CUDA_SUCCESS;  // CUDA_ERROR_INVALID_VALUE: no such export (freed)
  uint64_t chunks = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};
struct ChunkMessage {
  uint64_t size = 0;
};

}  // namespace gmem::ipc
