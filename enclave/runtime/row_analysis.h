// Load-time proof that a graph treats the rows of its inputs independently: that running it
// once over several requests' inputs concatenated along axis 0 gives every request exactly the
// rows it would get running alone. The enclave coalesces a tenant's requests into one run only
// for models that pass (batch_runner.h); a model that mixes rows (a softmax or a normalisation
// over axis 0, a reshape that folds rows together, a recurrent state whose batch axis is not
// axis 0) would otherwise answer each request with values that depend on the tenant's other
// requests in the same batch.
//
// The analysis follows what coalescing does to every value of the compiled graph:
//   same       the value is identical in a coalesced run and in each request's own run:
//              constants, and values computed only from constants and from the dimensions other
//              than the rows (coalesced requests agree on those);
//   rows(a)    axis a holds the rows: the coalesced value is the requests' own values
//              concatenated along a;
//   shape      a small integer vector (from Shape, Gather, Concat ...) whose elements are known
//              numbers, "same" numbers or the row count itself, as exporters build reshape
//              targets;
//   mixed      anything else.
// Graph inputs start as rows(0). Every operator has a rule that maps its inputs' states to its
// outputs' (a node whose inputs are all "same" gives "same"); an operator without a rule, or a
// rule that finds the rows mixed, makes its outputs mixed. The graph passes when every output is
// rows(0). The rules are conservative: a model may be refused that is in fact row-independent
// (its requests then run one by one, correct but slower), never the other way round.
//
// Threading: a pure function. Ownership: reads the graph and infos for the duration of the call.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace onnx {
class GraphProto;
}

namespace cloister::runtime {

struct ValueInfo;  // kernel.h

struct RowIndependence {
  bool independent = false;
  // When not independent, why, naming the node or output, for example
  // "node 'probs' (Softmax) normalizes over the row axis".
  std::string reason;
};

// `graph` is a main graph as compiled (fused nodes of kFusedDomain allowed) and `order` its
// node indices as the compiler ran them (every node after the producers of what it reads);
// `info` returns the inferred type, shape and constant value of a value by name, or nullptr when
// there is none. `opset` is the default domain's version.
RowIndependence AnalyzeRowIndependence(
    const onnx::GraphProto& graph, const std::vector<int>& order, int opset,
    const std::function<const ValueInfo*(const std::string&)>& info);

}  // namespace cloister::runtime
