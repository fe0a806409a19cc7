// SimDevice's own model: faults on unmapped access, stream order, event semantics, mem_info,
// address reuse, fault injection, the bind_thread() check and leak accounting.
#include "device/sim_device.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "common/units.hpp"
#include "status_matchers.hpp"

namespace actpage::device {
namespace {

constexpr std::size_t kGranularity = 64 * KiB;

SimDeviceConfig small_config() {
  SimDeviceConfig config;
  config.granularity = kGranularity;
  config.capacity_bytes = 16 * kGranularity;
  return config;
}

// Holds a stream's worker inside a kernel until open() is called: makes "work still in flight"
// deterministic.
class Gate {
 public:
  std::function<void()> kernel() {
    return [opened = opened_] { opened.wait(); };
  }
  void open() { promise_.set_value(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_ = promise_.get_future().share();
};

// reserve + create + map in one step, for tests about something else.
struct Mapped {
  DevPtr va = 0;
  PhysicalHandle handle;
};
Mapped map_new(SimDevice& device, std::size_t bytes, MemoryLocation where = MemoryLocation::device) {
  Mapped mapped;
  auto va = device.reserve(bytes);
  auto handle = device.create_physical(bytes, where);
  EXPECT_TRUE(va.ok() && handle.ok());
  if (!va.ok() || !handle.ok()) return mapped;
  mapped.va = *va;
  mapped.handle = *handle;
  EXPECT_TRUE(device.map(mapped.va, bytes, mapped.handle).ok());
  return mapped;
}
void unmap_all(SimDevice& device, const Mapped& mapped, std::size_t bytes) {
  EXPECT_TRUE(device.unmap(mapped.va, bytes).ok());
  EXPECT_TRUE(device.release_physical(mapped.handle).ok());
  EXPECT_TRUE(device.unreserve(mapped.va, bytes).ok());
}

TEST(SimDevice, ReadAndWriteGoThroughTheMappingTable) {
  SimDevice device(small_config());
  const Mapped mapped = map_new(device, 2 * kGranularity);
  std::vector<std::uint8_t> data(300);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7);
  const DevPtr across = mapped.va + kGranularity - 100;  // straddles no mapping boundary: one mapping
  ACTPAGE_ASSERT_OK(device.write(across, data.data(), data.size()));
  std::vector<std::uint8_t> back(data.size());
  ACTPAGE_ASSERT_OK(device.read(across, back.data(), back.size()));
  EXPECT_EQ(back, data);
  EXPECT_EQ(device.fault_count(), 0u);
  unmap_all(device, mapped, 2 * kGranularity);
}

TEST(SimDevice, AccessToUnmappedMemoryIsARecordedFaultThatMovesNoData) {
  SimDevice device(small_config());
  auto va = device.reserve(2 * kGranularity);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device.create_physical(kGranularity, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device.map(*va, kGranularity, *handle));
  std::vector<std::uint8_t> ones(kGranularity, 1);
  ACTPAGE_ASSERT_OK(device.write(*va, ones.data(), ones.size()));

  // Half of this write lands in the unmapped second granule: nothing may be written at all.
  std::vector<std::uint8_t> twos(kGranularity, 2);
  Status status = device.write(*va + kGranularity / 2, twos.data(), twos.size());
  EXPECT_EQ(status.code(), ErrorCode::device_error);
  EXPECT_NE(status.message().find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << status.message();
  std::vector<std::uint8_t> back(kGranularity);
  ACTPAGE_ASSERT_OK(device.read(*va, back.data(), back.size()));
  EXPECT_EQ(back, ones);

  // Reads of never-reserved memory fault too.
  std::uint64_t word = 0;
  EXPECT_FALSE(device.read(0x1000, &word, sizeof word).ok());

  EXPECT_EQ(device.fault_count(), 2u);
  const auto faults = device.faults();
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_NE(faults[0].find("write of 65536 bytes"), std::string::npos) << faults[0];
  EXPECT_NE(faults[0].find("is not mapped"), std::string::npos) << faults[0];
  EXPECT_NE(faults[1].find("read of 8 bytes at 0x1000"), std::string::npos) << faults[1];

  ACTPAGE_EXPECT_OK(device.unmap(*va, kGranularity));
  ACTPAGE_EXPECT_OK(device.release_physical(*handle));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 2 * kGranularity));
}

TEST(SimDevice, OnlyTheFirstFaultsAreDescribedButAllAreCounted) {
  SimDeviceConfig config = small_config();
  config.recorded_faults = 3;
  SimDevice device(config);
  std::uint8_t byte = 0;
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(device.read(0x7f0000000000ull, &byte, 1).ok());
  EXPECT_EQ(device.fault_count(), 10u);
  EXPECT_EQ(device.faults().size(), 3u);
}

// Copies resolve addresses when they run, not when they are enqueued: unmapping under a copy that
// has not run yet is exactly the bug the engine must not have, and it must show as a fault.
TEST(SimDevice, CopyFaultsWhenItsSourceIsUnmappedBeforeItRuns) {
  SimDevice device(small_config());
  const Mapped mapped = map_new(device, kGranularity);
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  Gate gate;
  ACTPAGE_ASSERT_OK(device.launch(*stream, gate.kernel()));
  std::vector<std::uint8_t> host(kGranularity, 0);
  ACTPAGE_ASSERT_OK(device.copy_to_host(host.data(), mapped.va, kGranularity, *stream));
  ACTPAGE_ASSERT_OK(device.unmap(mapped.va, kGranularity));
  gate.open();
  device.synchronize();
  EXPECT_EQ(device.fault_count(), 1u);
  ASSERT_EQ(device.faults().size(), 1u);
  EXPECT_NE(device.faults()[0].find("copy_to_host on stream"), std::string::npos) << device.faults()[0];
  EXPECT_EQ(host, std::vector<std::uint8_t>(kGranularity, 0));

  ACTPAGE_EXPECT_OK(device.release_physical(mapped.handle));
  ACTPAGE_EXPECT_OK(device.unreserve(mapped.va, kGranularity));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
}

TEST(SimDevice, FreshPhysicalMemoryHoldsThePattern) {
  SimDeviceConfig config = small_config();
  config.fresh_memory_pattern = 0xc3;
  SimDevice device(config);
  const Mapped mapped = map_new(device, kGranularity);
  std::vector<std::uint8_t> back(kGranularity);
  ACTPAGE_ASSERT_OK(device.read(mapped.va, back.data(), back.size()));
  EXPECT_EQ(back, std::vector<std::uint8_t>(kGranularity, 0xc3));
  unmap_all(device, mapped, kGranularity);
}

TEST(SimDevice, StreamRunsItsOperationsInFifoOrder) {
  SimDeviceConfig config = small_config();
  config.max_delay_us = 30;
  SimDevice device(config);
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  std::mutex mutex;
  std::vector<int> order;
  constexpr int kKernels = 300;
  for (int i = 0; i < kKernels; ++i) {
    ACTPAGE_ASSERT_OK(device.launch(*stream, [&, i] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(i);
    }));
  }
  device.synchronize();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kKernels));
  for (int i = 0; i < kKernels; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
}

