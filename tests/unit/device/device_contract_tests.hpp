// The contract of include/actpage/device.hpp, written once and instantiated per Device implementation
// (SimDevice in tests/unit/device, CudaDevice in tests/gpu/device).
//
// A Factory provides:
//   static Result<std::unique_ptr<actpage::Device>> make();
//   static bool skip_on(const actpage::Status& failure);  // true: no device here, skip the suite
//
// Every test cleans up what it made and checks the cleanup calls too: a leak in one test would show
// as wrong mem_info() figures in the next.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "actpage/device.hpp"
#include "common/units.hpp"
#include "status_matchers.hpp"

namespace actpage::testing {

template <class Factory>
class DeviceContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = Factory::make();
    if (!made.ok()) {
      if (Factory::skip_on(made.status())) GTEST_SKIP() << "no device: " << made.status().message();
      FAIL() << made.status().message();
    }
    device_ = std::move(made.value());
    ACTPAGE_ASSERT_OK(device_->bind_thread());
    granularity_ = device_->granularity();
  }

  // Blocks until everything enqueued on `stream` so far has run.
  void drain(StreamHandle stream) {
    auto event = device_->create_event();
    ACTPAGE_ASSERT_OK(event);
    ACTPAGE_ASSERT_OK(device_->record_event(*event, stream));
    ACTPAGE_ASSERT_OK(device_->synchronize_event(*event));
    ACTPAGE_ASSERT_OK(device_->destroy_event(*event));
  }

  std::unique_ptr<Device> device_;
  std::size_t granularity_ = 0;
};

TYPED_TEST_SUITE_P(DeviceContractTest);

TYPED_TEST_P(DeviceContractTest, GranularityIsAPowerOfTwo) {
  const std::size_t g = this->granularity_;
  EXPECT_GE(g, 4096u);
  EXPECT_EQ(g & (g - 1), 0u) << g;
}

TYPED_TEST_P(DeviceContractTest, ReservationsAreAlignedAndDisjoint) {
  Device& device = *this->device_;
  const std::size_t g = this->granularity_;
  const std::vector<std::size_t> sizes = {g, 3 * g, 2 * g, g};
  std::vector<DevPtr> starts;
  for (std::size_t bytes : sizes) {
    auto va = device.reserve(bytes);
    ACTPAGE_ASSERT_OK(va);
    EXPECT_NE(*va, 0u);
    EXPECT_EQ(*va % g, 0u);
    starts.push_back(*va);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::size_t j = i + 1; j < sizes.size(); ++j) {
      const bool disjoint = starts[i] + sizes[i] <= starts[j] || starts[j] + sizes[j] <= starts[i];
      EXPECT_TRUE(disjoint) << "reservations " << i << " and " << j << " overlap";
    }
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) ACTPAGE_EXPECT_OK(device.unreserve(starts[i], sizes[i]));
}

TYPED_TEST_P(DeviceContractTest, CopiesRoundTripThroughMappedMemory) {
  Device& device = *this->device_;
  const std::size_t bytes = 2 * this->granularity_;
  auto va = device.reserve(bytes);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device.create_physical(bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *handle));
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  auto source = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(source);
  auto target = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(target);

  auto* in = static_cast<std::uint64_t*>(*source);
  std::mt19937_64 random(42);
  for (std::size_t i = 0; i < bytes / 8; ++i) in[i] = random();
  std::memset(*target, 0, bytes);

  ACTPAGE_ASSERT_OK(device.copy_to_device(*va, *source, bytes, *stream));
  ACTPAGE_ASSERT_OK(device.copy_to_host(*target, *va, bytes, *stream));
  this->drain(*stream);
  EXPECT_EQ(std::memcmp(*source, *target, bytes), 0) << "data changed on its way through the device";

  // An unaligned part in the middle comes back byte for byte too.
  std::memset(*target, 0, bytes);
  ACTPAGE_ASSERT_OK(device.copy_to_host(*target, *va + 13, 1000, *stream));
  this->drain(*stream);
  EXPECT_EQ(std::memcmp(static_cast<std::byte*>(*source) + 13, *target, 1000), 0);

  ACTPAGE_EXPECT_OK(device.free_pinned(*source));
  ACTPAGE_EXPECT_OK(device.free_pinned(*target));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
  ACTPAGE_EXPECT_OK(device.unmap(*va, bytes));
  ACTPAGE_EXPECT_OK(device.release_physical(*handle));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, bytes));
}

