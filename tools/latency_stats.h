// The latency summaries the serving benchmarks print and write: percentiles of a list of durations.
#pragma once

#include <algorithm>
#include <vector>

#include "nlohmann/json.hpp"

namespace inferd {

// The p-th percentile (0..100) of v, interpolated between its two nearest ranks; 0 for an empty list.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

// Mean, median, p90 and p99 of durations given in seconds, in milliseconds.
inline nlohmann::json LatencyStats(const std::vector<double>& seconds) {
  std::vector<double> ms;
  double mean = 0;
  for (double s : seconds) {
    ms.push_back(1e3 * s);
    mean += 1e3 * s;
  }
  if (!ms.empty()) mean /= ms.size();
  return {{"mean_ms", mean},
          {"median_ms", Percentile(ms, 50)},
          {"p90_ms", Percentile(ms, 90)},
          {"p99_ms", Percentile(ms, 99)}};
}

}  // namespace inferd
