// Shared by the enclave fuzz targets: one simulated enclave per fuzzing process (its state
// carries from one input to the next, as in a long-running worker), its development policy,
// and a tiny model (y = -x, z = x + w over float[1, 4]) that loads in microseconds. The
// enclave's temporary folder is removed at exit. Not thread-safe: libFuzzer and the corpus
// replayer call targets from one thread.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "attest/policy.h"
#include "base/bytes.h"
#include "enclave/enclave.h"
#include "onnx/onnx_pb.h"

namespace cloister::fuzzing {

struct FuzzEnclave {
  std::string dir;
  std::unique_ptr<enclave::Enclave> enclave;
  attest::v1::Policy policy;
};

// The process's enclave, made on first use; aborts if it cannot be made (a broken harness
// must not look like a clean fuzzing run).
inline FuzzEnclave& TheFuzzEnclave() {
  static FuzzEnclave* made = [] {
    auto* fuzz = new FuzzEnclave();
    char dir_template[] = "/tmp/cloister-enclave-fuzz-XXXXXX";
    const char* dir = mkdtemp(dir_template);
    if (dir == nullptr) std::abort();
    fuzz->dir = dir;
    std::atexit([] { std::filesystem::remove_all(TheFuzzEnclave().dir); });
    enclave::EnclaveOptions options;
    options.sim_dir = fuzz->dir + "/sim";
    options.dev_policy_out = fuzz->dir + "/dev-policy.yaml";
    options.measurement = Bytes(48, 0x42);
    options.load_options.threads = 1;
    // Every input may open a session; the fuzzer must not run into the session limit.
    options.session_limits.max_sessions = size_t{1} << 22;
    auto created = enclave::Enclave::Create(std::move(options));
    if (!created.ok()) std::abort();
    fuzz->enclave = *std::move(created);
    auto policy = attest::LoadPolicyFile(fuzz->dir + "/dev-policy.yaml");
    if (!policy.ok()) std::abort();
    fuzz->policy = *std::move(policy);
    return fuzz;
  }();
  return *made;
}

// The serialized tiny model; the same bytes every time.
inline std::string TinyModel() {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("tiny");
  auto add_value = [](google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
                      const char* name) {
    auto* tensor = list->Add();
    tensor->set_name(name);
    auto* type = tensor->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto::FLOAT);
    type->mutable_shape()->add_dim()->set_dim_param("n");
    type->mutable_shape()->add_dim()->set_dim_value(4);
  };
  add_value(graph->mutable_input(), "x");
  add_value(graph->mutable_output(), "y");
  add_value(graph->mutable_output(), "z");
  onnx::TensorProto* w = graph->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  for (float value : {1.0f, 2.0f, 3.0f, 4.0f}) w->add_float_data(value);
  onnx::NodeProto* neg = graph->add_node();
  neg->set_op_type("Neg");
  neg->add_input("x");
  neg->add_output("y");
  onnx::NodeProto* add = graph->add_node();
  add->set_op_type("Add");
  add->add_input("x");
  add->add_input("w");
  add->add_output("z");
  return model.SerializeAsString();
}

}  // namespace cloister::fuzzing
