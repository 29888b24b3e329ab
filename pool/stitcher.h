// Builds a new range for a request no cached range fits: free chunks
// reusable on its stream first (the device's own, then, while the device is
// full, spilled ones), then new memory for the rest: the device's, else a
// peer's and the host's through the tiers. While the pool holds no more than
// its peak use and the headroom it makes new memory rather than take cached
// memory apart; beyond, it stitches as many free chunks as it takes and makes
// a chunk far too big again at the size needed. Used under VmmPool's lock.
#pragma once

#include <functional>
#include <unordered_set>
#include <vector>

#include "pool/ranges.h"

namespace gmem::pool {

class Stitcher {
 public:
  // Device chunks stitched into one range: at most this many while the pool
  // may grow instead, at most `most_parts` when it may not. Spilled chunks are
  // not counted: host chunks are units, of which a range takes as many as its
  // spill needs.
  static constexpr std::size_t max_parts = 8;
  static constexpr std::size_t most_parts = 64;

  // `headroom`: how much more than its peak use, as a fraction of it, the pool
  // may hold rather than make a chunk far too big for a request again.
  // `reclaim(device)`: once the device refuses memory, makes every free the
  // pool waits on complete and every empty slab a cached range.
  Stitcher(Books& books, StreamOrder& order, Pieces& pieces, Ranges& ranges, Tiers* tiers, double headroom,
           std::function<void(int)> reclaim)
      : books_(books),
        order_(order),
        pieces_(pieces),
        ranges_(ranges),
        tiers_(tiers),
        headroom_(headroom),
        reclaim_(std::move(reclaim)) {}

  // A new range of at least `size` bytes on `device`, stitched from free
  // chunks reusable on `stream` and new memory; its chunks are held. With
  // `off_device`, that many of its bytes come from spilled free chunks and
  // new peer and host memory first (as far as the tiers have room), the rest
  // from the device as usual.
  CUresult stitch(std::size_t size, int device, StreamId stream, std::size_t off_device, Range** out);
  // Free ranges whose chunks stitches take only where no others serve (null:
  // none): the ranges due to serve later in a step that repeats (VmmPool).
  void spare(const std::unordered_set<const Range*>* ranges) { spare_ = ranges; }
  // `old`, a range just taken to serve the request it served last, partly
  // off the device, made again with the device's chunks `with` (those that
  // were free all through its last life, Range::idle_in_life, and others
  // the pool chose: VmmPool::remake_with) that are free and reusable on
  // `stream` now, in place of as many of its spilled chunks as they cover:
  // in a job whose steps repeat, those chunks serve no other request while
  // this one lives, so the device's memory stops lying idle beside the
  // host's. `old` goes back to the cache (its chunks are the new range's
  // while it lives; the spilled ones it no longer needs are free). Null, and
  // `old` as it was, where no spilled chunk would be replaced, or where the
  // device's chunks would cover less than a quarter of what the new range
  // maps again of the spilled ones.
  Range* remake(Range& old, std::size_t size, StreamId stream, std::vector<FreePieces::key_type> with);
  // Whether the pool may take `size` more bytes of new memory rather than
  // take cached memory apart: it holds at most its peak use and the headroom.
  bool may_grow(const Book& book, std::size_t size) const;
  // Whether `device` is full; once it was, the tiers are asked again each
  // time (one cuMemGetInfo, on the way to a miss).
  bool device_full(int device, std::size_t size);

 private:
  // Which free chunks take_free may take: the device's own, spilled ones, or both.
  enum class Tier { device, spilled, any };
  // Moves free chunks of `tier` reusable on `stream` into `parts` (at most
  // `most_parts` on the device) until they cover `size` or none serves; a
  // device chunk far too big is made again at the size needed unless
  // `may_grow` (new memory may then serve instead).
  void take_free(int device, std::size_t size, StreamId stream, bool may_grow, std::size_t most_parts, Tier tier,
                 std::vector<Piece*>* parts, std::size_t* covered);
  // Spilled free chunks, then new peer and host memory, until `size` is covered
  // or the tiers have no more room.
  void add_off_device(int device, std::size_t size, StreamId stream, std::vector<Piece*>* parts,
                      std::size_t* covered);
  // New memory for what the free chunks did not cover, down to the host.
  CUresult add_new(int device, std::size_t size, std::vector<Piece*>* parts, std::size_t* covered);
  // Too many device chunks for one range: the smallest that nothing may use
  // any more are released, to be made again as one chunk (add_new); returns
  // their bytes, taken off what `parts` cover.
  std::size_t merge(std::vector<Piece*>* parts, std::size_t* covered);

  Books& books_;
  StreamOrder& order_;
  Pieces& pieces_;
  Ranges& ranges_;
  Tiers* const tiers_;
  const double headroom_;
  const std::function<void(int)> reclaim_;
  const std::unordered_set<const Range*>* spare_ = nullptr;
};

}  // namespace gmem::pool
