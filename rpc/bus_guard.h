// Reads from memory that another process may shrink under us. A stats file is
// mapped from a file its owner can truncate at any time; touching the lost pages
// raises SIGBUS, which here turns into a failed copy instead of a dead gmemd.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gmem::rpc {

// Copies `words` 64-bit words from `src` (8-byte aligned, in a mapping) to `dst`,
// each with one relaxed atomic load, so that every word is seen whole as the
// writer stored it. False if the mapping no longer backs the range.
bool guarded_copy(uint64_t* dst, const uint64_t* src, size_t words) noexcept;

// The sequence-locked read of stats.h for `count` entries of `entry_words`
// words each, `stride_words` apart: an entry is kept (copied to dst, packed)
// (`kept[i]` true) only if its first word, the sequence, reads equal and even
// before and after the copy; an entry is tried a few times. Returns how many
// entries kept changing, or -1 if the mapping no longer backs the range.
long guarded_seqlock_copy(uint64_t* dst, bool* kept, const uint64_t* src, size_t count,
                          size_t entry_words, size_t stride_words) noexcept;

}  // namespace gmem::rpc
