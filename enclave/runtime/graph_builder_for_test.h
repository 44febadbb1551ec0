// A small builder of ONNX models for the runtime's tests, over the ONNX protobuf classes.
// Threading: a plain value; one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"

namespace cloister::runtime {

class GraphBuilder {
 public:
  explicit GraphBuilder(int opset = 17) {
    model_.set_ir_version(8);
    auto* import = model_.add_opset_import();
    import->set_domain("");
    import->set_version(opset);
  }

  GraphBuilder& Input(const std::string& name, int elem_type, std::vector<int64_t> dims) {
    AddValueInfo(model_.mutable_graph()->add_input(), name, elem_type, dims);
    return *this;
  }
  GraphBuilder& Output(const std::string& name, int elem_type = 0,
                       std::optional<std::vector<int64_t>> dims = std::nullopt) {
    auto* value = model_.mutable_graph()->add_output();
    value->set_name(name);
    if (elem_type != 0) {
      value->mutable_type()->mutable_tensor_type()->set_elem_type(elem_type);
      if (dims) {
        auto* shape = value->mutable_type()->mutable_tensor_type()->mutable_shape();
        for (int64_t d : *dims) {
          if (d < 0) {
            shape->add_dim()->set_dim_param("n");
          } else {
            shape->add_dim()->set_dim_value(d);
          }
        }
      }
    }
    return *this;
  }
  GraphBuilder& FloatInitializer(const std::string& name, std::vector<int64_t> dims,
                                 const std::vector<float>& values) {
    auto* tensor = model_.mutable_graph()->add_initializer();
    tensor->set_name(name);
    tensor->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) tensor->add_dims(d);
    for (float v : values) tensor->add_float_data(v);
    return *this;
  }
  GraphBuilder& IntInitializer(const std::string& name, std::vector<int64_t> dims,
                               const std::vector<int64_t>& values) {
    auto* tensor = model_.mutable_graph()->add_initializer();
    tensor->set_name(name);
    tensor->set_data_type(onnx::TensorProto::INT64);
    for (int64_t d : dims) tensor->add_dims(d);
    for (int64_t v : values) tensor->add_int64_data(v);
    return *this;
  }
  onnx::NodeProto& Node(const std::string& op, std::vector<std::string> inputs,
                        std::vector<std::string> outputs, const std::string& name = "") {
    auto* node = model_.mutable_graph()->add_node();
    node->set_op_type(op);
    node->set_name(name.empty() ? outputs.empty() ? op : outputs[0] : name);
    for (auto& in : inputs) node->add_input(in);
    for (auto& out : outputs) node->add_output(out);
    return *node;
  }
  onnx::ModelProto& proto() { return model_; }
  std::string Bytes() const { return model_.SerializeAsString(); }

  static void AddValueInfo(onnx::ValueInfoProto* value, const std::string& name, int elem_type,
                           const std::vector<int64_t>& dims) {
    value->set_name(name);
    auto* type = value->mutable_type()->mutable_tensor_type();
    type->set_elem_type(elem_type);
    auto* shape = type->mutable_shape();
    for (int64_t d : dims) {
      if (d < 0) {
        shape->add_dim()->set_dim_param("n");
      } else {
        shape->add_dim()->set_dim_value(d);
      }
    }
  }

 private:
  onnx::ModelProto model_;
};

// `count` floats uniform in [-1, 1) from a fixed seed.
inline std::vector<float> RandomFloats(size_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = distribution(generator);
  return values;
}

inline void SetInts(onnx::NodeProto& node, const std::string& name, std::vector<int64_t> values) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) attribute->add_ints(v);
}
inline void SetInt(onnx::NodeProto& node, const std::string& name, int64_t value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INT);
  attribute->set_i(value);
}
inline void SetFloat(onnx::NodeProto& node, const std::string& name, float value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::FLOAT);
  attribute->set_f(value);
}
inline void SetString(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::STRING);
  attribute->set_s(value);
}

}  // namespace cloister::runtime