TEST(SimDevice, HeldCopiesToTheHostWaitUntilReleasedAndOtherStreamsGoOn) {
  SimDevice device(small_config());
  const Mapped mapped = map_new(device, kGranularity);
  std::vector<std::uint8_t> data(256, 0x5a);
  ACTPAGE_ASSERT_OK(device.write(mapped.va, data.data(), data.size()));
  auto copies = device.create_stream(0);
  auto job = device.create_stream(0);
  ACTPAGE_ASSERT_OK(copies);
  ACTPAGE_ASSERT_OK(job);
  device.hold_copies_to_host();
  std::vector<std::uint8_t> host(data.size(), 0);
  ACTPAGE_ASSERT_OK(device.copy_to_host(host.data(), mapped.va, host.size(), *copies));
  std::atomic<bool> ran{false};
  ACTPAGE_ASSERT_OK(device.launch(*copies, [&] { ran = true; }));  // queued behind the held copy
  // The copy reaches the front of its stream and waits there; the job's stream is not held.
  while (device.copies_to_host_held() == 0) std::this_thread::yield();
  std::atomic<bool> job_ran{false};
  ACTPAGE_ASSERT_OK(device.launch(*job, [&] { job_ran = true; }));
  device.synchronize_stream(*job);
  EXPECT_TRUE(job_ran);
  EXPECT_FALSE(ran);
  EXPECT_EQ(host, std::vector<std::uint8_t>(data.size(), 0));  // nothing copied yet
  device.release_copies_to_host();
  device.synchronize();
  EXPECT_TRUE(ran);
  EXPECT_EQ(host, data);
  EXPECT_EQ(device.copies_to_host_held(), 0u);
  ACTPAGE_EXPECT_OK(device.destroy_stream(*copies));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*job));
  unmap_all(device, mapped, kGranularity);
}

// Copies to the device (reloads) are held apart: a held one waits at the front of its stream, and
// a copy to the host goes on meanwhile.
TEST(SimDevice, HeldCopiesToTheDeviceWaitUntilReleasedAndCopiesToTheHostGoOn) {
  SimDevice device(small_config());
  const Mapped mapped = map_new(device, kGranularity);
  auto reloads = device.create_stream(0);
  auto offloads = device.create_stream(0);
  ACTPAGE_ASSERT_OK(reloads);
  ACTPAGE_ASSERT_OK(offloads);
  const std::vector<std::uint8_t> before(256, 0x11);
  ACTPAGE_ASSERT_OK(device.write(mapped.va, before.data(), before.size()));
  device.hold_copies_to_device();
  const std::vector<std::uint8_t> data(256, 0xa5);
  ACTPAGE_ASSERT_OK(device.copy_to_device(mapped.va, data.data(), data.size(), *reloads));
  while (device.copies_to_device_held() == 0) std::this_thread::yield();
  std::vector<std::uint8_t> host(data.size(), 1);
  ACTPAGE_ASSERT_OK(device.copy_to_host(host.data(), mapped.va, host.size(), *offloads));
  device.synchronize_stream(*offloads);
  EXPECT_EQ(host, before) << "read before the held copy wrote";
  device.release_copies_to_device();
  device.synchronize();
  EXPECT_EQ(device.copies_to_device_held(), 0u);
  std::vector<std::uint8_t> after(data.size(), 0);
  ACTPAGE_ASSERT_OK(device.read(mapped.va, after.data(), after.size()));
  EXPECT_EQ(after, data);
  ACTPAGE_EXPECT_OK(device.destroy_stream(*reloads));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*offloads));
  unmap_all(device, mapped, kGranularity);
}

