// The smallest model with a weight, a plain output and a computed one, for tests and fuzz
// targets that need a real model but not a large one: Y = Neg(X), Z = Add(X, W) over
// float[n, W.size()] (n a free batch dimension), W an initializer holding `weights`.
#pragma once

#include <string>
#include <vector>

#include "onnx/onnx_pb.h"

namespace cloister::testing {

inline onnx::ModelProto NegAndAddModel(const std::vector<float>& weights) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("neg-and-add");
  auto add_value = [&](google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
                       const char* name) {
    onnx::ValueInfoProto* value = list->Add();
    value->set_name(name);
    auto* tensor = value->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(onnx::TensorProto::FLOAT);
    tensor->mutable_shape()->add_dim()->set_dim_param("n");
    tensor->mutable_shape()->add_dim()->set_dim_value(static_cast<int64_t>(weights.size()));
  };
  add_value(graph->mutable_input(), "x");
  add_value(graph->mutable_output(), "y");
  add_value(graph->mutable_output(), "z");
  onnx::TensorProto* w = graph->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(static_cast<int64_t>(weights.size()));
  w->set_raw_data(std::string(reinterpret_cast<const char*>(weights.data()),
                              weights.size() * sizeof(float)));
  onnx::NodeProto* neg = graph->add_node();
  neg->set_op_type("Neg");
  neg->add_input("x");
  neg->add_output("y");
  onnx::NodeProto* add = graph->add_node();
  add->set_op_type("Add");
  add->add_input("x");
  add->add_input("w");
  add->add_output("z");
  return model;
}

}  // namespace cloister::testing
