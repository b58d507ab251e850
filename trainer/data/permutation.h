// A seeded pseudo-random permutation of [0, n) that costs O(1) memory and O(1) time per element:
// the data pipeline shuffles documents and samples with it instead of materializing index arrays,
// so a dataset of a billion documents needs no gigabytes of shuffle indices.
//
// It is a Feistel network over the smallest power of two >= n (alternately XOR-ing a keyed hash of
// one half of the bits into the other, 8 rounds), with cycle-walking: an output >= n is encrypted
// again until it lands in [0, n). Every round is invertible, so the whole map is a bijection.
//
// Rule a reader could get wrong: the order is part of the data's reproducibility contract (a
// resumed run must see the samples it would have seen). Changing the rounds, the hash or the key
// derivation changes every run's data order: don't, without a format note in docs/data.md.
#pragma once

#include <cstdint>

namespace llmtrain::trainer {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A key from a seed and labels (which dataset, which epoch, what is shuffled).
inline uint64_t derive_key(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
}

class Permutation {
 public:
  Permutation() = default;
  Permutation(uint64_t n, uint64_t key) : n_(n) {
    int bits = 2;
    while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
    left_bits_ = bits / 2;
    right_bits_ = bits - left_bits_;
    left_mask_ = (uint64_t(1) << left_bits_) - 1;
    right_mask_ = (uint64_t(1) << right_bits_) - 1;
    for (int r = 0; r < kRounds; ++r) keys_[r] = derive_key(key, 0x7065726d /* "perm" */, r);
  }
  uint64_t size() const { return n_; }
  // The image of i (i < size()).
  uint64_t operator()(uint64_t i) const {
    if (n_ <= 1) return i;
    uint64_t x = encrypt(i);
    while (x >= n_) x = encrypt(x);
    return x;
  }

 private:
  static constexpr int kRounds = 8;
  uint64_t encrypt(uint64_t x) const {
    uint64_t l = x >> right_bits_, r = x & right_mask_;
    for (int k = 0; k < kRounds; ++k) {
      if (k % 2 == 0)
        l ^= splitmix64(r ^ keys_[k]) & left_mask_;
      else
        r ^= splitmix64(l ^ keys_[k]) & right_mask_;
    }
    return (l << right_bits_) | r;
  }
  uint64_t n_ = 0;
  int left_bits_ = 0, right_bits_ = 0;
  uint64_t left_mask_ = 0, right_mask_ = 0;
  uint64_t keys_[kRounds] = {};
};

}  // namespace llmtrain::trainer
