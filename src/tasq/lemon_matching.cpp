// LEMON's MaxWeightedPerfectMatching on negated weights (tasq/lemon_matching.h).
// Compiled as C++17 (see the header).
#include "tasq/lemon_matching.h"

#include <lemon/list_graph.h>
#include <lemon/matching.h>

namespace ratekv::tasq::detail {

std::vector<int> lemon_min_weight_perfect_matching(int n, const std::vector<long long>& w) {
  lemon::ListGraph g;
  std::vector<lemon::ListGraph::Node> nodes;
  for (int i = 0; i < n; ++i) nodes.push_back(g.addNode());
  lemon::ListGraph::EdgeMap<long long> weight(g);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) weight[g.addEdge(nodes[i], nodes[j])] = -w[static_cast<size_t>(i) * n + j];
  lemon::MaxWeightedPerfectMatching<lemon::ListGraph, lemon::ListGraph::EdgeMap<long long>> m(g, weight);
  if (!m.run()) return {};
  std::vector<int> mate(n, -1);
  for (int i = 0; i < n; ++i) mate[i] = g.id(m.mate(nodes[i]));
  return mate;
}

}  // namespace ratekv::tasq::detail