TEST(SimDevice, AHeldCopyIsReleasedWhenTheDeviceGoes) {
  std::vector<std::uint8_t> host(64, 0);
  {
    SimDevice device(small_config());
    const Mapped mapped = map_new(device, kGranularity);
    std::vector<std::uint8_t> data(64, 0x33);
    ACTPAGE_ASSERT_OK(device.write(mapped.va, data.data(), data.size()));
    auto stream = device.create_stream(0);
    ACTPAGE_ASSERT_OK(stream);
    device.hold_copies_to_host();
    ACTPAGE_ASSERT_OK(device.copy_to_host(host.data(), mapped.va, host.size(), *stream));
    while (device.copies_to_host_held() == 0) std::this_thread::yield();
  }  // the destructor releases the hold and lets the stream finish
  EXPECT_EQ(host, std::vector<std::uint8_t>(64, 0x33));
}

TEST(SimDevice, StreamWaitEventBlocksTheStreamUntilTheRecordCompletes) {
  SimDevice device(small_config());
  auto producer = device.create_stream(0);
  auto consumer = device.create_stream(0);
  auto event = device.create_event();
  ACTPAGE_ASSERT_OK(producer);
  ACTPAGE_ASSERT_OK(consumer);
  ACTPAGE_ASSERT_OK(event);
  Gate gate;
  std::atomic<bool> consumer_ran{false};
  ACTPAGE_ASSERT_OK(device.launch(*producer, gate.kernel()));
  ACTPAGE_ASSERT_OK(device.record_event(*event, *producer));
  EXPECT_EQ(device.query_event(*event).code(), ErrorCode::not_ready);
  ACTPAGE_ASSERT_OK(device.stream_wait_event(*consumer, *event));
  ACTPAGE_ASSERT_OK(device.launch(*consumer, [&] { consumer_ran = true; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(consumer_ran.load()) << "the consumer ran before the event it waits for completed";
  gate.open();
  ACTPAGE_ASSERT_OK(device.synchronize_event(*event));
  device.synchronize();
  EXPECT_TRUE(consumer_ran.load());
  ACTPAGE_EXPECT_OK(device.query_event(*event));
  ACTPAGE_EXPECT_OK(device.destroy_event(*event));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*producer));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*consumer));
}

// As in CUDA: re-recording replaces the event's record for query/synchronize, while a wait already
// enqueued keeps waiting for the record that was current when it was enqueued.
TEST(SimDevice, ReRecordingReplacesTheRecordButNotEarlierWaits) {
  SimDevice device(small_config());
  auto blocked = device.create_stream(0);
  auto free_stream = device.create_stream(0);
  auto waiter = device.create_stream(0);
  auto event = device.create_event();
  ACTPAGE_ASSERT_OK(blocked);
  ACTPAGE_ASSERT_OK(free_stream);
  ACTPAGE_ASSERT_OK(waiter);
  ACTPAGE_ASSERT_OK(event);
  Gate gate;
  std::atomic<bool> waiter_ran{false};
  ACTPAGE_ASSERT_OK(device.launch(*blocked, gate.kernel()));
  ACTPAGE_ASSERT_OK(device.record_event(*event, *blocked));
  ACTPAGE_ASSERT_OK(device.stream_wait_event(*waiter, *event));
  ACTPAGE_ASSERT_OK(device.launch(*waiter, [&] { waiter_ran = true; }));
  ACTPAGE_ASSERT_OK(device.record_event(*event, *free_stream));
  ACTPAGE_ASSERT_OK(device.synchronize_event(*event));  // the new record, on the idle stream
  ACTPAGE_EXPECT_OK(device.query_event(*event));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(waiter_ran.load()) << "the earlier wait followed the event's new record";
  gate.open();
  device.synchronize();
  EXPECT_TRUE(waiter_ran.load());
  ACTPAGE_EXPECT_OK(device.destroy_event(*event));
  for (StreamHandle stream : {*blocked, *free_stream, *waiter}) ACTPAGE_EXPECT_OK(device.destroy_stream(stream));
}