TYPED_TEST_P(DeviceContractTest, FillAndCopySpanAdjacentMappings) {
  Device& device = *this->device_;
  const std::size_t g = this->granularity_;
  auto va = device.reserve(2 * g);
  ACTPAGE_ASSERT_OK(va);
  auto first = device.create_physical(g, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(first);
  auto second = device.create_physical(g, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(second);
  ACTPAGE_ASSERT_OK(device.map(*va, g, *first));
  ACTPAGE_ASSERT_OK(device.map(*va + g, g, *second));
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  auto host = device.alloc_pinned(2 * g);
  ACTPAGE_ASSERT_OK(host);

  ACTPAGE_ASSERT_OK(device.fill(*va, 0x11, 2 * g, *stream));
  // The middle half crosses from the first handle into the second.
  ACTPAGE_ASSERT_OK(device.fill(*va + g / 2, 0x7e, g, *stream));
  ACTPAGE_ASSERT_OK(device.copy_to_host(*host, *va, 2 * g, *stream));
  this->drain(*stream);
  const auto* bytes = static_cast<const std::uint8_t*>(*host);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < 2 * g; ++i) {
    const std::uint8_t expected = (i >= g / 2 && i < g / 2 + g) ? 0x7e : 0x11;
    if (bytes[i] != expected) ++wrong;
  }
  EXPECT_EQ(wrong, 0u);

  ACTPAGE_EXPECT_OK(device.free_pinned(*host));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
  ACTPAGE_EXPECT_OK(device.unmap(*va, g));
  ACTPAGE_EXPECT_OK(device.unmap(*va + g, g));
  ACTPAGE_EXPECT_OK(device.release_physical(*first));
  ACTPAGE_EXPECT_OK(device.release_physical(*second));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 2 * g));
}

TYPED_TEST_P(DeviceContractTest, MapRejectsMisalignedAndOverlappingRanges) {
  Device& device = *this->device_;
  const std::size_t g = this->granularity_;
  auto va = device.reserve(2 * g);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device.create_physical(g, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  auto other = device.create_physical(g, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(other);

  Status misaligned = device.map(*va + 4096, g, *handle);
  EXPECT_FALSE(misaligned.ok());
  EXPECT_NE(misaligned.message().find("mapping"), std::string::npos) << misaligned.message();

  ACTPAGE_ASSERT_OK(device.map(*va, g, *handle));
  Status overlapping = device.map(*va, g, *other);
  EXPECT_FALSE(overlapping.ok());
  // The failed map left nothing behind: the other handle maps fine next door.
  ACTPAGE_EXPECT_OK(device.map(*va + g, g, *other));

  ACTPAGE_EXPECT_OK(device.unmap(*va, g));
  ACTPAGE_EXPECT_OK(device.unmap(*va + g, g));
  ACTPAGE_EXPECT_OK(device.release_physical(*handle));
  ACTPAGE_EXPECT_OK(device.release_physical(*other));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 2 * g));
}

