#include "enclave/runtime/kernel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "enclave/runtime/onnx_tensor.h"
#include "enclave/runtime/plan.h"

namespace cloister::runtime {

bool ValueInfo::fully_known() const {
  if (!rank_known) return false;
  for (int64_t dim : dims) {
    if (dim < 0) return false;
  }
  return true;
}

NodeContext::NodeContext(const onnx::NodeProto& node, int since_version,
                         std::vector<ValueInfo> inputs, int explicit_input_count,
                         SubgraphCompiler compiler)
    : node_(node),
      since_version_(since_version),
      inputs_(std::move(inputs)),
      explicit_input_count_(explicit_input_count),
      compiler_(std::move(compiler)),
      outputs_(node.output_size()),
      outputs_set_(node.output_size(), false) {}

bool NodeContext::has_input(int index) const {
  return index < explicit_input_count_ && !node_.input(index).empty();
}

const Tensor* NodeContext::constant_input(int index) const {
  if (!has_input(index) || !inputs_[index].constant.has_value()) return nullptr;
  return &*inputs_[index].constant;
}

absl::Status NodeContext::ExpectInputs(int min_count, int max_count) const {
  int present = 0;
  for (int i = 0; i < explicit_input_count_; ++i) {
    if (has_input(i)) present = i + 1;
  }
  if (explicit_input_count_ > max_count && present > max_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("takes at most ", max_count, " inputs, got ", explicit_input_count_));
  }
  for (int i = 0; i < min_count; ++i) {
    if (!has_input(i)) {
      return absl::InvalidArgumentError(absl::StrCat("required input ", i, " is missing"));
    }
  }
  return absl::OkStatus();
}

absl::Status NodeContext::ExpectType(int index, std::initializer_list<DataType> allowed) const {
  if (!has_input(index)) return absl::OkStatus();
  for (DataType dtype : allowed) {
    if (inputs_[index].dtype == dtype) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("input ", index, " ('", node_.input(index),
                                                 "') has unsupported element type ",
                                                 TypeName(inputs_[index].dtype)));
}

const onnx::AttributeProto* NodeContext::Find(std::string_view name) const {
  for (const onnx::AttributeProto& attribute : node_.attribute()) {
    if (attribute.name() == name) return &attribute;
  }
  return nullptr;
}

namespace {
absl::Status MissingAttribute(std::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat("missing attribute '", std::string(name), "'"));
}
absl::Status WrongAttribute(std::string_view name, std::string_view kind) {
  return absl::InvalidArgumentError(
      absl::StrCat("attribute '", std::string(name), "' must be ", std::string(kind)));
}
bool IsKind(const onnx::AttributeProto& attribute, onnx::AttributeProto::AttributeType type) {
  // Old exporters leave `type` unset; fall back to which field is filled in.
  if (attribute.type() != onnx::AttributeProto::UNDEFINED) return attribute.type() == type;
  switch (type) {
    case onnx::AttributeProto::INT:
      return attribute.has_i();
    case onnx::AttributeProto::FLOAT:
      return attribute.has_f();
    case onnx::AttributeProto::STRING:
      return attribute.has_s();
    case onnx::AttributeProto::TENSOR:
      return attribute.has_t();
    case onnx::AttributeProto::GRAPH:
      return attribute.has_g();
    case onnx::AttributeProto::INTS:
      return attribute.ints_size() > 0;
    case onnx::AttributeProto::FLOATS:
      return attribute.floats_size() > 0;
    default:
      return false;
  }
}
}  // namespace

absl::StatusOr<int64_t> NodeContext::Int(std::string_view name,
                                         std::optional<int64_t> fallback) const {
  const onnx::AttributeProto* attribute = Find(name);
  if (attribute == nullptr) {
    if (fallback.has_value()) return *fallback;
    return MissingAttribute(name);
  }
  if (!IsKind(*attribute, onnx::AttributeProto::INT)) return WrongAttribute(name, "an int");
  return attribute->i();
}

