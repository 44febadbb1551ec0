#include "proto/wipe.h"

#include "base/secret_bytes.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/unknown_field_set.h"

namespace cloister::proto {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::UnknownFieldSet;

// The storage behind a string field's value. Reflection hands out const references to the
// stored string itself (the scratch copy is only used for cord fields, which Cloister's
// messages do not have); the string is owned by a message the caller holds non-const.
void WipeStored(const std::string& stored) {
  std::string& value = const_cast<std::string&>(stored);
  SecureWipe(value.data(), value.size());
}

void WipeUnknown(UnknownFieldSet& unknown) {
  for (int i = 0; i < unknown.field_count(); ++i) {
    auto* field = unknown.mutable_field(i);
    if (field->type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      WipeString(*field->mutable_length_delimited());
    } else if (field->type() == google::protobuf::UnknownField::TYPE_GROUP) {
      WipeUnknown(*field->mutable_group());
    }
  }
}

}  // namespace

void WipeString(std::string& bytes) { SecureWipe(bytes.data(), bytes.size()); }

void WipeMessage(Message& message) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);  // set fields only: nothing new is created
  std::string scratch;
  for (const FieldDescriptor* field : fields) {
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (field->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
          WipeStored(reflection->GetRepeatedStringReference(message, field, i, &scratch));
        }
      } else {
        WipeStored(reflection->GetStringReference(message, field, &scratch));
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
          WipeMessage(*reflection->MutableRepeatedMessage(&message, field, i));
        }
      } else {
        WipeMessage(*reflection->MutableMessage(&message, field));
      }
    }
  }
  SecureWipe(scratch.data(), scratch.size());
  WipeUnknown(*reflection->MutableUnknownFields(&message));
}

}  // namespace cloister::proto
