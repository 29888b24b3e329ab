#include "pool/trace_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <functional>

namespace gmem::pool {

namespace {

// The trace's limits (tests/bench/trace.h): ids below 2^24, streams below 256.
constexpr uint32_t max_stream = 255;

}  // namespace

std::unique_ptr<TraceRecorder> TraceRecorder::open(const std::string& pattern, std::string* error) {
  // %p: the process id, so that every process of a job writes its own.
  std::string path = pattern;
  for (std::size_t at = path.find("%p"); at != std::string::npos; at = path.find("%p", at)) {
    const std::string pid = std::to_string(getpid());
    path.replace(at, 2, pid);
    at += pid.size();
  }
  FILE* out = std::fopen(path.c_str(), "we");
  if (!out) {
    *error = path + ": " + std::strerror(errno);
    return nullptr;
  }
  char when[64] = "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  if (gmtime_r(&now, &utc)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &utc);
  std::fprintf(out,
               "# gmem allocation trace v1\n"
               "# recorded by gmem (GMEM_CONF trace:FILE), pid %d, %s\n"
               "# the fifth field of an allocation: its bytes placed off the device by use\n"
               "# u TIME_US tTHREAD [kFUNCTION] ID[+OFFSET]...: a launch referenced these large allocations (while the pool counts launches)\n"
               "# kFUNCTION NAME: the kernel's name, before its first u line\n"
               "# after u lines, `# ran: use N in US us, BYTES bytes on the host`: the GPU time of u line N's launch (from 0), timed where its large allocations lay partly in host memory\n",
               int(getpid()), when);
  std::fflush(out);
  return std::unique_ptr<TraceRecorder>(new TraceRecorder(out, getpid()));
}

TraceRecorder::~TraceRecorder() {
  std::fclose(out_);
}

uint32_t TraceRecorder::id_for(CUdeviceptr base, std::size_t size) {
  uint32_t id = next_id_;
  if (!free_ids_.empty()) {
    std::pop_heap(free_ids_.begin(), free_ids_.end(), std::greater<>());
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    ++next_id_;
  }
  ids_[base] = {id, size};
  return id;
}

uint32_t TraceRecorder::stream_number(StreamId stream) {
  // No stream and the legacy default stream are the trace's stream 0; others
  // are numbered as they first appear (the last number shared past 255).
  if (stream == 0 || stream == reinterpret_cast<StreamId>(CU_STREAM_LEGACY)) return 0;
  auto [it, fresh] = streams_.try_emplace(stream, 0);
  if (fresh) it->second = std::min<uint32_t>(uint32_t(streams_.size()), max_stream);
  return it->second;
}

void TraceRecorder::allocated(CUdeviceptr base, std::size_t size, StreamId stream, std::size_t off_device,
                              const Made* made) {
  std::lock_guard lock(mutex_);
  if (getpid() != pid_ || ids_.count(base)) return;
  const uint32_t id = id_for(base, size);
  const uint32_t number = stream_number(stream);
  std::fprintf(out_, "a %u %zu %u %zu\n", id, size, number, off_device);
  const char* drained = made && made->drained ? "; its stream ran out of work meanwhile" : "";
  if (made && made->range) {
    std::fprintf(out_, "# made: %llu mappings in %.1f ms, %zu bytes on the host%s",
                 static_cast<unsigned long long>(made->maps), double(made->map_ns) / 1e6, made->host, drained);
    const std::string missed = made->missed.text();
    std::fprintf(out_, "%s%s\n", missed.empty() ? "" : "; ", missed.c_str());
  }
  if (made && !made->range && made->host) {
    std::fprintf(out_, "# took: a cached range, %zu bytes on the host\n", made->host);
  }
  if (made && made->waits) {
    std::fprintf(out_, "# waited: %llu frees in %.1f ms%s\n", static_cast<unsigned long long>(made->waits),
                 double(made->wait_ns) / 1e6, drained);
  }
  if (size >= large_range) std::fprintf(out_, "# at %u 0x%llx\n", id, static_cast<unsigned long long>(base));
  std::fflush(out_);
}

void TraceRecorder::device_full(std::size_t device_bytes) {
  std::lock_guard lock(mutex_);
  if (getpid() != pid_ || device_full_) return;
  device_full_ = true;
  std::fprintf(out_, "# device full: the pool held %zu bytes of the device\n", device_bytes);
  std::fflush(out_);
}

void TraceRecorder::counting() {
  std::lock_guard lock(mutex_);
  if (getpid() != pid_ || counting_) return;
  counting_ = true;
  std::fprintf(out_, "# counting launches from the next allocation\n");
  std::fflush(out_);
}

bool TraceRecorder::device_full_said() {
  std::lock_guard lock(mutex_);
  return device_full_;
}

uint64_t TraceRecorder::used(const void* function, const std::vector<RangeReference>& references) {
  std::lock_guard lock(mutex_);
  if (getpid() != pid_) return LaunchClock::no_use;  // a forked child
  const long long us = (now_ns() - opened_ns_) / 1000;
  std::vector<std::pair<uint32_t, uint64_t>> traced;  // the allocations' ids and offsets it writes
  for (const RangeReference& reference : references) {
    auto it = ids_.find(reference.base);
    if (it != ids_.end() && reference.offset < it->second.size) traced.emplace_back(it->second.id, reference.offset);
  }
  if (traced.empty()) return LaunchClock::no_use;
  const uint32_t thread = threads_.try_emplace(std::this_thread::get_id(), uint32_t(threads_.size())).first->second;
  if (function) {
    const auto [it, first] = functions_.try_emplace(function, uint32_t(functions_.size()));
    if (first && name_) {
      if (const std::string name = name_(function); !name.empty()) std::fprintf(out_, "# k%u %s\n", it->second, name.c_str());
    }
    std::fprintf(out_, "u %lld t%u k%u", us, thread, it->second);
  } else {
    std::fprintf(out_, "u %lld t%u", us, thread);
  }
  for (const auto& [id, offset] : traced) {
    std::fprintf(out_, " %u", id);
    if (offset) std::fprintf(out_, "+%llu", static_cast<unsigned long long>(offset));
  }
  std::fputc('\n', out_);
  std::fflush(out_);
  return uses_++;
}

void TraceRecorder::ran(uint64_t use, double us, std::size_t host) {
  std::lock_guard lock(mutex_);
  if (getpid() != pid_) return;
  std::fprintf(out_, "# ran: use %llu in %.0f us, %zu bytes on the host\n", static_cast<unsigned long long>(use), us,
               host);
  std::fflush(out_);
}

void TraceRecorder::moved(const char* who, CUdeviceptr base, const std::string& what) {
  std::lock_guard lock(mutex_);
  if (getpid() != pid_) return;
  const long long us = (now_ns() - opened_ns_) / 1000;
  auto it = ids_.find(base);
  const std::string id = it == ids_.end() ? "-" : std::to_string(it->second.id);
  std::fprintf(out_, "# %s %lld %s %s\n", who, us, id.c_str(), what.c_str());
  std::fflush(out_);
}

void TraceRecorder::place(const std::string& what) {
  std::lock_guard lock(mutex_);
  if (getpid() != pid_) return;
  std::fprintf(out_, "# place %lld %s\n", static_cast<long long>((now_ns() - opened_ns_) / 1000), what.c_str());
  std::fflush(out_);
}

void TraceRecorder::freed(CUdeviceptr base) {
  std::lock_guard lock(mutex_);
  auto it = ids_.find(base);
  if (getpid() != pid_ || it == ids_.end()) return;
  std::fprintf(out_, "f %u\n", it->second.id);
  std::fflush(out_);
  free_ids_.push_back(it->second.id);
  std::push_heap(free_ids_.begin(), free_ids_.end(), std::greater<>());
  ids_.erase(it);
}

}  // namespace gmem::pool
