// Launches and host placement of large allocations by size (pool/uses.h), on
// an access table fed launches by hand.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "pool/uses.h"

namespace gmem::pool {
namespace {

constexpr std::size_t mib = 1 << 20;
constexpr CUdeviceptr base = 0x7f0000000000ull;

// Serves `size` at `address` on device 0, which spills, at use `used`.
bool serve(Uses& uses, CUdeviceptr address, std::size_t size, std::size_t used = 0) {
  return uses.served(address, uses.request(0, size), used, true, 0);
}

void launch(AccessTable& table, CUdeviceptr address) {
  LaunchReferences refs(table);
  refs.word(address);
  refs.finish(nullptr);
}

TEST(Uses, CountsTheLaunchesOfEachLifeAndItsHostShareBySize) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 128 * mib, 0, 32 * mib, 0);
  launch(table, base);  // before it was served: not this allocation's
  serve(uses, base, 128 * mib);
  launch(table, base + 5 * mib);
  launch(table, base + 100 * mib);
  uses.freed(base, 128 * mib);
  // The same size again, in the same range, with one launch.
  serve(uses, base, 128 * mib);
  launch(table, base);
  uses.freed(base, 128 * mib);
  const Uses::Figures f = uses.of(128 * mib);
  EXPECT_EQ(f.allocations, 2u);
  EXPECT_EQ(f.launches, 3u);
  EXPECT_EQ(f.host_bytes, 64 * mib);
  EXPECT_EQ(uses.report(), "gmem: report use size=134217728 allocs=2 launches_per_alloc=1.5 passes_per_alloc=1.5 host_share=0.25\n");
}

// An allocation that lived while launches were not yet counted
// (AccessTable::counting) adds nothing to its size's figures; the next does.
TEST(Uses, ALifePartlyUncountedIsLeftOut) {
  AccessTable table(false);
  Uses uses(&table);
  table.add(base, 128 * mib, 0, 0, 0);
  serve(uses, base, 128 * mib);
  table.start_counting();
  launch(table, base);
  uses.freed(base, 128 * mib);
  EXPECT_EQ(uses.of(128 * mib), Uses::Figures{});
  serve(uses, base, 128 * mib);
  launch(table, base);
  launch(table, base + mib);
  uses.freed(base, 128 * mib);
  EXPECT_EQ(uses.of(128 * mib), (Uses::Figures{1, 2, 2, 0}));
}