// Producer/consumer through device memory under random delays, many times: with the event wait the
// consumer always reads what the producer wrote in the same round.
TEST(SimDevice, EventsOrderKernelsAcrossStreamsUnderRandomDelays) {
  SimDeviceConfig config = small_config();
  config.max_delay_us = 60;
  config.seed = 99;
  SimDevice device(config);
  const Mapped mapped = map_new(device, kGranularity);
  auto producer = device.create_stream(0);
  auto consumer = device.create_stream(0);
  auto written = device.create_event();
  auto read = device.create_event();
  ACTPAGE_ASSERT_OK(producer);
  ACTPAGE_ASSERT_OK(consumer);
  ACTPAGE_ASSERT_OK(written);
  ACTPAGE_ASSERT_OK(read);
  constexpr std::uint64_t kRounds = 200;
  std::vector<std::uint64_t> seen(kRounds, 0);
  for (std::uint64_t round = 0; round < kRounds; ++round) {
    ACTPAGE_ASSERT_OK(device.stream_wait_event(*producer, *read));  // do not overwrite unread data
    ACTPAGE_ASSERT_OK(device.launch(*producer, [&device, va = mapped.va, round] {
      const std::uint64_t value = round + 1;
      EXPECT_TRUE(device.write(va, &value, sizeof value).ok());
    }));
    ACTPAGE_ASSERT_OK(device.record_event(*written, *producer));
    ACTPAGE_ASSERT_OK(device.stream_wait_event(*consumer, *written));
    ACTPAGE_ASSERT_OK(device.launch(*consumer, [&device, &seen, va = mapped.va, round] {
      EXPECT_TRUE(device.read(va, &seen[round], sizeof seen[round]).ok());
    }));
    ACTPAGE_ASSERT_OK(device.record_event(*read, *consumer));
  }
  device.synchronize();
  for (std::uint64_t round = 0; round < kRounds; ++round) EXPECT_EQ(seen[round], round + 1) << "round " << round;
  EXPECT_EQ(device.fault_count(), 0u);
  ACTPAGE_EXPECT_OK(device.destroy_event(*written));
  ACTPAGE_EXPECT_OK(device.destroy_event(*read));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*producer));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*consumer));
  unmap_all(device, mapped, kGranularity);
}

