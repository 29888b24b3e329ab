// Stitching: builds a range for a request from free pieces, new device
// memory and, past the device, spill tiers (pool/stitcher.h).
#include "pool/stitcher.h"

#include <algorithm>
#include <iterator>

#include "pool/clock.h"

namespace gmem::pool {

namespace {

// The parts of a range on the device itself: the ones the part limits count
// (spilled chunks are units, of which a range takes as many as it needs).
std::size_t device_parts(const std::vector<Piece*>& parts) {
  return std::count_if(parts.begin(), parts.end(), [](const Piece* p) { return !p->spilled; });
}

}  // namespace

bool Stitcher::may_grow(const Book& book, std::size_t size) const {
  return book.figures.reserved + size <= book.peak_used + std::size_t(double(book.peak_used) * headroom_);
}

bool Stitcher::device_full(int device, std::size_t size) {
  Book& book = books_[device];
  if (!book.full || !tiers_) return book.full;
  book.full = tiers_->device_free(device, book.figures.reserved) < size;
  return book.full;
}

void Stitcher::take_free(int device, std::size_t size, StreamId stream, bool may_grow, std::size_t most_parts,
                         Tier tier, std::vector<Piece*>* parts, std::size_t* covered) {
  const bool spilled_too = tier != Tier::device;
  FreePieces& free = pieces_.free(device);
  // What a stitched range may hold beyond its request: a 32nd of it.
  const std::size_t slack = size / 32;
  auto first = [](auto from, auto to, auto&& usable) -> Piece* {
    for (auto it = from; it != to; ++it) {
      if (usable(*it->second)) return it->second;
    }
    return nullptr;
  };
  auto of_kind = [&](const Piece& p) { return tier == Tier::any || p.spilled == (tier == Tier::spilled); };
  // First without the chunks of the ranges spared, then with them.
  bool sparing = spare_ && !spare_->empty();
  auto spared = [&](const Piece& p) {
    return sparing && std::any_of(p.ranges.begin(), p.ranges.end(), [&](const Range* r) { return spare_->count(r); });
  };
  auto reusable = [&](Piece& p) { return of_kind(p) && order_.ready(p.pending, stream) && !spared(p); };
  auto spilled_ready = [&](Piece& p) { return p.spilled && order_.ready(p.pending, stream) && !spared(p); };
  std::size_t on_device = device_parts(*parts);
  auto fill = [&] {
    while (*covered < size) {
      const std::size_t need = size - *covered;
      auto fits = free.lower_bound({need, 0});
      auto too_big = free.upper_bound({need + slack, UINT64_MAX});
      // The smallest chunk that covers the rest within the slack (a spilled one:
      // no larger than the host chunk that would be pinned for it); else, while
      // the range may take more parts, the largest smaller one (spilled ones
      // are units: a range takes as many as it needs); else the smallest larger
      // one, made again at the size needed (unless the pool may grow: new
      // memory then serves the rest and no cached range is lost).
      Piece* piece = first(fits, too_big, reusable);
      if (const std::size_t as_new = !piece && spilled_too && tiers_ ? tiers_->host_chunk(device, need) : 0;
          as_new > need + slack) {
        piece = first(too_big, free.upper_bound({as_new, UINT64_MAX}), spilled_ready);
      }
      auto smaller = [&](Piece& p) { return reusable(p) && (p.spilled || on_device + 1 < most_parts); };
      if (!piece && (spilled_too || on_device + 1 < most_parts)) {
        piece = first(std::make_reverse_iterator(fits), free.rend(), smaller);
      }
      bool split = !piece && !may_grow && tier != Tier::spilled;
      // A device chunk is made again only once nothing may use it or the ranges
      // it is mapped in: rather than grow beyond the headroom, the pool waits for that.
      auto splittable = [&](Piece& p, bool wait) { return !p.spilled && !spared(p) && ranges_.droppable(p, wait); };
      // While a repeating step spares ranges, first a chunk mapped in no range
      // with chunks off the device: such a range, made again next step, maps
      // its host chunks again (on the H200 GCN, 44 GB of them in 0.8-0.9 s
      // with the GPU idle, for one device chunk made again: docs/results.md).
      auto cheap = [&](Piece& p) {
        return !sparing || std::none_of(p.ranges.begin(), p.ranges.end(), [](const Range* r) { return r->spilled(); });
      };
      if (split) piece = first(too_big, free.end(), [&](Piece& p) { return cheap(p) && splittable(p, false); });
      if (split && !piece) piece = first(too_big, free.end(), [&](Piece& p) { return splittable(p, false); });
      if (split && !piece) piece = first(too_big, free.end(), [&](Piece& p) { return splittable(p, true); });
      // A spilled chunk is never made again (unpinning and pinning host memory
      // again costs about 1 s per 3 GB): one too big serves whole rather than
      // a new one be pinned.
      if (!piece && spilled_too) {
        piece = first(too_big, free.end(), spilled_ready);
        split = false;
      }
      if (!piece) break;
      const std::size_t bytes = piece->memory.size();
      pieces_.choose(*piece);
      if (split) {
        ranges_.drop(*piece);
        Piece *part = nullptr, *rest = nullptr;
        if (pieces_.make(device, need, Pieces::Where::device, &part) != CUDA_SUCCESS) continue;  // the memory went elsewhere
        if (pieces_.make(device, bytes - part->memory.size(), Pieces::Where::device, &rest) == CUDA_SUCCESS) pieces_.set_free(*rest);
        piece = part;
      }
      *covered += piece->memory.size();
      on_device += !piece->spilled;
      parts->push_back(piece);
    }
  };
  fill();
  if (sparing && *covered < size) {
    sparing = false;
    fill();
  }
}

CUresult Stitcher::add_new(int device, std::size_t size, std::vector<Piece*>* parts, std::size_t* covered) {
  Piece* fresh = nullptr;
  CUresult status = pieces_.make(device, size - *covered, Pieces::Where::device, &fresh);
  if (status == CUDA_ERROR_OUT_OF_MEMORY) {
    // The device is full: every free the pool waits on completes, and all it
    // holds may serve, its own memory first.
    books_[device].full = true;
    books_.publish(device, GMEM_STAT_oom_releases, 1);
    reclaim_(device);
    take_free(device, size, 0, false, SIZE_MAX, Tier::device, parts, covered);
    status = *covered < size ? pieces_.make(device, size - *covered, Pieces::Where::device, &fresh) : CUDA_SUCCESS;
    if (status == CUDA_ERROR_OUT_OF_MEMORY) {
      take_free(device, size, 0, false, SIZE_MAX, Tier::any, parts, covered);
      status = *covered < size ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    }
  }
  // What the device cannot hold, peers and then the host may, a chunk per tier.
  while (status == CUDA_ERROR_OUT_OF_MEMORY && tiers_ && pieces_.make(device, size - *covered, Pieces::Where::spill, &fresh) == 0) {
    *covered += fresh->memory.size();
    parts->push_back(fresh);
    fresh = nullptr;
    if (*covered >= size) status = CUDA_SUCCESS;
  }
  if (status == CUDA_SUCCESS && fresh) {
    *covered += fresh->memory.size();
    parts->push_back(fresh);
  }
  return status;
}

std::size_t Stitcher::merge(std::vector<Piece*>* parts, std::size_t* covered) {
  std::sort(parts->begin(), parts->end(), [](Piece* a, Piece* b) { return a->memory.size() < b->memory.size(); });
  std::size_t on_device = device_parts(*parts);
  std::vector<Piece*> merged;
  for (auto it = parts->begin(); it != parts->end() && on_device + !merged.empty() > most_parts;) {
    if (!(*it)->spilled && ranges_.droppable(**it, false)) {
      merged.push_back(*it);
      it = parts->erase(it);
      --on_device;
    } else {
      ++it;
    }
  }
  if (merged.size() == 1) parts->push_back(merged[0]);
  if (merged.size() <= 1) return 0;
  std::size_t bytes = 0;
  for (Piece* p : merged) bytes += p->memory.size();
  for (Piece* p : merged) ranges_.drop(*p);
  *covered -= bytes;
  return bytes;
}

void Stitcher::add_off_device(int device, std::size_t size, StreamId stream, std::vector<Piece*>* parts,
                              std::size_t* covered) {
  take_free(device, size, stream, false, SIZE_MAX, Tier::spilled, parts, covered);
  Piece* fresh = nullptr;
  while (*covered < size && pieces_.make(device, size - *covered, Pieces::Where::off_device, &fresh) == CUDA_SUCCESS) {
    *covered += fresh->memory.size();
    parts->push_back(fresh);
  }
}

Range* Stitcher::remake(Range& old, std::size_t size, StreamId stream, std::vector<FreePieces::key_type> with) {
  const int device = old.device;
  std::vector<Piece*> parts, spilled;
  std::size_t covered = 0;
  for (Piece* p : old.pieces) {
    if (p->spilled) {
      spilled.push_back(p);
    } else {
      parts.push_back(p);
      covered += p->memory.size();
    }
  }
  // The device chunks it may take, the largest first, within the slack a
  // stitched range may have; then its own spilled chunks for the rest.
  FreePieces& free = pieces_.free(device);
  std::sort(with.begin(), with.end(), std::greater<>());
  const std::size_t slack = size / 32, had = covered;
  for (const FreePieces::key_type& key : with) {
    if (covered >= size || parts.size() >= most_parts) break;
    auto it = free.find(key);
    if (it != free.end() && covered + key.first <= size + slack && order_.ready(it->second->pending, stream)) {
      parts.push_back(it->second);
      covered += key.first;
    }
  }
  const std::size_t gained = covered - had;
  std::size_t kept = 0, remapped = 0;
  for (; kept < spilled.size() && covered < size; ++kept) {
    parts.push_back(spilled[kept]);
    covered += spilled[kept]->memory.size();
    remapped += spilled[kept]->memory.size();
  }
  // Mapping spilled memory again costs more than the device's memory gains
  // back where the gain is small: giving host memory access costs about 12
  // ms a GB with the GPU idle, several times that while kernels stream host
  // memory (docs/eviction.md), where each pass over a GB that moves to the
  // device saves about 20 ms of PCIe. The LM at 2.2x the H100 remade its
  // 13.4 GB range, 98% in host memory, every step for 0.5 GB of the device's
  // (its replay, docs/results.md). So a quarter of what is mapped again at
  // least.
  if (gained < remapped / 4) return nullptr;
  // A chunk in as many ranges as it may be would lose the least recently used
  // of them to the new one, which may be `old` itself (taken, not cached).
  const bool crowded = std::any_of(parts.begin(), parts.end(),
                                   [](const Piece* p) { return p->ranges.size() >= Ranges::max_ranges_per_piece; });
  Range* fresh = nullptr;
  if (kept == spilled.size() || crowded || ranges_.map(std::move(parts), device, &fresh) != CUDA_SUCCESS) {
    return nullptr;
  }
  const int64_t now = now_ns();
  for (std::size_t i = kept; i < spilled.size(); ++i) pieces_.set_free(*spilled[i], now);
  ranges_.cache(old);
  books_.publish(device, GMEM_STAT_stitches, 1);
  return fresh;
}

CUresult Stitcher::stitch(std::size_t size, int device, StreamId stream, std::size_t off_device, Range** out) {
  const bool grow = may_grow(books_[device], size);
  const std::size_t most = grow ? max_parts : most_parts;
  std::vector<Piece*> parts;
  std::size_t covered = 0;
  // While the pool may grow, new memory rather than more mappings; beyond,
  // as many free chunks as it takes.
  take_free(device, size - off_device, stream, grow, most, Tier::device, &parts, &covered);
  if (off_device) add_off_device(device, std::min(size, covered + off_device), stream, &parts, &covered);
  if (off_device && covered < size) take_free(device, size, stream, grow, most, Tier::device, &parts, &covered);
  // A full device has no new memory to give: spilled chunks the pool holds first.
  if (covered < size && device_full(device, size - covered)) {
    take_free(device, size, stream, false, most, Tier::any, &parts, &covered);
  }
  CUresult status = covered < size ? add_new(device, size, &parts, &covered) : CUDA_SUCCESS;
  if (status == CUDA_SUCCESS && device_parts(parts) > most_parts) {
    // What was released comes back as one new chunk, or, where the device
    // refuses it (once it spills its last memory stays the driver's:
    // device_reserve, which memory outside the pool may already hold), as
    // any new memory, down to the host.
    if (const std::size_t released = merge(&parts, &covered)) {
      status = add_new(device, covered + released, &parts, &covered);
    }
  }
  if (status == CUDA_SUCCESS && parts.size() > 1) books_.publish(device, GMEM_STAT_stitches, 1);
  if (status == CUDA_SUCCESS) status = ranges_.map(parts, device, out);
  if (status != CUDA_SUCCESS) {
    const int64_t now = now_ns();
    for (Piece* p : parts) pieces_.set_free(*p, now);
  }
  return status;
}

}  // namespace gmem::pool
