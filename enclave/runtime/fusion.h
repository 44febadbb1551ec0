// Load-time graph rewrites that replace decomposed subgraphs exporters emit with one fused node:
//   HardSwish:  Add(x,3) -> Clip(0,6) -> Mul(x,.) -> Div(.,6)            (Paddle hardswish)
//   Gelu:       Div(x,sqrt 2) -> Erf -> Add(.,1) -> Mul(x,.) -> Mul(.,0.5)  (PyTorch erf GELU)
//   LayerNorm:  ReduceMean -> Sub -> Pow 2 -> ReduceMean -> Add eps -> Sqrt -> Div
//               [-> Mul gamma -> Add beta]                               (LayerNorm on axis -1)
// A pattern is replaced only when its intermediate values have no other readers and are not
// graph outputs, and its constants have the exact values the formula needs, so the rewritten
// graph computes the same function. Fused nodes carry the reserved domain kFusedDomain; the
// compiler accepts that domain only for nodes this rewrite created.
// Threading: pure functions.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "onnx/onnx_pb.h"

namespace cloister::runtime {

inline constexpr char kFusedDomain[] = "cloister.fused";

struct FusedNode {
  // The nodes the fused node replaces, in order: compiled instead when the fused kernel cannot
  // take the node (for example an element type it does not support).
  std::vector<onnx::NodeProto> originals;
  // Every value the originals read from outside the pattern (ordering dependencies).
  std::vector<std::string> reads;
};

struct RewriteResult {
  onnx::GraphProto graph;
  std::unordered_map<int, FusedNode> fused;  // by index in graph.node()
};

RewriteResult FuseDecomposedOperators(const onnx::GraphProto& graph, int opset);

}  // namespace cloister::runtime