absl::StatusOr<float> NodeContext::Float(std::string_view name,
                                         std::optional<float> fallback) const {
  const onnx::AttributeProto* attribute = Find(name);
  if (attribute == nullptr) {
    if (fallback.has_value()) return *fallback;
    return MissingAttribute(name);
  }
  if (!IsKind(*attribute, onnx::AttributeProto::FLOAT)) return WrongAttribute(name, "a float");
  return attribute->f();
}

absl::StatusOr<std::string> NodeContext::String(std::string_view name,
                                                std::optional<std::string> fallback) const {
  const onnx::AttributeProto* attribute = Find(name);
  if (attribute == nullptr) {
    if (fallback.has_value()) return *fallback;
    return MissingAttribute(name);
  }
  if (!IsKind(*attribute, onnx::AttributeProto::STRING)) return WrongAttribute(name, "a string");
  return attribute->s();
}

absl::StatusOr<std::vector<int64_t>> NodeContext::Ints(
    std::string_view name, std::optional<std::vector<int64_t>> fallback) const {
  const onnx::AttributeProto* attribute = Find(name);
  if (attribute == nullptr) {
    if (fallback.has_value()) return *fallback;
    return MissingAttribute(name);
  }
  if (attribute->type() != onnx::AttributeProto::INTS &&
      attribute->type() != onnx::AttributeProto::UNDEFINED) {
    return WrongAttribute(name, "a list of ints");
  }
  return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
}

absl::StatusOr<std::vector<float>> NodeContext::Floats(
    std::string_view name, std::optional<std::vector<float>> fallback) const {
  const onnx::AttributeProto* attribute = Find(name);
  if (attribute == nullptr) {
    if (fallback.has_value()) return *fallback;
    return MissingAttribute(name);
  }
  if (attribute->type() != onnx::AttributeProto::FLOATS &&
      attribute->type() != onnx::AttributeProto::UNDEFINED) {
    return WrongAttribute(name, "a list of floats");
  }
  return std::vector<float>(attribute->floats().begin(), attribute->floats().end());
}

absl::StatusOr<Tensor> NodeContext::TensorAttribute(std::string_view name) const {
  const onnx::AttributeProto* attribute = Find(name);
  if (attribute == nullptr) return MissingAttribute(name);
  if (!IsKind(*attribute, onnx::AttributeProto::TENSOR)) return WrongAttribute(name, "a tensor");
  return TensorFromProto(attribute->t());
}

absl::StatusOr<std::shared_ptr<const Plan>> NodeContext::Subgraph(std::string_view name) const {
  const onnx::AttributeProto* attribute = Find(name);
  if (attribute == nullptr) return MissingAttribute(name);
  if (!IsKind(*attribute, onnx::AttributeProto::GRAPH)) return WrongAttribute(name, "a graph");
  CLOISTER_CHECK(compiler_ != nullptr);
  auto plan = compiler_(attribute->g());
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("in subgraph '", std::string(name),
                                                           "': ", plan.status().message()));
  }
  return plan;
}

void NodeContext::SetOutput(int index, ValueInfo info) {
  CLOISTER_CHECK(index >= 0);
  if (index >= output_count()) {
    // The operator has this output and the node does not list it; the compiler refuses it.
    sets_unlisted_output_ = true;
    return;
  }
  outputs_[index] = std::move(info);
  outputs_set_[index] = true;
}

void NodeContext::SetConstantOutput(int index, Tensor value) {
  ValueInfo info = ValueInfo::Shaped(value.dtype(), value.shape());
  info.constant = std::move(value);
  SetOutput(index, std::move(info));
}

KernelContext::KernelContext(std::vector<const Tensor*> inputs, std::vector<bool> input_dies,
                             int output_count, BufferPool& pool)
    : inputs_(std::move(inputs)),
      input_dies_(std::move(input_dies)),
      outputs_(output_count),
      pool_(pool) {}

