// Range predicates shared by config validation, so every config spells a
// range check (and its NaN handling) the same way.
#ifndef LORAPLEX_CORE_COMMON_NUMBER_CHECKS_H_
#define LORAPLEX_CORE_COMMON_NUMBER_CHECKS_H_

#include <cmath>

namespace loraplex {

// Finite and >= 0 (false for NaN).
inline bool IsFiniteNonNegative(double value) {
  return std::isfinite(value) && value >= 0.0;
}

// Finite and > 0 (false for NaN).
inline bool IsFinitePositive(double value) {
  return std::isfinite(value) && value > 0.0;
}

// In [0, 1) (false for NaN).
inline bool InUnitInterval(double value) { return value >= 0.0 && value < 1.0; }

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_NUMBER_CHECKS_H_
