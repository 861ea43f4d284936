// The blocked rule for a row's duplicate gradients (cuda/row/grad_sum.h), written here as the
// header states it and independently of the library's evaluation: up to 32 rows summed one after
// the other, column by column; more, as the blocked sums of consecutive blocks of 32.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace embstore_test {

using GradRows = std::vector<std::vector<float>>;

inline std::vector<float> one_by_one_sum(const GradRows& x) {
  std::vector<float> s = x.at(0);
  for (size_t m = 1; m < x.size(); ++m) {
    for (size_t c = 0; c < s.size(); ++c) s[c] = s[c] + x[m][c];
  }
  return s;
}

inline std::vector<float> blocked_sum(const GradRows& x) {
  constexpr size_t kFanIn = 32;
  if (x.size() <= kFanIn) return one_by_one_sum(x);
  GradRows blocks;
  for (size_t b = 0; b < x.size(); b += kFanIn) {
    blocks.push_back(
        one_by_one_sum(GradRows(x.begin() + b, x.begin() + std::min(x.size(), b + kFanIn))));
  }
  return blocked_sum(blocks);
}

}  // namespace embstore_test