TEST(SimDevice, TheDefaultStreamExistsAndCannotBeDestroyed) {
  SimDevice device(small_config());
  std::atomic<int> ran{0};
  ACTPAGE_ASSERT_OK(device.launch(StreamHandle{0}, [&] { ++ran; }));
  device.synchronize();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(device.destroy_stream(StreamHandle{0}).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(device.launch(StreamHandle{12345}, [] {}).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(device.stats().streams, 0u);
}

TEST(SimDevice, DestroyingAStreamLetsItsQueuedWorkFinish) {
  SimDevice device(small_config());
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  Gate gate;
  std::atomic<int> ran{0};
  ACTPAGE_ASSERT_OK(device.launch(*stream, gate.kernel()));
  for (int i = 0; i < 5; ++i) ACTPAGE_ASSERT_OK(device.launch(*stream, [&] { ++ran; }));
  ACTPAGE_ASSERT_OK(device.destroy_stream(*stream));  // returns at once
  EXPECT_EQ(ran.load(), 0);
  EXPECT_FALSE(device.launch(*stream, [] {}).ok()) << "a destroyed stream accepted work";
  gate.open();
  device.synchronize();
  EXPECT_EQ(ran.load(), 5);
}

TEST(SimDevice, DestructorRunsAllEnqueuedWorkAndJoinsTheThreads) {
  std::atomic<int> ran{0};
  {
    SimDeviceConfig config = small_config();
    config.max_delay_us = 100;
    SimDevice device(config);
    for (int s = 0; s < 4; ++s) {
      auto stream = device.create_stream(0);
      ACTPAGE_ASSERT_OK(stream);
      for (int i = 0; i < 20; ++i) ACTPAGE_ASSERT_OK(device.launch(*stream, [&] { ++ran; }));
    }
  }
  EXPECT_EQ(ran.load(), 80);
}

TEST(SimDevice, AKernelThatThrowsIsAFault) {
  SimDevice device(small_config());
  ACTPAGE_ASSERT_OK(device.launch(StreamHandle{0}, [] { throw std::runtime_error("boom"); }));
  device.synchronize();
  ASSERT_EQ(device.fault_count(), 1u);
  EXPECT_NE(device.faults()[0].find("boom"), std::string::npos);
}

TEST(SimDevice, MemInfoCountsDeviceMemoryUntilReleasedAndUnmapped) {
  SimDevice device(small_config());
  const std::uint64_t total = 16 * kGranularity;
  auto start = device.mem_info();
  ACTPAGE_ASSERT_OK(start);
  EXPECT_EQ(start->total_bytes, total);
  EXPECT_EQ(start->free_bytes, total);

  const Mapped mapped = map_new(device, 4 * kGranularity);
  auto host_handle = device.create_physical(4 * kGranularity, MemoryLocation::host);
  ACTPAGE_ASSERT_OK(host_handle);
  EXPECT_EQ(device.mem_info()->free_bytes, total - 4 * kGranularity) << "host memory must not count";

  // Released while mapped: the handle is gone but the memory stays, readable, until unmapped.
  const std::uint32_t marker = 0xfeedbeef;
  ACTPAGE_ASSERT_OK(device.write(mapped.va, &marker, sizeof marker));
  ACTPAGE_ASSERT_OK(device.release_physical(mapped.handle));
  EXPECT_EQ(device.mem_info()->free_bytes, total - 4 * kGranularity);
  EXPECT_EQ(device.release_physical(mapped.handle).code(), ErrorCode::invalid_argument);
  std::uint32_t back = 0;
  ACTPAGE_ASSERT_OK(device.read(mapped.va, &back, sizeof back));
  EXPECT_EQ(back, marker);
  EXPECT_EQ(device.stats().device_handles, 0u);
  EXPECT_EQ(device.stats().device_resident_bytes, 4 * kGranularity);

  ACTPAGE_ASSERT_OK(device.unmap(mapped.va, 4 * kGranularity));
  EXPECT_EQ(device.mem_info()->free_bytes, total);
  ACTPAGE_EXPECT_OK(device.unreserve(mapped.va, 4 * kGranularity));
  ACTPAGE_EXPECT_OK(device.release_physical(*host_handle));
  EXPECT_TRUE(device.stats().clean()) << device.stats().to_string();
}

TEST(SimDevice, CreatePhysicalPastCapacityIsOutOfMemory) {
  SimDevice device(small_config());
  auto most = device.create_physical(12 * kGranularity, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(most);
  auto too_much = device.create_physical(5 * kGranularity, MemoryLocation::device);
  ASSERT_FALSE(too_much.ok());
  EXPECT_EQ(too_much.status().code(), ErrorCode::out_of_memory);
  EXPECT_NE(too_much.status().message().find("cuMemCreate"), std::string::npos) << too_much.status().message();
  EXPECT_NE(too_much.status().message().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos);
  auto rest = device.create_physical(4 * kGranularity, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(rest);
  EXPECT_EQ(device.mem_info()->free_bytes, 0u);
  ACTPAGE_EXPECT_OK(device.release_physical(*most));
  ACTPAGE_EXPECT_OK(device.release_physical(*rest));
}

TEST(SimDevice, HostPhysicalMemoryCanBeSwitchedOff) {
  SimDeviceConfig config = small_config();
  config.supports_host_physical = false;
  SimDevice device(config);
  EXPECT_FALSE(device.supports_host_physical());
  auto handle = device.create_physical(kGranularity, MemoryLocation::host);
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), ErrorCode::not_supported);
}

TEST(SimDevice, LocationOfTellsWhichMemoryBacksAnAddress) {
  SimDevice device(small_config());
  const Mapped on_device = map_new(device, kGranularity);
  const Mapped on_host = map_new(device, kGranularity, MemoryLocation::host);
  EXPECT_EQ(*device.location_of(on_device.va + 5), MemoryLocation::device);
  EXPECT_EQ(*device.location_of(on_host.va), MemoryLocation::host);
  EXPECT_FALSE(device.location_of(on_host.va + kGranularity).ok());
  unmap_all(device, on_device, kGranularity);
  unmap_all(device, on_host, kGranularity);
}

TEST(SimDevice, AddressSpaceIsReusedAfterUnreserve) {
  SimDevice device(small_config());
  auto a = device.reserve(2 * kGranularity);
  auto b = device.reserve(kGranularity);
  ACTPAGE_ASSERT_OK(a);
  ACTPAGE_ASSERT_OK(b);
  EXPECT_EQ(*a, device.config().va_base);
  EXPECT_EQ(*b, *a + 2 * kGranularity);
  ACTPAGE_ASSERT_OK(device.unreserve(*a, 2 * kGranularity));
  auto c = device.reserve(kGranularity);
  auto d = device.reserve(kGranularity);
  ACTPAGE_ASSERT_OK(c);
  ACTPAGE_ASSERT_OK(d);
  EXPECT_EQ(*c, *a);
  EXPECT_EQ(*d, *a + kGranularity);
  // Freed neighbours merge: all three give back one range that fits a 3-granule reservation again.
  ACTPAGE_ASSERT_OK(device.unreserve(*c, kGranularity));
  ACTPAGE_ASSERT_OK(device.unreserve(*b, kGranularity));
  ACTPAGE_ASSERT_OK(device.unreserve(*d, kGranularity));
  auto e = device.reserve(3 * kGranularity);
  ACTPAGE_ASSERT_OK(e);
  EXPECT_EQ(*e, *a);
  ACTPAGE_EXPECT_OK(device.unreserve(*e, 3 * kGranularity));
  EXPECT_TRUE(device.stats().clean()) << device.stats().to_string();
}

TEST(SimDevice, ReserveAndUnreserveRejectBadRanges) {
  SimDevice device(small_config());
  EXPECT_EQ(device.reserve(0).status().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(device.reserve(kGranularity + 1).status().code(), ErrorCode::invalid_argument);
  auto va = device.reserve(2 * kGranularity);
  ACTPAGE_ASSERT_OK(va);
  EXPECT_FALSE(device.unreserve(*va, kGranularity).ok()) << "part of a reservation was freed";
  auto handle = device.create_physical(kGranularity, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device.map(*va + kGranularity, kGranularity, *handle));
  Status still_mapped = device.unreserve(*va, 2 * kGranularity);
  EXPECT_FALSE(still_mapped.ok());
  EXPECT_NE(still_mapped.message().find("still has a mapping"), std::string::npos) << still_mapped.message();
  ACTPAGE_EXPECT_OK(device.unmap(*va + kGranularity, kGranularity));
  ACTPAGE_EXPECT_OK(device.release_physical(*handle));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 2 * kGranularity));
}

TEST(SimDevice, MapRejectsRangesOutsideOneReservationAndHandlesTooSmall) {
  SimDevice device(small_config());
  auto a = device.reserve(kGranularity);
  auto b = device.reserve(kGranularity);  // adjacent to a, but another reservation
  auto big = device.create_physical(2 * kGranularity, MemoryLocation::device);
  auto small = device.create_physical(kGranularity, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(a);
  ACTPAGE_ASSERT_OK(b);
  ACTPAGE_ASSERT_OK(big);
  ACTPAGE_ASSERT_OK(small);
  ASSERT_EQ(*b, *a + kGranularity);
  EXPECT_FALSE(device.map(*a, 2 * kGranularity, *big).ok()) << "a mapping spanned two reservations";
  EXPECT_FALSE(device.map(0x1000000, kGranularity, *small).ok()) << "mapped at an unreserved address";
  Status too_small = device.map(*a, 2 * kGranularity, *small);
  EXPECT_FALSE(too_small.ok());
  EXPECT_EQ(device.map(*a, kGranularity, PhysicalHandle{999999}).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(device.stats().mappings, 0u);

  // The same handle may be mapped at two addresses; the data is shared.
  ACTPAGE_ASSERT_OK(device.map(*a, kGranularity, *small));
  ACTPAGE_ASSERT_OK(device.map(*b, kGranularity, *small));
  const std::uint64_t word = 0x1234;
  ACTPAGE_ASSERT_OK(device.write(*a + 8, &word, sizeof word));
  std::uint64_t back = 0;
  ACTPAGE_ASSERT_OK(device.read(*b + 8, &back, sizeof back));
  EXPECT_EQ(back, word);

  ACTPAGE_EXPECT_OK(device.unmap(*a, kGranularity));
  ACTPAGE_EXPECT_OK(device.unmap(*b, kGranularity));
  ACTPAGE_EXPECT_OK(device.release_physical(*big));
  ACTPAGE_EXPECT_OK(device.release_physical(*small));
  ACTPAGE_EXPECT_OK(device.unreserve(*a, kGranularity));
  ACTPAGE_EXPECT_OK(device.unreserve(*b, kGranularity));
  EXPECT_TRUE(device.stats().clean()) << device.stats().to_string();
}

TEST(SimDevice, UnmapTakesOnlyWholeMappings) {
  SimDevice device(small_config());
  auto va = device.reserve(4 * kGranularity);
  auto first = device.create_physical(2 * kGranularity, MemoryLocation::device);
  auto second = device.create_physical(kGranularity, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(va);
  ACTPAGE_ASSERT_OK(first);
  ACTPAGE_ASSERT_OK(second);
  ACTPAGE_ASSERT_OK(device.map(*va, 2 * kGranularity, *first));
  ACTPAGE_ASSERT_OK(device.map(*va + 2 * kGranularity, kGranularity, *second));
  EXPECT_FALSE(device.unmap(*va, kGranularity).ok()) << "half a mapping was unmapped";
  EXPECT_FALSE(device.unmap(*va + kGranularity, kGranularity).ok());
  EXPECT_FALSE(device.unmap(*va, 4 * kGranularity).ok()) << "a range with a hole was unmapped";
  EXPECT_FALSE(device.unmap(*va + 3 * kGranularity, kGranularity).ok()) << "nothing is mapped there";
  EXPECT_EQ(device.stats().mappings, 2u);
  // Two adjacent whole mappings go in one call.
  ACTPAGE_ASSERT_OK(device.unmap(*va, 3 * kGranularity));
  EXPECT_EQ(device.stats().mappings, 0u);
  ACTPAGE_EXPECT_OK(device.release_physical(*first));
  ACTPAGE_EXPECT_OK(device.release_physical(*second));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 4 * kGranularity));
}

TEST(SimDevice, MappedWithoutAccessFaultsUntilOneGrantCoversWholeMappings) {
  SimDevice device(small_config());
  auto va = device.reserve(4 * kGranularity);
  auto first = device.create_physical(kGranularity, MemoryLocation::device);
  auto second = device.create_physical(2 * kGranularity, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(va);
  ACTPAGE_ASSERT_OK(first);
  ACTPAGE_ASSERT_OK(second);
  ACTPAGE_ASSERT_OK(device.map_without_access(*va, kGranularity, *first));
  ACTPAGE_ASSERT_OK(device.map_without_access(*va + kGranularity, 2 * kGranularity, *second));
  std::vector<std::uint8_t> ones(kGranularity, 1);
  Status status = device.write(*va + kGranularity, ones.data(), ones.size());
  EXPECT_EQ(status.code(), ErrorCode::device_error);
  EXPECT_NE(status.message().find("mapped without access"), std::string::npos) << status.message();
  // A grant takes whole mappings, like cuMemSetAccess: not half of one, not past the last.
  EXPECT_FALSE(device.grant_access(*va, 2 * kGranularity).ok());
  EXPECT_FALSE(device.grant_access(*va, 4 * kGranularity).ok());
  std::uint64_t word = 0;
  EXPECT_FALSE(device.read(*va, &word, sizeof word).ok()) << "a refused grant granted access";
  // One call over both mappings.
  ACTPAGE_ASSERT_OK(device.grant_access(*va, 3 * kGranularity));
  ACTPAGE_ASSERT_OK(device.write(*va + kGranularity, ones.data(), ones.size()));
  ACTPAGE_ASSERT_OK(device.read(*va, &word, sizeof word));
  EXPECT_EQ(device.fault_count(), 2u);
  EXPECT_EQ(device.call_count(SimOp::grant_access), 3u);
  EXPECT_EQ(device.call_count(SimOp::map), 2u);
  // A later mapping at an unmapped address starts without access again.
  ACTPAGE_ASSERT_OK(device.unmap(*va, kGranularity));
  ACTPAGE_ASSERT_OK(device.map_without_access(*va, kGranularity, *first));
  EXPECT_FALSE(device.read(*va, &word, sizeof word).ok());
  ACTPAGE_ASSERT_OK(device.unmap(*va, 3 * kGranularity));
  ACTPAGE_EXPECT_OK(device.release_physical(*first));
  ACTPAGE_EXPECT_OK(device.release_physical(*second));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 4 * kGranularity));
}

TEST(SimDevice, FaultPlanRunFailsExactlyItsCalls) {
  const SimFaultPlan plan = SimFaultPlan()
                                .fail_run(SimOp::unmap, 3, 4, ErrorCode::invalid_argument)
                                .fail_run(SimOp::map, 1, 0, ErrorCode::device_error);  // an empty run
  for (std::uint64_t call = 1; call <= 9; ++call) {
    const std::optional<ErrorCode> code = plan.failure_for(SimOp::unmap, call);
    if (call >= 3 && call <= 6) {
      EXPECT_EQ(code, ErrorCode::invalid_argument) << "call " << call;
    } else {
      EXPECT_FALSE(code.has_value()) << "call " << call;
    }
    EXPECT_FALSE(plan.failure_for(SimOp::map, call).has_value()) << "call " << call;
  }
}

TEST(SimDevice, FaultPlanFailsTheChosenCallsAndLeavesNoState) {
  SimDevice device(small_config());
  device.set_fault_plan(SimFaultPlan()
                            .fail_nth(SimOp::map, 2, ErrorCode::out_of_memory)
                            .fail_after(SimOp::alloc_pinned, 1, ErrorCode::out_of_memory));
  auto va = device.reserve(3 * kGranularity);
  ACTPAGE_ASSERT_OK(va);
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 3; ++i) {
    auto handle = device.create_physical(kGranularity, MemoryLocation::device);
    ACTPAGE_ASSERT_OK(handle);
    handles.push_back(*handle);
  }
  ACTPAGE_EXPECT_OK(device.map(*va, kGranularity, handles[0]));
  Status second = device.map(*va + kGranularity, kGranularity, handles[1]);
  EXPECT_EQ(second.code(), ErrorCode::out_of_memory);
  EXPECT_NE(second.message().find("cuMemMap (simulated): CUDA_ERROR_OUT_OF_MEMORY (injected failure of call 2)"),
            std::string::npos)
      << second.message();
  EXPECT_NE(second.message().find("while mapping 64 KiB at 0x7f0000010000"), std::string::npos) << second.message();
  EXPECT_EQ(device.stats().mappings, 1u) << "a failed map left a mapping";
  ACTPAGE_EXPECT_OK(device.map(*va + kGranularity, kGranularity, handles[1]));
  ACTPAGE_EXPECT_OK(device.map(*va + 2 * kGranularity, kGranularity, handles[2]));
  EXPECT_EQ(device.call_count(SimOp::map), 4u);

  auto first_pinned = device.alloc_pinned(4096);
  ACTPAGE_ASSERT_OK(first_pinned);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(device.alloc_pinned(4096).status().code(), ErrorCode::out_of_memory);
  EXPECT_EQ(device.stats().pinned_allocations, 1u);
  EXPECT_EQ(device.stats().pinned_bytes, 4096u);

  // A new plan; counts go on unless reset.
  device.set_fault_plan(SimFaultPlan().fail_nth(SimOp::copy_to_host, 1, ErrorCode::device_error));
  std::uint8_t byte = 0;
  EXPECT_EQ(device.copy_to_host(&byte, *va, 1, StreamHandle{0}).code(), ErrorCode::device_error);
  ACTPAGE_EXPECT_OK(device.copy_to_host(&byte, *va, 1, StreamHandle{0}));
  device.reset_call_counts();
  EXPECT_EQ(device.copy_to_host(&byte, *va, 1, StreamHandle{0}).code(), ErrorCode::device_error);
  device.synchronize();
  EXPECT_EQ(device.fault_count(), 0u);

  device.set_fault_plan(SimFaultPlan());
  ACTPAGE_EXPECT_OK(device.free_pinned(*first_pinned));
  ACTPAGE_EXPECT_OK(device.unmap(*va, 3 * kGranularity));
  for (PhysicalHandle handle : handles) ACTPAGE_EXPECT_OK(device.release_physical(handle));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 3 * kGranularity));
  EXPECT_TRUE(device.stats().clean()) << device.stats().to_string();
}