// The offload sequence of stray_access=host_mapped: the data leaves device memory for a host-located
// handle mapped at the same address, then comes back to device memory, intact both times.
TYPED_TEST_P(DeviceContractTest, HostPhysicalMemoryServesTheSameAddress) {
  Device& device = *this->device_;
  if (!device.supports_host_physical()) GTEST_SKIP() << "the device has no host-located physical memory";
  const std::size_t bytes = 2 * this->granularity_;
  auto va = device.reserve(bytes);
  ACTPAGE_ASSERT_OK(va);
  auto on_device = device.create_physical(bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(on_device);
  auto on_host = device.create_physical(bytes, MemoryLocation::host);
  ACTPAGE_ASSERT_OK(on_host);
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  auto original = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(original);
  auto staging = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(staging);
  auto check = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(check);
  auto* words = static_cast<std::uint64_t*>(*original);
  std::mt19937_64 random(7);
  for (std::size_t i = 0; i < bytes / 8; ++i) words[i] = random();

  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *on_device));
  ACTPAGE_ASSERT_OK(device.copy_to_device(*va, *original, bytes, *stream));
  ACTPAGE_ASSERT_OK(device.copy_to_host(*staging, *va, bytes, *stream));
  this->drain(*stream);
  // Offload: device pages go, host pages take the same address and receive the data.
  ACTPAGE_ASSERT_OK(device.unmap(*va, bytes));
  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *on_host));
  ACTPAGE_ASSERT_OK(device.copy_to_device(*va, *staging, bytes, *stream));
  std::memset(*check, 0, bytes);
  ACTPAGE_ASSERT_OK(device.copy_to_host(*check, *va, bytes, *stream));
  this->drain(*stream);
  EXPECT_EQ(std::memcmp(*original, *check, bytes), 0) << "host-mapped copy differs";

  // Reload: device pages come back at the address, filled from the host-mapped copy.
  std::memset(*staging, 0, bytes);
  ACTPAGE_ASSERT_OK(device.copy_to_host(*staging, *va, bytes, *stream));
  this->drain(*stream);
  ACTPAGE_ASSERT_OK(device.unmap(*va, bytes));
  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *on_device));
  ACTPAGE_ASSERT_OK(device.copy_to_device(*va, *staging, bytes, *stream));
  std::memset(*check, 0, bytes);
  ACTPAGE_ASSERT_OK(device.copy_to_host(*check, *va, bytes, *stream));
  this->drain(*stream);
  EXPECT_EQ(std::memcmp(*original, *check, bytes), 0) << "reloaded copy differs";

  ACTPAGE_EXPECT_OK(device.unmap(*va, bytes));
  ACTPAGE_EXPECT_OK(device.release_physical(*on_device));
  ACTPAGE_EXPECT_OK(device.release_physical(*on_host));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, bytes));
  ACTPAGE_EXPECT_OK(device.free_pinned(*original));
  ACTPAGE_EXPECT_OK(device.free_pinned(*staging));
  ACTPAGE_EXPECT_OK(device.free_pinned(*check));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
}

// A consumer stream that waits for a producer's event sees the producer's data, every time.
TYPED_TEST_P(DeviceContractTest, StreamWaitEventOrdersTwoStreams) {
  Device& device = *this->device_;
  const std::size_t bytes = round_up(16 * MiB, this->granularity_);
  auto va = device.reserve(bytes);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device.create_physical(bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *handle));
  auto producer = device.create_stream(0);
  ACTPAGE_ASSERT_OK(producer);
  auto consumer = device.create_stream(-1);
  ACTPAGE_ASSERT_OK(consumer);
  auto produced = device.create_event();
  ACTPAGE_ASSERT_OK(produced);
  auto consumed = device.create_event();
  ACTPAGE_ASSERT_OK(consumed);
  auto host = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(host);

  for (int round = 1; round <= 6; ++round) {
    const auto value = static_cast<std::uint8_t>(round * 37);
    ACTPAGE_ASSERT_OK(device.fill(*va, value, bytes, *producer));
    ACTPAGE_ASSERT_OK(device.record_event(*produced, *producer));
    ACTPAGE_ASSERT_OK(device.stream_wait_event(*consumer, *produced));
    ACTPAGE_ASSERT_OK(device.copy_to_host(*host, *va, bytes, *consumer));
    ACTPAGE_ASSERT_OK(device.record_event(*consumed, *consumer));
    ACTPAGE_ASSERT_OK(device.synchronize_event(*consumed));
    ACTPAGE_EXPECT_OK(device.query_event(*consumed));
    const auto* data = static_cast<const std::uint8_t*>(*host);
    const std::size_t wrong =
        static_cast<std::size_t>(std::count_if(data, data + bytes, [value](std::uint8_t b) { return b != value; }));
    EXPECT_EQ(wrong, 0u) << "round " << round;
    // The producer must not overwrite the buffer before the consumer has read it.
    ACTPAGE_ASSERT_OK(device.stream_wait_event(*producer, *consumed));
  }

  this->drain(*producer);
  ACTPAGE_EXPECT_OK(device.free_pinned(*host));
  ACTPAGE_EXPECT_OK(device.destroy_event(*produced));
  ACTPAGE_EXPECT_OK(device.destroy_event(*consumed));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*producer));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*consumer));
  ACTPAGE_EXPECT_OK(device.unmap(*va, bytes));
  ACTPAGE_EXPECT_OK(device.release_physical(*handle));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, bytes));
}

