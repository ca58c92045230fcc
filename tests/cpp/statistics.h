// Goodness-of-fit helpers for the statistical tests. Every test draws from a
// fixed seed, so results are deterministic; the bounds are generous (about
// five standard deviations) so that only a real bias fails them.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace torch_shards::core::stats {

// Pearson's statistic of observed counts against expected probabilities
// (cells with probability 0 are skipped; the caller checks them separately).
inline double chi_square(const std::vector<int64_t>& observed, const std::vector<double>& probabilities) {
  int64_t total = 0;
  for (int64_t count : observed) total += count;
  double statistic = 0.0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (probabilities[i] <= 0.0) continue;
    const double expected = probabilities[i] * static_cast<double>(total);
    const double difference = static_cast<double>(observed[i]) - expected;
    statistic += difference * difference / expected;
  }
  return statistic;
}

// The chi-square quantile z standard deviations above the mean, by the
// Wilson-Hilferty approximation; z = 5 is exceeded with probability ~3e-7.
inline double chi_square_bound(int64_t degrees_of_freedom, double z = 5.0) {
  const double k = static_cast<double>(degrees_of_freedom);
  const double s = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - s + z * std::sqrt(s), 3.0);
}

inline std::vector<double> normalised(const std::vector<double>& weights) {
  double total = 0.0;
  for (double w : weights) total += w;
  std::vector<double> out;
  out.reserve(weights.size());
  for (double w : weights) out.push_back(w / total);
  return out;
}

}  // namespace torch_shards::core::stats