// A timed launch's GPU time goes to the kinds of the followed allocations it
// referenced in host memory, by their bytes there (Pool::timed): none to one
// all on the device, nor to a range no request was served in.
TEST(Uses, ALaunchsGpuTimeIsChargedToTheKindsItReadInHostMemoryByTheirBytesThere) {
  AccessTable table;
  Uses uses(&table);
  const CUdeviceptr x = base, y = base + 128 * mib, z = base + 384 * mib, w = base + 512 * mib;
  table.add(x, 128 * mib, 0, 96 * mib, 0);
  table.add(y, 256 * mib, 0, 32 * mib, 0);
  table.add(z, 128 * mib, 0, 0, 0);
  table.add(w, 128 * mib, 0, 64 * mib, 0);  // not served: not followed
  serve(uses, x, 128 * mib);
  serve(uses, y, 256 * mib);
  serve(uses, z, 128 * mib);
  const std::vector<RangeReference> refs = {{x, 0, 96 * mib}, {y, 8, 32 * mib}, {z, 0, 0}, {w, 0, 64 * mib}};
  const std::vector<LaunchClock::Charge> charges = uses.charges(refs);
  ASSERT_EQ(charges.size(), 2u);
  EXPECT_EQ(charges[0].host, 96 * mib);
  EXPECT_EQ(charges[1].host, 32 * mib);
  uses.ran(charges, 400);
  uses.ran({}, 1000);  // charged to none
  for (const auto& [at, size] : {std::pair{x, 128 * mib}, {y, 256 * mib}, {z, 128 * mib}}) uses.freed(at, size);
  EXPECT_EQ(uses.of(128 * mib).ran_ns, 300'000u) << "x's three quarters; z none";
  EXPECT_EQ(uses.of(256 * mib).ran_ns, 100'000u);
}

// Against the fastest kind timed over host memory, a kind at least 1.5 times
// slower there per byte and pass counts that many more passes; kinds with
// less than an 8th of the most bytes there per allocation do not set the
// pace (their kernels may read less of them than they hold there).
TEST(Uses, AKindSlowOverHostMemoryCountsAsMorePasses) {
  AccessTable table;
  Uses uses(&table, true);
  const CUdeviceptr x = base, y = base + 1024 * mib, z = base + 2048 * mib;
  table.add(x, 1024 * mib, 0, 1024 * mib, 0);
  table.add(y, 1024 * mib, 0, 1024 * mib, 0);
  table.add(z, 64 * mib, 0, 64 * mib, 0);
  for (CUdeviceptr at : {x, y, z}) serve(uses, at, at == z ? 64 * mib : 1024 * mib);
  uses.peak(0, 0);
  for (CUdeviceptr at : {x, y, z}) launch(table, at);  // a pass each
  uses.ran(uses.charges({{x, 0, 1024 * mib}}), 1024);  // 1 us a MiB
  uses.ran(uses.charges({{y, 0, 1024 * mib}}), 2048);  // twice as long
  uses.ran(uses.charges({{z, 0, 64 * mib}}), 16);      // a quarter as long, but small
  for (CUdeviceptr at : {x, y, z}) uses.freed(at, at == z ? 64 * mib : 1024 * mib);
  const std::string report = uses.report();
  EXPECT_NE(report.find("size=1073741824 at_peak=1 allocs=1 passes_per_alloc=1.0 off_device=0.00 host_share=1.00 "
                        "host_ms_per_gb_pass=1.0 cost=1.0\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("host_ms_per_gb_pass=1.9 cost=2.0\n"), std::string::npos) << report;  // per 10^9 bytes
  EXPECT_NE(report.find("size=67108864 at_peak=1 allocs=1 passes_per_alloc=1.0 off_device=0.00 host_share=1.00 "
                        "host_ms_per_gb_pass=0.2 cost=1.0\n"),
            std::string::npos)
      << report;
}

TEST(Uses, SmallAllocationsAndAddressesInsideARangeAreNotFollowed) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 128 * mib, 0, 0, 0);
  serve(uses, base + 64 * mib, 64 * mib);  // not where a range starts
  uses.freed(base + 64 * mib, 64 * mib);
  serve(uses, base, 32 * mib);  // below Uses::min_size
  uses.freed(base, 32 * mib);
  EXPECT_EQ(uses.of(64 * mib), Uses::Figures{});
  EXPECT_EQ(uses.of(32 * mib), Uses::Figures{});
  EXPECT_EQ(uses.report(), "");
  Uses untracked(nullptr);  // track_access:0
  serve(untracked, base, 128 * mib);
  untracked.freed(base, 128 * mib);
  EXPECT_EQ(untracked.of(128 * mib), Uses::Figures{});
}

TEST(Uses, TheReportListsTheSizesWithTheMostHostBytesFirst) {
  AccessTable table;
  Uses uses(&table);
  table.add(base, 64 * mib, 0, 0, 0);
  table.add(base + 64 * mib, 256 * mib, 0, 128 * mib, 0);
  serve(uses, base, 64 * mib);
  uses.freed(base, 64 * mib);
  serve(uses, base + 64 * mib, 256 * mib);
  uses.freed(base + 64 * mib, 256 * mib);
  EXPECT_EQ(uses.report(1), "gmem: report use size=268435456 allocs=1 launches_per_alloc=0.0 passes_per_alloc=0.0 host_share=0.50\n");
}

// A job whose shapes vary makes new kinds all the time: those long unused go.
TEST(Uses, KindsLongUnusedAreForgotten) {
  AccessTable table;
  Uses uses(&table, true);
  table.add(base, 128 * mib, 0, 0, 0);
  serve(uses, base, 128 * mib);
  uses.freed(base, 128 * mib);
  EXPECT_EQ(uses.of(128 * mib).allocations, 1u);
  const std::size_t granule = 2 * mib;
  for (std::size_t i = 1; i <= 2 * Uses::max_kinds; ++i) uses.request(0, 256 * mib + i * granule);
  EXPECT_EQ(uses.of(128 * mib).allocations, 0u);
}

// A job on device 0 (which spills), one step at a time: A (128 MiB, one
// launch) and B (192 MiB, five launches) are alive at the peak; T (256 MiB,
// one launch) is a temporary made after B is freed. B's range lies in host
// memory (a peer's, with `peer`). At each peak the device had `room` bytes
// left. Each step asks the driver for 3 maps and 2 ranges (misses) in 7 ms of
// its calls, 6 ms of them mapping, 5 ms in one range counted slow, and 2 ms
// (pinned_ns) making chunks in host memory.
class Job {
 public:
  explicit Job(bool place, std::size_t room, bool peer = false) : uses_(&table_, place), room_(room) {
    table_.add(a, 128 * mib, 0, 0, 0);
    table_.add(b, 192 * mib, 0, peer ? 0 : 192 * mib, peer ? 192 * mib : 0);
    table_.add(t, 256 * mib, 0, 0, 0);
  }
  // One step lasting `step_ns`: the bytes of A, B and T requested off the device.
  std::vector<std::size_t> step(int64_t step_ns = 100'000'000) {
    std::vector<std::size_t> off;
    auto serve_at = [&](CUdeviceptr at, std::size_t size, std::size_t used) {
      const Uses::Request r = uses_.request(0, size);
      off.push_back(r.off_device);
      ends.push_back(uses_.ends_step(at, r, used, true));
      EXPECT_FALSE(uses_.ends_step(at, r, used, false)) << "not spilling";
      if (uses_.served(at, r, used, true, now_, work_)) uses_.peak(0, room_);
    };
    serve_at(a, 128 * mib, 128 * mib);
    launch(table_, a);
    serve_at(b, 192 * mib, 320 * mib);
    for (int i = 0; i < 5; ++i) launch(table_, b);
    uses_.freed(b, 192 * mib);
    serve_at(t, 256 * mib, 384 * mib - 128 * mib - 64 * mib);
    launch(table_, t);
    uses_.freed(t, 256 * mib);
    uses_.freed(a, 128 * mib);
    now_ += step_ns;
    work_.maps += 3;
    work_.misses += 2;
    work_.driver_ns += 7'000'000;
    work_.map_ns += 6'000'000;
    work_.slow_maps += 1;
    work_.slow_map_ns += 5'000'000;
    work_.spill_ns += pinned_ns;
    return off;
  }
  Uses& uses() { return uses_; }
  std::vector<bool> ends;  // each request's ends_step, before it was served
  int64_t pinned_ns = 2'000'000;  // of each step, making chunks in host memory

 private:
  static constexpr CUdeviceptr a = base, b = base + 128 * mib, t = base + 320 * mib;
  AccessTable table_;
  Uses uses_;
  const std::size_t room_;
  int64_t now_ = 0;
  Work work_;
};

using Off = std::vector<std::size_t>;
constexpr int ordered_steps = 4;  // the first, then three to time (the first of them starts the clock)

TEST(Uses, WhatTheDeviceLackedAtThePeakGoesToTheKindsAliveThenWithTheFewestPasses) {
  // The device lacked B's 192 MiB less 64 MiB of room. Until the steps have
  // been timed, everything goes in the order requested.
  Job job(true, 64 * mib);
  for (int i = 0; i < ordered_steps; ++i) EXPECT_EQ(job.step(), (Off{0, 0, 0})) << "step " << i;
  // Then A, the least used, goes off the device whole; B (hot) and T (not
  // alive at the peak) stay on it.
  EXPECT_EQ(job.step(), (Off{128 * mib, 0, 0}));
  // With no room the device lacked all of B's 192 MiB: A goes whole, and B,
  // passed over more than the average byte at the peak, stays on the device
  // (what a spill in the order requested would hit is no colder).
  Job no_room(true, 0);
  for (int i = 0; i < ordered_steps; ++i) no_room.step();
  EXPECT_EQ(no_room.step(), (Off{128 * mib, 0, 0}));
  // With more room the device lacked less: half of A.
  Job more_room(true, 128 * mib);
  for (int i = 0; i < ordered_steps; ++i) more_room.step();
  EXPECT_EQ(more_room.step(), (Off{64 * mib, 0, 0}));
  // Where the rest of A is at most an 8th of what the device lacked (8 of
  // 120 MiB), A goes whole: a range partly on the device is made again each
  // step, host chunks and all.
  Job little_more_room(true, 72 * mib);
  for (int i = 0; i < ordered_steps; ++i) little_more_room.step();
  EXPECT_EQ(little_more_room.step(), (Off{128 * mib, 0, 0}));
  // Without place_by_use, every request wants the device first.
  Job figures_only(false, 64 * mib);
  for (int i = 0; i < ordered_steps; ++i) figures_only.step();
  EXPECT_EQ(figures_only.step(), (Off{0, 0, 0}));
}

// A job on device 0 (which spills) with a kind of several allocations alive
// at once. Each step's forward pass asks for Z (1024 MiB, two launches), then
// four layers of two hot 128 MiB allocations (five launches each) and an X
// (64 MiB, one launch). Its backward pass frees Z, then for each layer, last
// first, asks for the same three sizes (the X of the same kind as the
// forward's) while the layer's are alive, and frees both. X and Z lie in
// host memory; at each peak the device had `room` bytes left.
class Layers {
 public:
  explicit Layers(std::size_t room) : uses_(&table_, true), room_(room) {
    table_.add(z, 1024 * mib, 0, 1024 * mib, 0);
    for (int i = 0; i <= 4; ++i) {
      table_.add(slot(i), 128 * mib, 0, 0, 0);
      table_.add(slot(i) + 128 * mib, 128 * mib, 0, 0, 0);
      table_.add(slot(i) + 256 * mib, 64 * mib, 0, 64 * mib, 0);
    }
  }
  // One step: the MiB of each request placed off the device, in order.
  std::vector<std::size_t> step() {
    std::vector<std::size_t> off;
    std::size_t used = 0;
    auto serve_at = [&](CUdeviceptr at, std::size_t size, int launches) {
      const Uses::Request r = uses_.request(0, size);
      off.push_back(r.off_device / mib);
      used += size;
      if (uses_.served(at, r, used, true, now_)) uses_.peak(0, room_);
      for (int n = 0; n < launches; ++n) launch(table_, at);
    };
    auto layer = [&](int i) {
      serve_at(slot(i), 128 * mib, 5);
      serve_at(slot(i) + 128 * mib, 128 * mib, 5);
      serve_at(slot(i) + 256 * mib, 64 * mib, 1);
    };
    auto free_layer = [&](int i) {
      uses_.freed(slot(i), 128 * mib);
      uses_.freed(slot(i) + 128 * mib, 128 * mib);
      uses_.freed(slot(i) + 256 * mib, 64 * mib);
      used -= 320 * mib;
    };
    serve_at(z, 1024 * mib, 2);
    for (int i = 0; i < 4; ++i) layer(i);
    uses_.freed(z, 1024 * mib);
    used -= 1024 * mib;
    for (int i = 3; i >= 0; --i) {
      layer(4);  // the backward's, at a place of its own
      free_layer(i);
      free_layer(4);
    }
    now_ += 100'000'000;
    return off;
  }

 private:
  static constexpr CUdeviceptr z = base;
  static CUdeviceptr slot(int i) { return base + 1024 * mib + CUdeviceptr(i) * 384 * mib; }
  AccessTable table_;
  Uses uses_;
  const std::size_t room_;
  int64_t now_ = 0;
};

TEST(Uses, OfAKindSeveralAliveAtOnceTheFirstGoOffTheDeviceWholeAndNoMoreThanLacked) {
  // A step's bytes off the device: Z's, each forward layer's X's, then the
  // backward's requests, none placed off the device.
  auto step_off = [](std::vector<std::size_t> x, std::size_t z = 0) {
    Off off{z};
    for (std::size_t mib_off : x) off.insert(off.end(), {0, 0, mib_off});
    off.resize(off.size() + 12, 0);
    return off;
  };
  // The device lacked 160 MiB: of the four X (the coldest), the first two
  // requested go whole, and half of the third; of the backward's X (of the
  // same kind, asked for while some of the forward's are alive), none.
  Layers some(1120 * mib);
  for (int i = 0; i < ordered_steps; ++i) some.step();
  EXPECT_EQ(some.step(), step_off({64, 64, 32, 0}));
  // It lacked 184 MiB: the third goes whole (its rest, 8 MiB, is at most an
  // 8th of what was lacked).
  Layers more(1096 * mib);
  for (int i = 0; i < ordered_steps; ++i) more.step();
  EXPECT_EQ(more.step(), step_off({64, 64, 64, 0}));
  // It lacked 1152 MiB: the four X (256) and Z whole (its rest, 128 MiB, is
  // at most an 8th of what was lacked) would leave 128 MiB of the device
  // idle at the peak; one X stays on it, leaving 64 MiB (a 32nd of the lack,
  // 36 MiB, is kept spare: a second X stays off).
  Layers most(128 * mib);
  for (int i = 0; i < ordered_steps; ++i) most.step();
  EXPECT_EQ(most.step(), step_off({64, 64, 64, 0}, 1024));
}

TEST(Uses, TheReportSaysWhatTheLastStepAskedOfTheDriver) {
  Job job(true, 64 * mib);
  for (int i = 0; i < 4; ++i) job.step(i == 2 ? 80'000'000 : 100'000'000);  // the third peak to the fourth: 80 ms
  EXPECT_NE(job.uses().report().find(" last_step_ms=80.0 last_step_driver_ms=7.0 last_step_maps=3 "
                                     "last_step_misses=2 last_step_map_ms=6.0 last_step_slow_maps=1 "
                                     "last_step_slow_map_ms=5.0 last_step_pinned_ms=2.0 remembered=0\n"),
            std::string::npos)
      << job.uses().report();
}

TEST(Uses, NothingGoesOffTheDeviceWhileItHadRoomAtThePeak) {
  Job job(true, 192 * mib);
  for (int i = 0; i < ordered_steps; ++i) job.step();
  EXPECT_EQ(job.step(), (Off{0, 0, 0}));
}

// Where a peer holds part of the peak, nothing is planned: the order requested
// stays, and the report says why.
TEST(Uses, NothingIsPlannedWhileAPeerHoldsPartOfThePeak) {
  Job job(true, 64 * mib, true);
  for (int i = 0; i < ordered_steps + 4; ++i) EXPECT_EQ(job.step(), (Off{0, 0, 0})) << "step " << i;
  EXPECT_NE(job.uses().report().find(" trial=peer "), std::string::npos) << job.uses().report();
}

// The plan stays if its step is at least 5% shorter than the shortest in the
// order requested; else the order comes back.
TEST(Uses, ThePlanIsKeptOnlyIfItsStepsAreShorter) {
  // The mean of two steps with the plan (a step timed from peak to peak is
  // short or long as the peak moves within it): 84 and 104 ms are 94, 5%
  // shorter than 100; 86 and 106 are 96, not.
  for (const auto& [planned_ns, kept] : {std::pair<int64_t, bool>{94'000'000, true}, {96'000'000, false}}) {
    Job job(true, 64 * mib);
    for (int i = 0; i < ordered_steps; ++i) {
      job.step(i == 2 ? 100'000'000 : 150'000'000);  // shortest: 100 ms
      EXPECT_EQ(job.uses().plans(0), i == ordered_steps - 1) << "step " << i;
    }
    // A step's time runs from its peak to the next one's: the first step with
    // the plan settles it, the times from its peak to the third's are timed,
    // and the trial ends at the third's peak (after its requests were placed).
    EXPECT_EQ(job.step(planned_ns - 10'000'000), (Off{128 * mib, 0, 0}));
    EXPECT_EQ(job.step(planned_ns + 10'000'000), (Off{128 * mib, 0, 0}));
    EXPECT_TRUE(job.uses().plans(0));
    EXPECT_EQ(job.step(), (Off{128 * mib, 0, 0}));
    EXPECT_EQ(job.uses().plans(0), kept);
    const Off after = kept ? Off{128 * mib, 0, 0} : Off{0, 0, 0};
    for (int i = 0; i < 3; ++i) EXPECT_EQ(job.step(), after) << planned_ns << " ns, step " << i;
    EXPECT_FALSE(job.uses().plans(1)) << "a device never seen";
    EXPECT_NE(job.uses().report().find(kept ? "trial=kept ordered_step_ms=100.0" : "trial=dropped ordered_step_ms=100.0"),
              std::string::npos) << job.uses().report();
  }
}

// A step of a trial that spent a 20th of its time or more making chunks in
// host memory settles it too (its layout's chunks are pinned once), up to
// three in all; the two after them are timed.
TEST(Uses, StepsThatPinHostMemorySettleTheTrial) {
  for (const int pinning : {0, 1, 2, 3}) {
    Job job(true, 64 * mib);
    for (int i = 0; i < ordered_steps; ++i) job.step(i == 2 ? 100'000'000 : 150'000'000);  // shortest: 100 ms
    ASSERT_TRUE(job.uses().plans(0));
    // The plan's steps after the first: `pinning` of 140 ms pinning for 7 ms
    // (a 20th), then 90 ms ones. Up to two of them settle the trial with the
    // first, and two of 90 ms are timed (kept: 5% shorter than 100); a third
    // is timed with the next (115 ms: dropped).
    for (int i = 0; i < 6; ++i) {
      job.pinned_ns = i < pinning ? 7'000'000 : 2'000'000;
      job.step(i < pinning ? 140'000'000 : 90'000'000);
    }
    const bool kept = pinning < 3;
    EXPECT_EQ(job.uses().plans(0), kept) << pinning << " steps pinning";
    EXPECT_NE(job.uses().report().find(kept ? "planned_step_ms=90.0" : "planned_step_ms=115.0"), std::string::npos)
        << pinning << " steps pinning: " << job.uses().report();
  }
}

// A job on device 0 (which spills) whose device is full before its peak:
// each step asks for X (512 MiB, one launch), then Y (512 MiB, eight
// launches, in host memory) while X is alive, frees both, then asks for P
// (512 MiB, one launch) and Q (768 MiB, four launches, in host memory),
// alive at the peak and freed early in the next step. At the peak the device
// holds P and has no room: 512 MiB for large allocations.
class Pressure {
 public:
  explicit Pressure(bool pack) : uses_(&table_, true) {
    if (pack) uses_.pack_steps();
    table_.add(x, 512 * mib, 0, 0, 0);
    table_.add(y, 512 * mib, 0, 512 * mib, 0);
    table_.add(p, 512 * mib, 0, 0, 0);
    table_.add(q, 768 * mib, 0, 768 * mib, 0);
  }
  // One step: the bytes of X, Y, P and Q requested off the device.
  Off step() {
    Off off;
    auto serve_at = [&](CUdeviceptr at, std::size_t size, std::size_t used, int launches) {
      const Uses::Request r = uses_.request(0, size);
      off.push_back(r.off_device);
      if (uses_.served(at, r, used, true, now_)) uses_.peak(0, 0);
      for (int i = 0; i < launches; ++i) launch(table_, at);
    };
    if (now_) {
      uses_.freed(p, 512 * mib);
      uses_.freed(q, 768 * mib);
    }
    serve_at(x, 512 * mib, 512 * mib, 1);
    serve_at(y, 512 * mib, 1024 * mib, 8);
    uses_.freed(x, 512 * mib);
    uses_.freed(y, 512 * mib);
    serve_at(p, 512 * mib, 512 * mib, 1);
    serve_at(q, 768 * mib, 1280 * mib, 4);
    now_ += 100'000'000;
    return off;
  }

 private:
  static constexpr CUdeviceptr x = base, y = base + 512 * mib, p = base + 1024 * mib, q = base + 1536 * mib;
  AccessTable table_;
  Uses uses_;
  int64_t now_ = 0;
};

// The plan at the peak places P (the coldest alive then) off the device, and
// X and Y go as requested: X holds the device and Y, the hottest, lies in
// host memory. Packing the step (pack_step) places X off the device, where
// it would keep Y from the device, and keeps Y on it; then Q (the next
// hottest) takes the device's 512 MiB through its life, and P goes off.
TEST(Uses, PackingTheStepPlacesOffTheDeviceWhatKeepsAHotterRequestFromIt) {
  for (const bool pack : {false, true}) {
    Pressure job(pack);
    for (int i = 0; i < ordered_steps; ++i) EXPECT_EQ(job.step(), (Off{0, 0, 0, 0})) << "step " << i;
    const Off planned = pack ? Off{512 * mib, 0, 512 * mib, 256 * mib} : Off{0, 0, 512 * mib, 0};
    for (int i = 0; i < 3; ++i) EXPECT_EQ(job.step(), planned) << (pack ? "packed" : "at the peak") << ", step " << i;
  }
}

// Bringing in (bring_in) is tried once the plan's trial has dropped the plan,
// against the shortest step in the order requested, and stays only if the
// mean of its second and third steps is shorter; a step with it after the
// first (which pays for the switch) twice as long as that one drops it at
// once. Where the plan was kept, it is never
// tried.
TEST(Uses, BringingInIsTriedAfterADroppedPlanAndKeptOnlyIfItsStepsAreShorter) {
  // 89 and 109 ms are 99, shorter than 100; 90 and 110 are 100, not.
  for (const auto& [brought_ns, kept] : {std::pair<int64_t, bool>{99'000'000, true}, {100'000'000, false}}) {
    Job job(true, 64 * mib);
    job.uses().try_bring_in();
    std::vector<int> switched;  // the devices where the trial began or dropped it
    job.uses().tell_switches([&](int device) { switched.push_back(device); });
    for (int i = 0; i < ordered_steps; ++i) {
      job.step(i == 2 ? 100'000'000 : 150'000'000);
      EXPECT_FALSE(job.uses().brings_in(0)) << "step " << i;
      EXPECT_FALSE(job.uses().bringing_in()) << "step " << i;
    }
    job.step(96'000'000);  // the plan's, dropped: 96 ms against 100
    job.step(96'000'000);
    EXPECT_FALSE(job.uses().brings_in(0));
    EXPECT_TRUE(switched.empty());
    job.step();  // its trial ends at this step's peak, and bringing in begins
    EXPECT_TRUE(job.uses().brings_in(0));
    EXPECT_TRUE(job.uses().bringing_in());
    EXPECT_EQ(switched, std::vector<int>{0});
    job.step(brought_ns - 10'000'000);  // the second and third steps that bring in, timed at the next peaks
    job.step(brought_ns + 10'000'000);
    EXPECT_TRUE(job.uses().brings_in(0));
    job.step();
    EXPECT_EQ(job.uses().brings_in(0), kept) << brought_ns << " ns";
    EXPECT_EQ(job.uses().bringing_in(), kept) << "launches stop looking once it is dropped";
    EXPECT_EQ(switched, std::vector<int>(kept ? 1 : 2, 0)) << "told again only where dropped";
    const std::string said = std::string("trial=dropped ordered_step_ms=100.0 planned_step_ms=96.0 bring_in=") +
                             (kept ? "kept" : "dropped") + " bring_in_step_ms=" + (kept ? "99.0" : "100.0");
    EXPECT_NE(job.uses().report().find(said), std::string::npos) << job.uses().report();
  }
  // A step with it after the first that lasts more than twice the shortest
  // in the order requested (210 ms against 100) drops it at once, at the next
  // request: no third step is waited for. The first, as long, does not.
  Job slow(true, 64 * mib);
  slow.uses().try_bring_in();
  for (int i = 0; i < ordered_steps; ++i) slow.step(i == 2 ? 100'000'000 : 150'000'000);
  slow.step(96'000'000);
  slow.step(96'000'000);
  slow.step(210'000'000);  // bringing in begins at this step's peak
  EXPECT_TRUE(slow.uses().brings_in(0));
  slow.step(210'000'000);
  EXPECT_TRUE(slow.uses().brings_in(0)) << "the first step with it, switching, settles it";
  slow.step();
  EXPECT_FALSE(slow.uses().brings_in(0));
  EXPECT_FALSE(slow.uses().bringing_in());
  EXPECT_NE(slow.uses().report().find(" bring_in=dropped bring_in_step_ms=210.0 "), std::string::npos)
      << slow.uses().report();
  // Nor does a later step that settles it, pinning a 20th of its time or
  // more (its layout's chunks are pinned once): the two after it are timed.
  Job pinning(true, 64 * mib);
  pinning.uses().try_bring_in();
  for (int i = 0; i < ordered_steps; ++i) pinning.step(i == 2 ? 100'000'000 : 150'000'000);
  pinning.step(96'000'000);
  pinning.step(96'000'000);
  pinning.step();  // bringing in begins at this step's peak
  pinning.pinned_ns = 11'000'000;
  pinning.step(210'000'000);
  pinning.step(210'000'000);
  pinning.pinned_ns = 2'000'000;
  pinning.step(90'000'000);
  EXPECT_TRUE(pinning.uses().brings_in(0)) << "a step that pins settles the trial: " << pinning.uses().report();
  pinning.step(90'000'000);
  pinning.step();
  EXPECT_TRUE(pinning.uses().brings_in(0)) << pinning.uses().report();
  EXPECT_NE(pinning.uses().report().find(" bring_in=kept bring_in_step_ms=90.0 "), std::string::npos)
      << pinning.uses().report();
  // A kept plan (94 ms against 100) has chosen what lies on the device:
  // bringing in is not tried.
  Job planned(true, 64 * mib);
  planned.uses().try_bring_in();
  for (int i = 0; i < ordered_steps; ++i) planned.step(i == 2 ? 100'000'000 : 150'000'000);
  planned.step(94'000'000);
  planned.step(94'000'000);
  for (int i = 0; i < 4; ++i) {
    planned.step();
    EXPECT_TRUE(planned.uses().plans(0)) << "step " << i;
    EXPECT_FALSE(planned.uses().brings_in(0)) << "step " << i;
    EXPECT_FALSE(planned.uses().bringing_in()) << "step " << i;
  }
  EXPECT_NE(planned.uses().report().find("trial=kept ordered_step_ms=100.0 planned_step_ms=94.0 bring_in=untried "),
            std::string::npos)
      << planned.uses().report();
  Job off(true, 64 * mib);
  for (int i = 0; i < ordered_steps + 4; ++i) off.step();
  EXPECT_FALSE(off.uses().brings_in(0));
  EXPECT_FALSE(off.uses().bringing_in());
  EXPECT_NE(off.uses().report().find(" bring_in=off "), std::string::npos) << off.uses().report();
}

// Trials that time steps at once each keep their own: bringing in's trial,
// begun at a dropped plan's verdict, and the two steps eviction's trial
// times first (from that verdict's step, one step ahead of it).
TEST(Uses, TrialsTimingTheSameStepsEachKeepTheirOwn) {
  Job job(true, 64 * mib);
  job.uses().try_bring_in();
  job.uses().set_evict(Evict::tried);
  for (int i = 0; i < ordered_steps; ++i) job.step(i == 2 ? 100'000'000 : 150'000'000);
  job.step(96'000'000);  // the plan's, dropped: 96 ms against 100
  job.step(96'000'000);
  for (int64_t ms : {140, 100, 80, 60}) job.step(ms * 1'000'000);
  job.step();
  // Eviction's placed steps: 140 and 100 ms; bringing in's: 100 and 80 (its
  // first, 140, settles it).
  EXPECT_NE(job.uses().report().find(" bring_in=kept bring_in_step_ms=90.0 evict=trying placed_step_ms=120.0 "),
            std::string::npos)
      << job.uses().report();
}

// plan_file: a run's verdicts and the figures of its kinds, taken back by a
// new run of the same job before its first request, place it as the trial
// left the last run, with no trial: by use where the plan was kept, in the
// order requested where it was dropped. A kind is known by the sizes of the
// two large requests before it, so the first step's first requests (A, then
// B) are kinds of their own; and the kinds planned are those alive at the
// last peak, here the first step's: the steps' own A goes off the device from
// the third step (a new job's from its fifth, after the trial's four).
TEST(Uses, AJobRunAgainPlacesAsItsLastRunsTrialLeftItWithNoTrial) {
  for (const auto& [planned_ns, kept] : {std::pair<int64_t, bool>{94'000'000, true}, {96'000'000, false}}) {
    Job last(true, 64 * mib);
    last.uses().try_bring_in();
    for (int i = 0; i < ordered_steps; ++i) last.step(i == 2 ? 100'000'000 : 150'000'000);
    for (int i = 0; i < 3; ++i) last.step(planned_ns);
    ASSERT_EQ(last.uses().plans(0), kept);
    const std::string text = last.uses().remembered();
    EXPECT_NE(text.find(kept ? "device 0 kept untried untried " : "device 0 dropped untried untried "),
              std::string::npos)
        << text;

    Job again(true, 64 * mib);
    again.uses().try_bring_in();
    ASSERT_TRUE(again.uses().remember(text)) << text;
    EXPECT_EQ(again.uses().plans(0), kept);
    const Off placed = kept ? Off{128 * mib, 0, 0} : Off{0, 0, 0};
    for (int i = 0; i < 2; ++i) EXPECT_EQ(again.step(), (Off{0, 0, 0})) << planned_ns << " ns, step " << i;
    for (int i = 2; i < 5; ++i) EXPECT_EQ(again.step(), placed) << planned_ns << " ns, step " << i;
    const std::string report = again.uses().report();
    EXPECT_NE(report.find(kept ? "trial=kept ordered_step_ms=100.0" : "trial=dropped ordered_step_ms=100.0"),
              std::string::npos) << report;
    EXPECT_NE(report.find(" remembered=1"), std::string::npos) << report;
    // A dropped plan's run goes on to bringing in's trial at its first timed step.
    EXPECT_NE(report.find(kept ? " bring_in=untried " : " bring_in=trying "), std::string::npos) << report;
    // The new run's figures join the old ones.
    const std::string next = again.uses().remembered();
    EXPECT_NE(next, text);
    EXPECT_EQ(next.substr(0, next.find("\nkind ")), text.substr(0, text.find("\nkind "))) << next;
  }
}

// What has no verdict is not written, and a text that is not a plan is not
// taken: the job then starts on trial, as without one.
TEST(Uses, APlanWithoutAVerdictOrNotAPlanLeavesTheTrialToRun) {
  Job early(true, 64 * mib);
  for (int i = 0; i < ordered_steps; ++i) early.step();
  EXPECT_EQ(early.uses().remembered(), "");
  const std::string bad[] = {"", "gmem plan v4\n",
                             // Older versions' (v1: no GPU time over host memory per kind; v2: no eviction).
                             "gmem plan v1\ndevice 0 kept untried 1 2 3 4\n",
                             "gmem plan v2\ndevice 0 kept untried 1 2 3 4\n",
                             "gmem plan v3\ndevice 0 kept untried untried 1 2 3 4 5\n",
                             "gmem plan v3\ndevice 0 planned untried untried 1 2 3 4 5 6\n",
                             // A trial under way is never written: it runs again.
                             "gmem plan v3\ndevice 0 kept untried trying 1 2 3 4 5 6\n",
                             "gmem plan v3\ndevice 0 kept untried kept 1 2 3 4 5 6\nkind 5 1 128 1 1 1 0 0 0\n",
                             "gmem plan v3\ndevice 0 kept untried kept 1 2 3 4 5 6\nkind 5 0 128 1 1 1 0 0 2 1 0\n",
                             "gmem plan v3\ndevice 0 kept untried untried 1 2 3 4 5 6\nwhat\n",
                             // More numbers at the peak than kinds are kept: refused before they are read.
                             "gmem plan v3\ndevice 0 kept untried untried 1 2 3 4 5 6\n"
                             "kind 5 0 128 1 1 1 0 0 99999999999 0\n"};
  for (const std::string& text : bad) {
    Job job(true, 64 * mib);
    EXPECT_FALSE(job.uses().remember(text)) << text;
    EXPECT_FALSE(job.uses().plans(0)) << text;
    for (int i = 0; i < ordered_steps; ++i) EXPECT_EQ(job.step(), (Off{0, 0, 0})) << text << " step " << i;
    EXPECT_TRUE(job.uses().plans(0)) << "the trial runs: " << text;
  }
  Job figures_only(false, 64 * mib);
  EXPECT_FALSE(figures_only.uses().remember("gmem plan v3\ndevice 0 kept untried untried 1 2 3 4 5 6\n"));
}

// Eviction (evict:tried) is tried once the plan's trial has ended: two steps
// placed as its verdict says are timed, then the evictor begins; its first
// step settles it (no request is placed off the device by the plan while it
// is tried), and the mean of the next two is judged against the mean of the
// two before it. It stays only if at least 5% shorter; a step with it twice
// as long drops it at once. Means of two steps: a step timed from peak to
// peak is short or long as the peak moves within it.
TEST(Uses, EvictionIsTriedAfterThePlansTrialAndKeptOnlyIfItsStepsAreShorter) {
  // Against the mean of the two steps after the plan's verdict (140 and 100
  // ms: 120), not the plan's trial step (94 ms): a mean of 114 ms is 5%
  // shorter, 115 ms is not.
  for (const auto& [second_ns, kept] : {std::pair<int64_t, bool>{128'000'000, true}, {130'000'000, false}}) {
    Job job(true, 64 * mib);
    std::vector<int> switched;  // the devices where the trial began or dropped it
    job.uses().set_evict(Evict::tried);
    job.uses().tell_switches([&](int device) { switched.push_back(device); });
    for (int i = 0; i < ordered_steps; ++i) {
      job.step(i == 2 ? 100'000'000 : 150'000'000);
      EXPECT_FALSE(job.uses().evicts(0)) << "step " << i;
    }
    job.step(94'000'000);  // the plan's, kept: 94 ms against 100
    job.step(94'000'000);
    EXPECT_FALSE(job.uses().evicts(0));
    EXPECT_EQ(job.step(140'000'000), (Off{128 * mib, 0, 0}));  // the plan's trial ends at this step's peak
    EXPECT_EQ(job.step(100'000'000), (Off{128 * mib, 0, 0}));
    EXPECT_FALSE(job.uses().evicts(0)) << "these two steps, placed by the plan, are timed first";
    EXPECT_EQ(job.step(), (Off{128 * mib, 0, 0}));  // both timed at this peak: eviction begins
    EXPECT_TRUE(job.uses().evicts(0));
    EXPECT_EQ(switched, std::vector<int>{0});
    EXPECT_EQ(job.step(100'000'000), (Off{0, 0, 0})) << "the plan places nothing while the evictor is tried";
    EXPECT_EQ(job.step(second_ns), (Off{0, 0, 0}));
    EXPECT_TRUE(job.uses().evicts(0));
    job.step();  // the second and third steps that evict, timed at this peak
    EXPECT_EQ(job.uses().evicts(0), kept) << second_ns << " ns";
    EXPECT_EQ(switched, std::vector<int>(kept ? 1 : 2, 0)) << "told again only where dropped";
    for (int i = 0; i < 2; ++i) {
      const Off after = kept ? Off{0, 0, 0} : Off{128 * mib, 0, 0};
      EXPECT_EQ(job.step(), after) << second_ns << " ns, step " << i;
    }
    const std::string said = std::string("trial=kept ordered_step_ms=100.0 planned_step_ms=94.0 bring_in=off "
                                         "bring_in_step_ms=0.0 evict=") +
                             (kept ? "kept" : "dropped") + " placed_step_ms=120.0 evict_step_ms=" +
                             (kept ? "114.0" : "115.0");
    EXPECT_NE(job.uses().report().find(said), std::string::npos) << job.uses().report();
  }
  // A step lasting more than twice those before the trial (250 ms against
  // 120), once the first that evicts has settled it, drops it at once, at
  // the next request; the first (the switch from the plan's placement) does not.
  Job slow(true, 64 * mib);
  slow.uses().set_evict(Evict::tried);
  for (int i = 0; i < ordered_steps; ++i) slow.step(i == 2 ? 100'000'000 : 150'000'000);
  slow.step(94'000'000);
  slow.step(94'000'000);
  slow.step(120'000'000);
  slow.step(120'000'000);
  slow.step(300'000'000);  // eviction begins at this step's peak, and the step settles it
  slow.step(250'000'000);
  EXPECT_TRUE(slow.uses().evicts(0)) << "dropped for the step that settles it";
  slow.step();
  EXPECT_FALSE(slow.uses().evicts(0));
  EXPECT_NE(slow.uses().report().find(" evict=dropped placed_step_ms=120.0 evict_step_ms=250.0 "), std::string::npos)
      << slow.uses().report();
  // Without evict:tried, never.
  Job off(true, 64 * mib);
  for (int i = 0; i < ordered_steps + 6; ++i) {
    off.step();
    EXPECT_FALSE(off.uses().evicts(0)) << "step " << i;
  }
  EXPECT_NE(off.uses().report().find(" evict=off "), std::string::npos) << off.uses().report();
  // With the evictor at all times (evict:1), the report says so.
  Job always(true, 64 * mib);
  always.uses().set_evict(Evict::always);
  for (int i = 0; i < ordered_steps + 2; ++i) always.step();
  EXPECT_NE(always.uses().report().find(" evict=always "), std::string::npos) << always.uses().report();
}

// plan_file under evict:tried: eviction's verdict comes back too. Where the
// last run kept it, the new run evicts from the start (the plan places
// nothing off the device), with no trial; where it dropped it, the new run
// never evicts and places as the plan's verdict says. A run without
// evict:tried takes back the plan, not eviction's verdict.
TEST(Uses, AJobRunAgainEvictsFromTheStartWhereItsLastRunKeptEviction) {
  for (const auto& [second_ns, kept] : {std::pair<int64_t, bool>{128'000'000, true}, {130'000'000, false}}) {
    Job last(true, 64 * mib);
    last.uses().set_evict(Evict::tried);
    for (int i = 0; i < ordered_steps; ++i) last.step(i == 2 ? 100'000'000 : 150'000'000);
    for (const int64_t ms : {94, 94, 140, 100, 100, 100}) last.step(ms * 1'000'000);
    last.step(second_ns);
    last.step();
    ASSERT_EQ(last.uses().evicts(0), kept) << second_ns << " ns";
    const std::string text = last.uses().remembered();
    const std::string verdict = kept ? "kept" : "dropped";
    EXPECT_NE(text.find("device 0 kept untried " + verdict + " "), std::string::npos) << text;

    Job again(true, 64 * mib);
    again.uses().set_evict(Evict::tried);
    ASSERT_TRUE(again.uses().remember(text)) << text;
    EXPECT_EQ(again.uses().evicts(0), kept) << "before the first request";
    const Off placed = kept ? Off{0, 0, 0} : Off{128 * mib, 0, 0};
    for (int i = 0; i < 2; ++i) EXPECT_EQ(again.step(), (Off{0, 0, 0})) << second_ns << " ns, step " << i;
    for (int i = 2; i < 8; ++i) {
      EXPECT_EQ(again.step(), placed) << second_ns << " ns, step " << i;
      EXPECT_EQ(again.uses().evicts(0), kept) << second_ns << " ns, step " << i;
    }
    const std::string report = again.uses().report();
    EXPECT_NE(report.find(" evict=" + verdict + " placed_step_ms=120.0 evict_step_ms=" + (kept ? "114.0" : "115.0")),
              std::string::npos)
        << report;
    EXPECT_NE(report.find(" remembered=1"), std::string::npos) << report;

    Job without(true, 64 * mib);
    ASSERT_TRUE(without.uses().remember(text)) << text;
    for (int i = 0; i < 4; ++i) {
      const Off expect = i < 2 ? Off{0, 0, 0} : Off{128 * mib, 0, 0};
      EXPECT_EQ(without.step(), expect) << second_ns << " ns, step " << i;
      EXPECT_FALSE(without.uses().evicts(0));
    }
  }
}

// Each step the trials time is told (for the trace's `# place` lines), with
// where the trials stand after it.
TEST(Uses, EachTimedStepIsToldWithWhereTheTrialsStand) {
  Job job(true, 64 * mib);
  std::vector<std::string> told;
  job.uses().set_evict(Evict::tried);
  job.uses().tell_steps([&](const std::string& line) { told.push_back(line); });
  for (int i = 0; i < ordered_steps; ++i) job.step(i == 2 ? 100'000'000 : 150'000'000);
  job.step(94'000'000);
  job.step(94'000'000);
  job.step(120'000'000);
  job.step(110'000'000);
  job.step();
  job.step();
  ASSERT_GE(told.size(), 4u);
  const std::vector<std::string> last(told.end() - 4, told.end());
  EXPECT_EQ(last, (std::vector<std::string>{"step 0 94.0 trial=kept bring_in=off evict=untried pinned_ms=2.0",
                                            "step 0 120.0 trial=kept bring_in=off evict=untried pinned_ms=2.0",
                                            "step 0 110.0 trial=kept bring_in=off evict=trying pinned_ms=2.0",
                                            "step 0 100.0 trial=kept bring_in=off evict=trying pinned_ms=2.0"}));
}

// The caller learns before serving a request whether it ends a step the
// trials time (Pool lets the device catch up before it reads the clock).
TEST(Uses, ARequestThatEndsATimedStepIsKnownBeforeItIsServed) {
  for (const bool place : {true, false}) {
    Job job(place, 64 * mib);
    std::vector<std::string> told;
    job.uses().tell_steps([&](const std::string& line) { told.push_back(line); });
    for (int i = 0; i < 4; ++i) {
      job.ends.clear();
      const std::size_t before = told.size();
      job.step();
      // From the second step on, B's request brings the use back to its peak;
      // the first such end starts the clock, each later one times a step.
      EXPECT_EQ(job.ends, (std::vector<bool>{false, place && i > 0, false})) << "step " << i;
      EXPECT_EQ(told.size() - before, place && i > 1 ? 1u : 0u) << "step " << i;
    }
  }
}

}  // namespace
}  // namespace gmem::pool
