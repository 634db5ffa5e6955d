// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014): a bijective 64-bit mixer that spreads nearby
// inputs (seed 1 and 2, step 0 and 1) over unrelated values, for deriving
// generator seeds from (seed, epoch, step, row, ...).
#ifndef LORAPLEX_CORE_COMMON_SPLIT_MIX_H_
#define LORAPLEX_CORE_COMMON_SPLIT_MIX_H_

#include <cstdint>

namespace loraplex {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_SPLIT_MIX_H_
