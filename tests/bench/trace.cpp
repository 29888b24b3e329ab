// Reading allocation traces: the format's rules (tests/traces/README.md) checked
// line by line, with the line named in every error.
#include "trace.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

namespace gmem::trace {

namespace {

constexpr const char* header = "# gmem allocation trace v1";
const std::string device_full = "# device full: the pool held ";
const std::string counting = "# counting launches from the next allocation";
const std::string ran = "# ran: use ";
const std::string mover = "# mover ";

// An unsigned decimal number below `limit`, and nothing else.
bool decimal(const std::string& word, std::uint64_t limit, std::uint64_t* out) {
  if (word.empty() || word.size() > 20) return false;
  std::uint64_t v = 0;
  for (char c : word) {
    if (c < '0' || c > '9') return false;
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  *out = v;
  return v < limit;
}

// One such field, and nothing after it but space.
bool field(std::istringstream& in, std::uint64_t limit, std::uint64_t* out) {
  std::string word;
  return in >> word && decimal(word, limit, out);
}

}  // namespace

std::optional<Trace> parse(std::istream& in, const std::string& where, std::string* error, double scale) {
  Trace t;
  std::vector<std::uint64_t> live_bytes;  // by id; 0: not live
  std::uint64_t live = 0;
  std::string line;
  long number = 0;
  auto fail = [&](const std::string& what) {
    *error = where + ":" + std::to_string(number) + ": " + what;
    return std::nullopt;
  };
  while (std::getline(in, line)) {
    ++number;
    if (number == 1) {
      if (line != header) return fail(std::string("expected '") + header + "', found '" + line.substr(0, 60) + "'");
      continue;
    }
    // gmem's own traces say once how much of the device the pool held when it filled.
    if (line.compare(0, device_full.size(), device_full) == 0) {
      std::istringstream said(line.substr(device_full.size()));
      if (!field(said, UINT64_C(1) << 48, &t.device_full)) {
        return fail("expected '" + device_full + "BYTES bytes of the device', found '" + line.substr(0, 80) + "'");
      }
      continue;
    }
    if (line == counting) t.counting_from = t.events.size();
    if (line.compare(0, ran.size(), ran) == 0) {
      std::istringstream said(line.substr(ran.size()));
      std::uint64_t use = 0, host = 0;
      std::string in_, us_, rest;
      double us = -1;
      if (!field(said, t.uses.size(), &use) || !(said >> in_ >> us >> us_) || in_ != "in" || us_ != "us," ||
          !(us >= 0) || !field(said, UINT64_MAX, &host) || !std::getline(said, rest) || rest != " bytes on the host") {
        return fail("expected '" + ran + "N in US us, BYTES bytes on the host' of an earlier use, found '" +
                    line.substr(0, 80) + "'");
      }
      t.uses[use].ran_us = us * scale;
      t.uses[use].ran_host = static_cast<std::uint64_t>(std::llround(double(host) * scale));
      continue;
    }
    if (line.compare(0, mover.size(), mover) == 0) {
      std::istringstream said(line.substr(mover.size()));
      std::uint64_t us = 0, id = 0;
      std::string moved, rest;
      if (!field(said, UINT64_MAX, &us) || !field(said, max_id, &id) || !(said >> moved) || moved != "moved" ||
          said >> rest) {
        return fail("expected '" + mover + "TIME_US ID moved', found '" + line.substr(0, 80) + "'");
      }
      if (id >= live_bytes.size() || !live_bytes[id]) return fail("move of id " + std::to_string(id) + ", which is not live");
      t.moves.push_back({t.events.size(), static_cast<std::uint32_t>(id)});
      continue;
    }
    std::istringstream fields(line);
    std::string op;
    if (!(fields >> op) || op[0] == '#') continue;
    Event e;
    std::uint64_t id = 0, bytes = 0, stream = 0;
    if (op == "u") {
      const std::string expected =
          "expected 'u TIME_US [tTHREAD [kFUNCTION]] ID[+OFFSET]...', found '" + line.substr(0, 60) + "'";
      std::uint64_t us = 0, n = 0;
      if (!field(fields, UINT64_MAX, &us)) return fail(expected);
      Trace::Use use;
      use.before = t.events.size();
      bool threaded = false;
      for (std::string word; fields >> word;) {
        if (use.ids.empty() && !threaded && word[0] == 't') {
          if (!decimal(word.substr(1), UINT32_MAX, &n)) return fail(expected);
          use.thread = static_cast<std::uint32_t>(n);
          threaded = true;
          continue;
        }
        if (use.ids.empty() && threaded && !use.function && word[0] == 'k') {
          if (!decimal(word.substr(1), UINT32_MAX - 1, &n)) return fail(expected);
          use.function = static_cast<std::uint32_t>(n + 1);
          continue;
        }
        const std::size_t plus = word.find('+');
        std::uint64_t offset = 0;
        if (!decimal(word.substr(0, plus), max_id, &id) ||
            (plus != std::string::npos && !decimal(word.substr(plus + 1), UINT64_MAX, &offset))) {
          return fail(expected);
        }
        if (id >= live_bytes.size() || !live_bytes[id]) return fail("use of id " + std::to_string(id) + ", which is not live");
        // Uses name large allocations only (64 MiB or more), which scale.
        if (scale != 1 && live_bytes[id] >= (1u << 20)) offset = static_cast<std::uint64_t>(std::llround(double(offset) * scale));
        if (offset >= live_bytes[id]) return fail("an offset past the end of id " + std::to_string(id));
        use.ids.push_back(static_cast<std::uint32_t>(id));
        use.offsets.push_back(offset);
      }
      if (use.ids.empty()) return fail(expected);
      t.uses.push_back(std::move(use));
      continue;
    }
    if (op == "a" && field(fields, max_id, &id) && field(fields, UINT64_C(1) << 48, &bytes) &&
        field(fields, max_stream, &stream)) {
      e = Event{true, static_cast<std::uint32_t>(id), bytes, static_cast<std::uint32_t>(stream)};
      // gmem's own traces (GMEM_CONF trace:FILE) add the bytes placed off the device.
      std::istringstream::pos_type at = fields.tellg();
      std::uint64_t off = 0;
      if (field(fields, bytes + 1, &off)) {
        e.off_device = off;
      } else {
        fields.clear();
        fields.seekg(at);
      }
    } else if (op == "f" && field(fields, max_id, &id)) {
      e = Event{false, static_cast<std::uint32_t>(id), 0, 0};
    } else {
      return fail(
          "expected 'a ID BYTES STREAM [OFF_DEVICE]' or 'f ID' (ID < 2^24, 0 < BYTES < 2^48, STREAM < 256, "
          "OFF_DEVICE <= BYTES), found '" +
          line.substr(0, 60) + "'");
    }
    std::string rest;
    if (fields >> rest) return fail("unexpected '" + rest.substr(0, 20) + "' after the event");
    if (e.alloc && e.bytes >= (1u << 20) && scale != 1) {
      e.bytes = std::max<std::uint64_t>(1, std::llround(double(e.bytes) * scale));
      e.off_device = std::min<std::uint64_t>(e.bytes, std::llround(double(e.off_device) * scale));
    }
    if (e.id >= live_bytes.size()) live_bytes.resize(e.id + 1, 0);
    if (e.alloc) {
      if (e.bytes == 0) return fail("allocation of 0 bytes");
      if (live_bytes[e.id]) return fail("allocation of id " + std::to_string(e.id) + ", which is live");
      live_bytes[e.id] = e.bytes;
      live += e.bytes;
      if (live > t.peak_requested) t.peak_requested = live;
      if (e.stream + 1 > t.streams) t.streams = e.stream + 1;
    } else {
      if (!live_bytes[e.id]) return fail("free of id " + std::to_string(e.id) + ", which is not live");
      live -= live_bytes[e.id];
      live_bytes[e.id] = 0;
    }
    t.events.push_back(e);
  }
  if (number == 0) return fail("empty: expected '" + std::string(header) + "'");
  t.ids = static_cast<std::uint32_t>(live_bytes.size());
  return t;
}

std::optional<Trace> load(const std::string& path, std::string* error, double scale) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    *error = path + ": compressed traces are read by tests/traces/gmem_trace.py only; gunzip it first";
    return std::nullopt;
  }
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot open";
    return std::nullopt;
  }
  return parse(in, path, error, scale);
}

std::string name_of(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  const std::string suffix = ".trace";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.resize(name.size() - suffix.size());
  }
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

}  // namespace gmem::trace