absl::StatusOr<Tensor*> KernelContext::Output(int index, DataType dtype,
                                              std::vector<int64_t> shape) {
  CLOISTER_CHECK(index >= 0 && index < static_cast<int>(outputs_.size()));
  ASSIGN_OR_RETURN(int64_t count, ElementCount(shape));
  const uint64_t size = static_cast<uint64_t>(count) * ElementSize(dtype);
  if (size > kMaxOutputSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("output of shape ", ShapeToString(shape), " is too large"));
  }
  auto buffer = pool_.Acquire(size);
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for an output of shape ", ShapeToString(shape)));
  }
  outputs_[index] = Tensor(dtype, std::move(shape), std::move(buffer));
  return &outputs_[index];
}

absl::StatusOr<std::shared_ptr<internal::Buffer>> KernelContext::Scratch(size_t size) {
  if (size > kMaxOutputSize) return absl::InvalidArgumentError("scratch space is too large");
  auto buffer = pool_.Acquire(size);
  if (buffer == nullptr) return absl::ResourceExhaustedError("out of memory for scratch space");
  return buffer;
}

absl::StatusOr<Tensor*> KernelContext::OutputReusingInput(int index, int input_index,
                                                          DataType dtype,
                                                          std::vector<int64_t> shape) {
  if (input_index < static_cast<int>(inputs_.size()) && inputs_[input_index] != nullptr &&
      input_dies_[input_index]) {
    const Tensor& input = *inputs_[input_index];
    // One reference from the run's value table; anyone else (a constant, the caller's input,
    // a view) keeps the buffer read-only.
    if (input.buffer() != nullptr && input.buffer().use_count() == 1 &&
        input.buffer()->capacity() >= input.size()) {
      auto count = ElementCount(shape);
      if (count.ok() &&
          static_cast<size_t>(*count) * ElementSize(dtype) <= input.buffer()->capacity()) {
        outputs_[index] = Tensor(dtype, std::move(shape), input.buffer());
        return &outputs_[index];
      }
    }
  }
  return Output(index, dtype, std::move(shape));
}

void KernelContext::SetOutput(int index, Tensor value) {
  CLOISTER_CHECK(index >= 0 && index < static_cast<int>(outputs_.size()));
  outputs_[index] = std::move(value);
}

void KernelRegistry::Register(std::string op_type, std::initializer_list<int> since_versions,
                              KernelFactory factory) {
  auto shared = std::make_shared<KernelFactory>(std::move(factory));
  std::vector<Entry>& entries = entries_[op_type];
  for (int version : since_versions) entries.push_back(Entry{version, shared});
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.since_version < b.since_version; });
}

absl::StatusOr<KernelRegistry::Match> KernelRegistry::Find(std::string_view op_type,
                                                           int opset) const {
  auto it = entries_.find(op_type);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("operator ", std::string(op_type), " is not supported"));
  }
  const Entry* best = nullptr;
  for (const Entry& entry : it->second) {
    if (entry.since_version <= opset) best = &entry;
  }
  if (best == nullptr) {
    return absl::UnimplementedError(absl::StrCat("operator ", std::string(op_type), " at opset ",
                                                 opset, " is not supported (supported from opset ",
                                                 it->second.front().since_version, ")"));
  }
  return Match{best->factory.get(), best->since_version};
}

std::vector<std::string> KernelRegistry::OperatorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, entries] : entries_) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<int64_t>> BroadcastShapes(const std::vector<int64_t>& a,
                                                     const std::vector<int64_t>& b) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da == db) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else if (db == 1) {
      out[i] = da;
    } else if (da < 0 || db < 0) {
      out[i] = std::max(da, db);  // the known one, if the unknown one turns out to match or be 1
    } else {
      return absl::InvalidArgumentError(absl::StrCat("shapes ", ShapeToString(a), " and ",
                                                     ShapeToString(b), " do not broadcast"));
    }
  }
  return out;
}

absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("axis ", axis, " is out of range for rank ", rank));
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace cloister::runtime