TYPED_TEST_P(DeviceContractTest, NeverRecordedEventIsComplete) {
  Device& device = *this->device_;
  auto event = device.create_event();
  ACTPAGE_ASSERT_OK(event);
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  ACTPAGE_EXPECT_OK(device.query_event(*event));
  ACTPAGE_EXPECT_OK(device.synchronize_event(*event));
  ACTPAGE_EXPECT_OK(device.stream_wait_event(*stream, *event));
  this->drain(*stream);  // would hang if the wait were not a no-op
  auto capturing = device.is_capturing(*stream);
  ACTPAGE_ASSERT_OK(capturing);
  EXPECT_FALSE(*capturing);
  ACTPAGE_EXPECT_OK(device.destroy_event(*event));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
}

// What "given back" means: free device memory, as cudaMemGetInfo reports it, rises by what was
// unmapped and released.
TYPED_TEST_P(DeviceContractTest, MemInfoFreeBytesRiseAfterUnmapAndRelease) {
  Device& device = *this->device_;
  const std::size_t bytes = 256 * MiB;
  const std::uint64_t slack = 16 * MiB;  // the driver's own bookkeeping may move a little
  auto before = device.mem_info();
  ACTPAGE_ASSERT_OK(before);
  EXPECT_GT(before->total_bytes, 0u);
  EXPECT_LE(before->free_bytes, before->total_bytes);
  if (before->free_bytes < bytes + slack) GTEST_SKIP() << "not enough free device memory";

  auto va = device.reserve(bytes);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device.create_physical(bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *handle));
  auto held = device.mem_info();
  ACTPAGE_ASSERT_OK(held);
  EXPECT_LE(held->free_bytes + bytes, before->free_bytes + slack)
      << "creating " << bytes << " bytes did not lower free memory enough";

  ACTPAGE_ASSERT_OK(device.unmap(*va, bytes));
  ACTPAGE_ASSERT_OK(device.release_physical(*handle));
  auto after = device.mem_info();
  ACTPAGE_ASSERT_OK(after);
  EXPECT_GE(after->free_bytes + slack, held->free_bytes + bytes)
      << "unmap + release gave back " << (after->free_bytes - held->free_bytes) << " bytes";
  ACTPAGE_EXPECT_OK(device.unreserve(*va, bytes));
}

TYPED_TEST_P(DeviceContractTest, PinnedMemoryIsUsableHostMemory) {
  Device& device = *this->device_;
  auto pinned = device.alloc_pinned(3 * MiB + 100);
  ACTPAGE_ASSERT_OK(pinned);
  ASSERT_NE(*pinned, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*pinned) % 256, 0u);
  std::memset(*pinned, 0x5a, 3 * MiB + 100);
  EXPECT_EQ(static_cast<const std::uint8_t*>(*pinned)[3 * MiB + 99], 0x5a);
  ACTPAGE_EXPECT_OK(device.free_pinned(*pinned));
}

TYPED_TEST_P(DeviceContractTest, CopyWithinDeviceCopiesBetweenAddresses) {
  Device& device = *this->device_;
  const std::size_t bytes = this->granularity_;
  auto va = device.reserve(2 * bytes);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device.create_physical(2 * bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device.map(*va, 2 * bytes, *handle));
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  auto pinned = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(pinned);
  std::memset(*pinned, 0x3c, bytes);
  ACTPAGE_ASSERT_OK(device.copy_to_device(*va, *pinned, bytes, *stream));
  ACTPAGE_ASSERT_OK(device.copy_within_device(*va + bytes, *va, bytes, *stream));
  this->drain(*stream);  // the copy from `pinned` has run: it may be overwritten now
  std::memset(*pinned, 0, bytes);
  ACTPAGE_ASSERT_OK(device.copy_to_host(*pinned, *va + bytes, bytes, *stream));
  this->drain(*stream);
  EXPECT_EQ(static_cast<const std::uint8_t*>(*pinned)[0], 0x3c);
  EXPECT_EQ(static_cast<const std::uint8_t*>(*pinned)[bytes - 1], 0x3c);
  ACTPAGE_EXPECT_OK(device.free_pinned(*pinned));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
  ACTPAGE_EXPECT_OK(device.unmap(*va, 2 * bytes));
  ACTPAGE_EXPECT_OK(device.release_physical(*handle));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, 2 * bytes));
}

