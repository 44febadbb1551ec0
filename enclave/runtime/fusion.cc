#include "enclave/runtime/fusion.h"

#include <cmath>
#include <optional>
#include <unordered_set>

#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/onnx_tensor.h"
#include "enclave/runtime/plan.h"

namespace cloister::runtime {
namespace {

class PatternMatcher {
 public:
  PatternMatcher(const onnx::GraphProto& graph, int opset) : graph_(graph), opset_(opset) {
    for (const auto& initializer : graph.initializer())
      constants_[initializer.name()] = &initializer;
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& node = graph.node(i);
      if (node.op_type() == "Constant" && node.domain().empty() && node.output_size() == 1 &&
          node.attribute_size() == 1 && node.attribute(0).name() == "value") {
        constants_[node.output(0)] = &node.attribute(0).t();
      }
      for (const std::string& output : node.output()) producer_[output] = i;
      for (const std::string& input : node.input()) {
        if (!input.empty()) consumers_[input].push_back(i);
      }
      for (const auto& attribute : node.attribute()) {
        if (attribute.has_g() || attribute.graphs_size() > 0) {
          // Values read by subgraphs count as extra readers.
          std::vector<const onnx::GraphProto*> subgraphs;
          if (attribute.has_g()) subgraphs.push_back(&attribute.g());
          for (const auto& g : attribute.graphs()) subgraphs.push_back(&g);
          for (const auto* subgraph : subgraphs) {
            for (const std::string& name : FreeVariables(*subgraph)) consumers_[name].push_back(i);
          }
        }
      }
    }
    for (const auto& output : graph.output()) graph_outputs_.insert(output.name());
  }

  RewriteResult Run() {
    std::vector<bool> removed(graph_.node_size(), false);
    std::vector<std::optional<std::pair<onnx::NodeProto, FusedNode>>> replacement(
        graph_.node_size());
    for (int i = 0; i < graph_.node_size(); ++i) {
      if (removed[i]) continue;
      std::vector<int> members;
      std::optional<onnx::NodeProto> fused = MatchHardSwish(i, members);
      if (!fused) fused = MatchGelu(i, members);
      if (!fused) fused = MatchLayerNorm(i, members);
      if (!fused) continue;
      bool overlap = false;
      for (int m : members) overlap = overlap || removed[m] || replacement[m].has_value();
      if (overlap) continue;
      FusedNode info;
      std::unordered_set<std::string> internal, seen;
      for (int m : members) {
        for (const auto& output : graph_.node(m).output()) internal.insert(output);
      }
      for (int m : members) {
        info.originals.push_back(graph_.node(m));
        for (const auto& input : graph_.node(m).input()) {
          if (!input.empty() && !internal.count(input) && seen.insert(input).second) {
            info.reads.push_back(input);
          }
        }
      }
      for (int m : members) removed[m] = true;
      removed[i] = false;
      replacement[i] = std::make_pair(std::move(*fused), std::move(info));
    }
    RewriteResult result;
    result.graph = graph_;
    result.graph.clear_node();
    for (int i = 0; i < graph_.node_size(); ++i) {
      if (replacement[i]) {
        result.fused[result.graph.node_size()] = std::move(replacement[i]->second);
        *result.graph.add_node() = std::move(replacement[i]->first);
      } else if (!removed[i]) {
        *result.graph.add_node() = graph_.node(i);
      }
    }
    for (auto& initializer : extra_initializers_) *result.graph.add_initializer() = initializer;
    return result;
  }

 private:
  const onnx::NodeProto& node(int i) const { return graph_.node(i); }

  bool Is(int i, const char* op) const {
    return node(i).op_type() == op && (node(i).domain().empty() || node(i).domain() == "ai.onnx");
  }

