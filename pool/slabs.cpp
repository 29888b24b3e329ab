// The small-request sub-allocator: requests up to 1 MiB served from slabs
// carved out of pool ranges (pool/slabs.h).
#include "pool/slabs.h"

#include <algorithm>
#include <bit>
#include <vector>

namespace gmem::pool {

namespace {

constexpr std::size_t smallest_class = 512;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::size_t Slabs::size_class(std::size_t size) {
  if (size <= smallest_class) return smallest_class;
  return round_up(size, std::bit_floor(size - 1) / 4);
}

bool Slabs::take(std::size_t class_size, int device, StreamId stream, Range** slab, std::size_t* index) {
  Device& d = devices_[device];
  auto& blocks = d.free_blocks[class_size];
  // The free block at the lowest address this stream may use (a few are looked at).
  auto found = blocks.end();
  int looked = 0;
  for (auto it = blocks.begin(); it != blocks.end() && looked++ < 8; ++it) {
    if (order_.ready(it->second, stream)) {
      found = it;
      break;
    }
  }
  if (found == blocks.end()) return false;
  *slab = ranges_.find(found->first);
  *index = (found->first - (*slab)->va.base()) / class_size;
  order_.settle(found->second);
  blocks.erase(found);
  if ((*slab)->live++ == 0) d.empty.erase(*slab);
  books_[device].cached_bytes -= class_size;
  return true;
}

void Slabs::add(Range& range, std::size_t class_size) {
  auto& blocks = devices_[range.device].free_blocks[class_size];
  range.class_size = class_size;
  range.blocks.resize(range.va.size() / class_size);
  for (std::size_t i = 1; i < range.blocks.size(); ++i) blocks.emplace(range.va.base() + i * class_size, Pending{});
  books_[range.device].cached_bytes += range.va.size() - class_size;
  range.live = 1;
}

void Slabs::release(Range& slab, std::size_t index, const Pending& pending) {
  Device& d = devices_[slab.device];
  order_.share(d.free_blocks[slab.class_size][slab.blocks[index].base], pending);
  books_[slab.device].cached_bytes += slab.class_size;
  if (--slab.live == 0) d.empty.insert(&slab);
}

bool Slabs::cache_empty(int device, StreamId stream, bool wait) {
  Device& d = devices_[device];
  std::vector<std::pair<Range*, Pending>> empty;  // with the last of their frees
  for (Range* r : d.empty) {
    auto& blocks = d.free_blocks[r->class_size];
    auto first = blocks.lower_bound(r->va.base()), end = blocks.lower_bound(r->va.base() + r->va.size());
    // On the stream of the frees, stream order puts new work after them all.
    Pending last;
    auto reusable = [&](Pending& p) {
      if (!order_.reusable(p, stream, wait)) return false;
      if (StreamOrder::later(p, last)) last = p;  // a free waited for is settled: not later
      return true;
    };
    if (!std::all_of(first, end, [&](auto& b) { return reusable(b.second); })) continue;
    Pending kept;
    order_.share(kept, last);
    for (auto b = first; b != end; ++b) order_.settle(b->second);
    blocks.erase(first, end);
    empty.emplace_back(r, kept);
  }
  // Mapped as they are: a later slab or request of their size takes them
  // back without the driver, and their chunks serve any range meanwhile.
  for (auto& [r, last] : empty) {
    d.empty.erase(r);
    books_[device].cached_bytes -= r->va.size();  // counted again as free chunks
    r->class_size = 0;
    r->blocks.assign(1, Block{});
    ranges_.cache(*r);
    order_.share(r->last_free, last);
    const int64_t now = now_ns();
    for (Piece* p : r->pieces) {
      pieces_.set_free(*p, now);
      order_.share(p->pending, last);
    }
    order_.settle(last);
  }
  return !empty.empty();
}

std::size_t Slabs::largest_free(int device) const {
  const Device* d = devices_.find(device);
  if (!d) return 0;
  for (auto c = d->free_blocks.rbegin(); c != d->free_blocks.rend(); ++c) {
    if (!c->second.empty()) return c->first;
  }
  return 0;
}

}  // namespace gmem::pool