TEST(SimDevice, RequireBindThreadRejectsUnboundThreads) {
  SimDeviceConfig config = small_config();
  config.require_bind_thread = true;
  SimDevice device(config);
  Status unbound;
  Status bound;
  std::thread worker([&] {
    unbound = device.create_event().status();
    ACTPAGE_EXPECT_OK(device.bind_thread());
    auto event = device.create_event();
    bound = event.ok() ? Status() : event.status();
    if (event.ok()) {
      EXPECT_TRUE(device.destroy_event(*event).ok());
    }
  });
  worker.join();
  EXPECT_FALSE(unbound.ok());
  EXPECT_NE(unbound.message().find("CUDA_ERROR_INVALID_CONTEXT"), std::string::npos) << unbound.message();
  ACTPAGE_EXPECT_OK(bound);
}

TEST(SimDevice, CapturingIsWhatTheTestSays) {
  SimDevice device(small_config());
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  EXPECT_FALSE(*device.is_capturing(*stream));
  ACTPAGE_ASSERT_OK(device.set_capturing(*stream, true));
  EXPECT_TRUE(*device.is_capturing(*stream));
  EXPECT_FALSE(*device.is_capturing(StreamHandle{0}));
  EXPECT_FALSE(device.is_capturing(StreamHandle{777}).ok());
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
}