  // The single node that reads `name`, when nothing else (including graph outputs) does.
  std::optional<int> SoleConsumer(const std::string& name) const {
    if (graph_outputs_.count(name)) return std::nullopt;
    auto it = consumers_.find(name);
    if (it == consumers_.end() || it->second.size() != 1) return std::nullopt;
    return it->second[0];
  }

  std::optional<double> Scalar(const std::string& name) const {
    auto it = constants_.find(name);
    if (it == constants_.end()) return std::nullopt;
    auto tensor = TensorFromProto(*it->second);
    if (!tensor.ok() || tensor->count() != 1) return std::nullopt;
    std::optional<double> value;
    ElementTypes<float, double, int32_t, int64_t>::Dispatch(tensor->dtype(), [&](auto tag) {
      using T = decltype(tag);
      value = static_cast<double>(*tensor->data<T>());
    });
    return value;
  }
  bool IsConstant(const std::string& name) const { return constants_.count(name) > 0; }
  bool ScalarIs(const std::string& name, double value, double tolerance = 0) const {
    auto v = Scalar(name);
    return v.has_value() && std::fabs(*v - value) <= tolerance;
  }

  // For a binary node with inputs {x, c}: the other input when one is a scalar constant equal to
  // `value`; `either` allows the constant on both sides.
  std::optional<std::string> OtherThanScalar(int i, double value, double tolerance,
                                             bool either) const {
    const auto& n = node(i);
    if (n.input_size() != 2 || n.output_size() != 1) return std::nullopt;
    if (ScalarIs(n.input(1), value, tolerance)) return n.input(0);
    if (either && ScalarIs(n.input(0), value, tolerance)) return n.input(1);
    return std::nullopt;
  }

  onnx::NodeProto MakeNode(const std::string& op, std::vector<std::string> inputs,
                           const std::string& output, const std::string& name) const {
    onnx::NodeProto fused;
    fused.set_op_type(op);
    fused.set_domain(kFusedDomain);
    fused.set_name(name.empty() ? output : name);
    for (auto& input : inputs) fused.add_input(input);
    fused.add_output(output);
    return fused;
  }

  // Add(x,3) -> Clip(0,6) -> Mul(x,.) -> Div(.,6) | Mul(.,1/6)
  std::optional<onnx::NodeProto> MatchHardSwish(int i, std::vector<int>& members) {
    if (!Is(i, "Add")) return std::nullopt;
    auto x = OtherThanScalar(i, 3.0, 0, true);
    if (!x) return std::nullopt;
    auto j = SoleConsumer(node(i).output(0));
    if (!j || !Is(*j, "Clip") || node(*j).input(0) != node(i).output(0)) return std::nullopt;
    if (!ClipIsZeroToSix(*j)) return std::nullopt;
    auto k = SoleConsumer(node(*j).output(0));
    if (!k || !Is(*k, "Mul") || node(*k).input_size() != 2) return std::nullopt;
    const auto& mul = node(*k);
    if (!((mul.input(0) == *x && mul.input(1) == node(*j).output(0)) ||
          (mul.input(1) == *x && mul.input(0) == node(*j).output(0)))) {
      return std::nullopt;
    }
    auto l = SoleConsumer(mul.output(0));
    if (!l) return std::nullopt;
    bool divides =
        Is(*l, "Div") && node(*l).input(0) == mul.output(0) && ScalarIs(node(*l).input(1), 6.0);
    bool multiplies = Is(*l, "Mul") && OtherThanScalar(*l, 1.0 / 6.0, 1e-7, true) ==
                                           std::optional<std::string>(mul.output(0));
    if (!divides && !multiplies) return std::nullopt;
    members = {i, *j, *k, *l};
    return MakeNode("HardSwish", {*x}, node(*l).output(0), node(*l).name());
  }

