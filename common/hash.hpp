// 64-bit bit mixers usable on host and card. Different consumers use different mixers so that
// their choices are independent: the card hash table's probe start must not correlate with
// the owner card (hash % cards) or the host-tier shard.
#pragma once

#include <cstdint>

#include "common/macros.hpp"

namespace gpubox {

// splitmix64 finalizer (Steele et al.): a bijection on uint64.
GPUBOX_HD GPUBOX_FORCEINLINE uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Murmur3 fmix64: a second, independent bijection.
GPUBOX_HD GPUBOX_FORCEINLINE uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Seeded hash of a key (embedding init, sampling): mix of key and seed.
GPUBOX_HD GPUBOX_FORCEINLINE uint64_t hash_with_seed(uint64_t key, uint64_t seed) {
  return mix64(key ^ mix64(seed + 0x9e3779b97f4a7c15ULL));
}

// Owner card of a key among `total_cards` (ARCHITECTURE §1: owner = hash(key) % total_cards).
GPUBOX_HD GPUBOX_FORCEINLINE int owner_card(uint64_t key, int total_cards) {
  return static_cast<int>(fmix64(key ^ 0x2545f4914f6cdd1dULL) % static_cast<uint64_t>(total_cards));
}

// Host-tier shard of a key among `shards` (in-process shards and gpubox_server endpoints).
GPUBOX_HD GPUBOX_FORCEINLINE uint32_t host_shard(uint64_t key, uint32_t shards) {
  return static_cast<uint32_t>(mix64(key ^ 0x6a09e667f3bcc909ULL) % shards);
}

// Uniform float in [0, 1) from 64 random bits.
GPUBOX_HD GPUBOX_FORCEINLINE float unit_float(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

}  // namespace gpubox