TYPED_TEST_P(DeviceContractTest, GateHoldsLaterWorkUntilReleased) {
  Device& device = *this->device_;
  const std::size_t bytes = this->granularity_;
  auto va = device.reserve(bytes);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device.create_physical(bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *handle));
  auto stream = device.create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  auto pinned = device.alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(pinned);
  auto before = device.create_event();
  auto after = device.create_event();
  ACTPAGE_ASSERT_OK(before);
  ACTPAGE_ASSERT_OK(after);

  std::memset(*pinned, 0x11, bytes);
  ACTPAGE_ASSERT_OK(device.copy_to_device(*va, *pinned, bytes, *stream));
  ACTPAGE_ASSERT_OK(device.record_event(*before, *stream));
  auto gate = device.hold_stream(*stream);
  ACTPAGE_ASSERT_OK(gate);
  ACTPAGE_ASSERT_OK(device.fill(*va, 0x22, bytes, *stream));  // after the gate
  ACTPAGE_ASSERT_OK(device.record_event(*after, *stream));
  ACTPAGE_ASSERT_OK(device.wait_stream_held(*gate));
  // Held: the work before the gate is done, the work after it has not run.
  ACTPAGE_EXPECT_OK(device.query_event(*before));
  EXPECT_EQ(device.query_event(*after).code(), ErrorCode::not_ready);
  // While held, the mapping may change under the stream: remap the same memory.
  ACTPAGE_ASSERT_OK(device.unmap(*va, bytes));
  ACTPAGE_ASSERT_OK(device.map(*va, bytes, *handle));
  ACTPAGE_ASSERT_OK(device.release_stream(*gate));
  ACTPAGE_ASSERT_OK(device.synchronize_event(*after));
  ACTPAGE_ASSERT_OK(device.copy_to_host(*pinned, *va, bytes, *stream));
  this->drain(*stream);
  EXPECT_EQ(static_cast<const std::uint8_t*>(*pinned)[bytes / 2], 0x22);

  // Many gates in a row (slots are reused once a stream went through).
  for (int i = 0; i < 2000; ++i) {
    auto again = device.hold_stream(*stream);
    ACTPAGE_ASSERT_OK(again);
    ACTPAGE_ASSERT_OK(device.wait_stream_held(*again));
    ACTPAGE_ASSERT_OK(device.release_stream(*again));
  }
  this->drain(*stream);

  ACTPAGE_EXPECT_OK(device.destroy_event(*before));
  ACTPAGE_EXPECT_OK(device.destroy_event(*after));
  ACTPAGE_EXPECT_OK(device.free_pinned(*pinned));
  ACTPAGE_EXPECT_OK(device.destroy_stream(*stream));
  ACTPAGE_EXPECT_OK(device.unmap(*va, bytes));
  ACTPAGE_EXPECT_OK(device.release_physical(*handle));
  ACTPAGE_EXPECT_OK(device.unreserve(*va, bytes));
}

REGISTER_TYPED_TEST_SUITE_P(DeviceContractTest, GranularityIsAPowerOfTwo, ReservationsAreAlignedAndDisjoint,
                            CopiesRoundTripThroughMappedMemory, FillAndCopySpanAdjacentMappings,
                            MapRejectsMisalignedAndOverlappingRanges, HostPhysicalMemoryServesTheSameAddress,
                            StreamWaitEventOrdersTwoStreams, NeverRecordedEventIsComplete,
                            MemInfoFreeBytesRiseAfterUnmapAndRelease, PinnedMemoryIsUsableHostMemory,
                            CopyWithinDeviceCopiesBetweenAddresses, GateHoldsLaterWorkUntilReleased);

}  // namespace actpage::testing