  bool ClipIsZeroToSix(int j) const {
    const auto& clip = node(j);
    if (opset_ < 11) {
      double low = -1, high = -1;
      for (const auto& attribute : clip.attribute()) {
        if (attribute.name() == "min") low = attribute.f();
        if (attribute.name() == "max") high = attribute.f();
      }
      return low == 0.0 && high == 6.0 && clip.input_size() == 1;
    }
    return clip.input_size() == 3 && ScalarIs(clip.input(1), 0.0) && ScalarIs(clip.input(2), 6.0);
  }

  // Div(x,sqrt2) | Mul(x,1/sqrt2) -> Erf -> Add(.,1) -> Mul(x,.) -> Mul(.,0.5)
  std::optional<onnx::NodeProto> MatchGelu(int i, std::vector<int>& members) {
    std::optional<std::string> x;
    if (Is(i, "Div")) {
      if (node(i).input_size() == 2 && ScalarIs(node(i).input(1), std::sqrt(2.0), 1e-5)) {
        x = node(i).input(0);
      }
    } else if (Is(i, "Mul")) {
      x = OtherThanScalar(i, std::sqrt(0.5), 1e-5, true);
    }
    if (!x) return std::nullopt;
    auto j = SoleConsumer(node(i).output(0));
    if (!j || !Is(*j, "Erf")) return std::nullopt;
    auto k = SoleConsumer(node(*j).output(0));
    if (!k || !Is(*k, "Add") ||
        OtherThanScalar(*k, 1.0, 0, true) != std::optional<std::string>(node(*j).output(0))) {
      return std::nullopt;
    }
    auto l = SoleConsumer(node(*k).output(0));
    if (!l || !Is(*l, "Mul") || node(*l).input_size() != 2) return std::nullopt;
    const auto& mul = node(*l);
    if (!((mul.input(0) == *x && mul.input(1) == node(*k).output(0)) ||
          (mul.input(1) == *x && mul.input(0) == node(*k).output(0)))) {
      return std::nullopt;
    }
    auto m = SoleConsumer(mul.output(0));
    if (!m || !Is(*m, "Mul") ||
        OtherThanScalar(*m, 0.5, 0, true) != std::optional<std::string>(mul.output(0))) {
      return std::nullopt;
    }
    members = {i, *j, *k, *l, *m};
    return MakeNode("Gelu", {*x}, node(*m).output(0), node(*m).name());
  }

  // ReduceMean over the last axis (keepdims) of `i`; returns its data input.
  std::optional<std::string> LastAxisMean(int i) const {
    if (!Is(i, "ReduceMean")) return std::nullopt;
    const auto& n = node(i);
    std::vector<int64_t> axes;
    for (const auto& attribute : n.attribute()) {
      if (attribute.name() == "keepdims" && attribute.i() != 1) return std::nullopt;
      if (attribute.name() == "axes") axes.assign(attribute.ints().begin(), attribute.ints().end());
      if (attribute.name() == "noop_with_empty_axes") return std::nullopt;
    }
    if (opset_ >= 18) {
      if (n.input_size() != 2 || !ScalarIs(n.input(1), -1.0)) return std::nullopt;
    } else if (axes != std::vector<int64_t>{-1} || n.input_size() != 1) {
      return std::nullopt;
    }
    return n.input(0);
  }