TEST(SimDevice, PinnedMemoryIsAccountedAndChecked) {
  SimDeviceConfig config = small_config();
  config.pinned_capacity_bytes = 1 * MiB;
  SimDevice device(config);
  auto a = device.alloc_pinned(600 * KiB);
  ACTPAGE_ASSERT_OK(a);
  EXPECT_EQ(device.alloc_pinned(600 * KiB).status().code(), ErrorCode::out_of_memory);
  EXPECT_EQ(device.stats().pinned_bytes, 600 * KiB);
  int not_pinned = 0;
  EXPECT_EQ(device.free_pinned(&not_pinned).code(), ErrorCode::invalid_argument);
  ACTPAGE_ASSERT_OK(device.free_pinned(*a));
  EXPECT_EQ(device.free_pinned(*a).code(), ErrorCode::invalid_argument) << "double free accepted";
  EXPECT_EQ(device.alloc_pinned(0).status().code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(device.stats().clean()) << device.stats().to_string();
}

TEST(SimDevice, AccountingReturnsToZeroAfterABusyScenario) {
  SimDeviceConfig config = small_config();
  config.max_delay_us = 20;
  SimDevice device(config);
  std::vector<StreamHandle> streams;
  std::vector<EventHandle> events;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(*device.create_stream(-i));
    events.push_back(*device.create_event());
  }
  std::vector<Mapped> mapped;
  for (int i = 0; i < 4; ++i) mapped.push_back(map_new(device, kGranularity, i % 2 ? MemoryLocation::host : MemoryLocation::device));
  auto pinned = device.alloc_pinned(4 * kGranularity);
  ACTPAGE_ASSERT_OK(pinned);
  for (int i = 0; i < 4; ++i) {
    auto* slot = static_cast<std::byte*>(*pinned) + static_cast<std::size_t>(i) * kGranularity;
    const StreamHandle stream = streams[static_cast<std::size_t>(i) % streams.size()];
    ACTPAGE_ASSERT_OK(device.fill(mapped[static_cast<std::size_t>(i)].va, static_cast<std::uint8_t>(i), kGranularity, stream));
    ACTPAGE_ASSERT_OK(device.copy_to_host(slot, mapped[static_cast<std::size_t>(i)].va, kGranularity, stream));
    ACTPAGE_ASSERT_OK(device.record_event(events[static_cast<std::size_t>(i) % events.size()], stream));
  }
  SimDeviceStats busy = device.stats();
  EXPECT_EQ(busy.streams, 3u);
  EXPECT_EQ(busy.events, 3u);
  EXPECT_EQ(busy.mappings, 4u);
  EXPECT_EQ(busy.device_handles, 2u);
  EXPECT_EQ(busy.host_handles, 2u);
  EXPECT_EQ(busy.reserved_bytes, 4 * kGranularity);
  EXPECT_FALSE(busy.clean());
  for (EventHandle event : events) ACTPAGE_ASSERT_OK(device.synchronize_event(event));
  device.synchronize();
  for (int i = 0; i < 4; ++i) {
    const auto* slot = static_cast<const std::uint8_t*>(*pinned) + static_cast<std::size_t>(i) * kGranularity;
    EXPECT_EQ(slot[0], i);
    EXPECT_EQ(slot[kGranularity - 1], i);
  }
  for (const Mapped& m : mapped) unmap_all(device, m, kGranularity);
  ACTPAGE_EXPECT_OK(device.free_pinned(*pinned));
  for (EventHandle event : events) ACTPAGE_EXPECT_OK(device.destroy_event(event));
  for (StreamHandle stream : streams) ACTPAGE_EXPECT_OK(device.destroy_stream(stream));
  const SimDeviceStats after = device.stats();
  EXPECT_TRUE(after.clean()) << after.to_string();
  EXPECT_EQ(after.to_string().find("operations_executed"), 0u) << after.to_string();
  EXPECT_EQ(after.faults, 0u);
}

}  // namespace
}  // namespace actpage::device
