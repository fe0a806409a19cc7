// The host pool tests' helpers: the slab size, a pool's config with its warnings caught, block patterns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/units.hpp"
#include "hostpool/host_pool.hpp"

namespace actpage::hostpool::testing {

inline constexpr std::size_t kSlab = 64 * KiB;

// Counts the pool's warnings instead of printing them.
struct WarningLog {
  std::mutex mutex;
  std::vector<std::string> messages;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(message);
    };
  }
  std::vector<std::string> all() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages;
  }
};

inline HostPoolConfig pool_config(std::uint64_t budget, std::uint64_t prealloc, WarningLog& log,
                                  std::uint64_t slab = kSlab) {
  HostPoolConfig config;
  config.budget_bytes = budget;
  config.slab_bytes = slab;
  config.prealloc_bytes = prealloc;
  config.warn = log.sink();
  return config;
}

inline std::uintptr_t address(const HostPiece& piece) { return reinterpret_cast<std::uintptr_t>(piece.pointer); }
inline std::uintptr_t address(const HostBlock& block) { return address(block.pieces.front()); }

// The byte a block written with `seed` holds at `offset`: depends on the offset, so that pieces
// put in the wrong order, or a copy cut at the wrong place, show.
inline std::uint8_t pattern_byte(std::uint8_t seed, std::size_t offset) {
  return static_cast<std::uint8_t>(seed + offset * 31 + offset / 251);
}

// Writes the pattern through contiguous_at(), a run at a time, as the engine's copies do.
inline void write_pattern(const HostBlock& block, std::uint8_t seed) {
  for (std::size_t offset = 0; offset < block.bytes;) {
    const auto [run, contiguous] = block.contiguous_at(offset);
    for (std::size_t i = 0; i < contiguous; ++i) run[i] = std::byte{pattern_byte(seed, offset + i)};
    offset += contiguous;
  }
}

// Reads it back piece by piece: the pieces, one after the other, are the block.
inline bool holds_pattern(const HostBlock& block, std::uint8_t seed) {
  std::size_t offset = 0;
  for (const HostPiece& piece : block.pieces) {
    const auto* bytes = static_cast<const std::uint8_t*>(piece.pointer);
    for (std::size_t i = 0; i < piece.bytes; ++i) {
      if (bytes[i] != pattern_byte(seed, offset + i)) return false;
    }
    offset += piece.bytes;
  }
  return offset == block.bytes;
}

inline std::size_t sum_of_pieces(const HostBlock& block) {
  std::size_t bytes = 0;
  for (const HostPiece& piece : block.pieces) bytes += piece.bytes;
  return bytes;
}

// 88 MiB activations in 256 MiB slabs, scaled down: a slab holds two whole, and the 80 MiB left in
// each are enough for a fifth block between them.
inline constexpr std::size_t kActivation = kSlab * 88 / 256;

}  // namespace actpage::hostpool::testing