  // ReduceMean -> Sub -> Pow(.,2) -> ReduceMean -> Add(.,eps) -> Sqrt -> Div [-> Mul g -> Add b]
  std::optional<onnx::NodeProto> MatchLayerNorm(int i, std::vector<int>& members) {
    auto x = LastAxisMean(i);
    if (!x) return std::nullopt;
    auto j = SoleConsumer(node(i).output(0));
    if (!j || !Is(*j, "Sub") || node(*j).input(0) != *x || node(*j).input(1) != node(i).output(0)) {
      return std::nullopt;
    }
    const std::string& centered = node(*j).output(0);
    if (graph_outputs_.count(centered)) return std::nullopt;
    auto readers = consumers_.find(centered);
    if (readers == consumers_.end() || readers->second.size() != 2) return std::nullopt;
    int pow = readers->second[0], div = readers->second[1];
    if (Is(div, "Pow")) std::swap(pow, div);
    if (!Is(pow, "Pow") || node(pow).input(0) != centered || !ScalarIs(node(pow).input(1), 2.0)) {
      return std::nullopt;
    }
    auto variance = SoleConsumer(node(pow).output(0));
    if (!variance || LastAxisMean(*variance) != std::optional<std::string>(node(pow).output(0))) {
      return std::nullopt;
    }
    auto add = SoleConsumer(node(*variance).output(0));
    if (!add || !Is(*add, "Add") || node(*add).input_size() != 2) return std::nullopt;
    std::string epsilon_name = node(*add).input(1);
    if (node(*add).input(1) == node(*variance).output(0)) epsilon_name = node(*add).input(0);
    auto epsilon = Scalar(epsilon_name);
    if (!epsilon || *epsilon < 0 || *epsilon > 1) return std::nullopt;
    auto sqrt = SoleConsumer(node(*add).output(0));
    if (!sqrt || !Is(*sqrt, "Sqrt")) return std::nullopt;
    auto division = SoleConsumer(node(*sqrt).output(0));
    if (!division || *division != div || !Is(div, "Div") || node(div).input(0) != centered ||
        node(div).input(1) != node(*sqrt).output(0)) {
      return std::nullopt;
    }
    members = {i, *j, pow, *variance, *add, *sqrt, div};
    std::string output = node(div).output(0);
    std::string scale, bias;
    if (auto mul = SoleConsumer(output); mul && Is(*mul, "Mul") && node(*mul).input_size() == 2) {
      const auto& m = node(*mul);
      const std::string other = m.input(0) == output ? m.input(1) : m.input(0);
      if (IsVector(other)) {
        scale = other;
        members.push_back(*mul);
        output = m.output(0);
        if (auto plus = SoleConsumer(output);
            plus && Is(*plus, "Add") && node(*plus).input_size() == 2) {
          const auto& a = node(*plus);
          const std::string shift = a.input(0) == output ? a.input(1) : a.input(0);
          if (IsVector(shift)) {
            bias = shift;
            members.push_back(*plus);
            output = a.output(0);
          }
        }
      }
    }
    if (scale.empty()) {
      scale = "cloister.fused.one";
      if (extra_initializers_.empty()) {
        onnx::TensorProto one;
        one.set_name(scale);
        one.set_data_type(onnx::TensorProto::FLOAT);
        one.add_dims(1);
        one.add_float_data(1.0f);
        extra_initializers_.push_back(one);
      }
    }
    std::vector<std::string> inputs = {*x, scale};
    if (!bias.empty()) inputs.push_back(bias);
    onnx::NodeProto fused = MakeNode("LayerNormalization", inputs, output, node(div).name());
    auto* axis = fused.add_attribute();
    axis->set_name("axis");
    axis->set_type(onnx::AttributeProto::INT);
    axis->set_i(-1);
    auto* eps = fused.add_attribute();
    eps->set_name("epsilon");
    eps->set_type(onnx::AttributeProto::FLOAT);
    eps->set_f(static_cast<float>(*epsilon));
    return fused;
  }

  // A constant of rank <= 1 (a per-feature vector along the last axis, or a scalar).
  bool IsVector(const std::string& name) const {
    auto it = constants_.find(name);
    return it != constants_.end() && it->second->dims_size() <= 1;
  }

  const onnx::GraphProto& graph_;
  int opset_;
  std::unordered_map<std::string, const onnx::TensorProto*> constants_;
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, std::vector<int>> consumers_;
  std::unordered_set<std::string> graph_outputs_;
  std::vector<onnx::TensorProto> extra_initializers_;
};

}  // namespace

RewriteResult FuseDecomposedOperators(const onnx::GraphProto& graph, int opset) {
  return PatternMatcher(graph, opset).Run();
}

}  // namespace cloister::runtime
