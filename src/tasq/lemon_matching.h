// tasq/lemon_matching.h — minimum-weight perfect matching on a complete graph
// through LEMON (internal). LEMON 1.3's maps use std::allocator members that
// C++20 removed, so lemon_matching.cpp alone is compiled as C++17
// (src/CMakeLists.txt); this interface uses only std::vector.
#pragma once

#include <vector>

namespace ratekv::tasq::detail {

/// Minimum-weight perfect matching of the complete graph on n nodes (n even
/// ≥ 2) with integer edge weights w[i·n + j] (i < j read). Returns mate[i].
/// Returns an empty vector when LEMON finds no perfect matching.
std::vector<int> lemon_min_weight_perfect_matching(int n, const std::vector<long long>& w);

}  // namespace ratekv::tasq::detail
