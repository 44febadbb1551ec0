// Tenant isolation through the whole appliance (real cloisterd and cloister-enclave): an
// authorization matrix of what tenant `globex` can do with tenant `acme`'s model, session and
// token. Every refusal must be the same one a tenant gets for something that does not exist at
// all, so a refusal never tells one tenant that another's object is there.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "host/tenants/tenant_registry.h"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "sdk/npy.h"
#include "tests/support/appliance.h"
#include "tests/support/process.h"
#include "tests/support/tensor_files.h"

namespace cloister {
namespace {

const std::string kModels = std::string(CLOISTER_SHARED_DIR) + "/models";
const std::string kClsModel = kModels + "/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
const std::string kClsInput =
    kModels + "/testdata/ch_ppocr_mobile_v2.0_cls/test_data_set_0/input_0.pb";

// The token hash the config holds, computed as cloisterd does.
std::string HashOf(const std::string& token) { return HexEncode(host::TokenHash(token)); }

// "<code>: <message>" of a status, with `name` replaced by NAME so that refusals about two
// different names can be compared.
std::string Shape(const absl::Status& status, const std::string& name) {
  std::string message(status.message());
  for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at)) {
    message.replace(at, name.size(), "NAME");
  }
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", message);
}

class IsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = testing::MakeTempDir("cloister-isolation");
    const std::string config = work_ + "/cloisterd.yaml";
    std::ofstream(config) << "operator:\n  listen: 127.0.0.1:0\n"
                          << "tenants:\n"
                          << "  - id: acme\n    token_sha256: " << HashOf(kAcmeToken) << "\n"
                          << "  - id: globex\n    token_sha256: " << HashOf(kGlobexToken) << "\n";
    appliance_ = std::make_unique<testing::Appliance>(CLOISTERD_BINARY, work_ + "/data",
                                                      std::vector<std::string>{"--config", config});
    ASSERT_TRUE(appliance_->Start().ok());
    acme_ = Connect("acme", kAcmeToken);
    globex_ = Connect("globex", kGlobexToken);
    ASSERT_NE(acme_, nullptr);
    ASSERT_NE(globex_, nullptr);
    auto uploaded = acme_->UploadModel(kClsModel, "acme-cls");
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    auto input = testing::ReadTensorProtoFile(kClsInput);
    ASSERT_TRUE(input.ok()) << input.status();
    input_ = sdk::ToTensor("x", *std::move(input));
  }

  std::unique_ptr<sdk::Client> Connect(const std::string& tenant, const std::string& token) {
    sdk::ClientOptions options = appliance_->TenantOptions(tenant, token);
    options.max_attempts = 1;
    auto client = sdk::Client::Connect(options);
    EXPECT_TRUE(client.ok()) << tenant << ": " << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A raw SealedRequest to ListModels as `tenant` with `token`, on `session_id`.
  grpc::Status RawListModels(const std::string& tenant, const std::string& token,
                             const Bytes& session_id) {
    auto stub = api::v1::Cloister::NewStub(
        grpc::CreateChannel(appliance_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.AddMetadata("x-cloister-tenant", tenant);
    context.AddMetadata("authorization", "Bearer " + token);
    api::v1::SealedRequest call;
    call.set_session_id(std::string(session_id.begin(), session_id.end()));
    call.set_request_id("probe");
    call.set_sequence(1);
    call.set_ciphertext(std::string(64, 'c'));
    api::v1::SealedReply reply;
    return stub->ListModels(&context, call, &reply);
  }

  // Every RPC that names a session, as `tenant` with `token` on `session_id` with a request
  // id and model handle of the caller's choosing: "<RPC> -> <code>: <message>" each.
  std::vector<std::string> EveryRpcOnSession(const std::string& tenant, const std::string& token,
                                             const Bytes& session_id,
                                             const std::string& request_id,
                                             const std::string& model_handle) {
    auto stub = api::v1::Cloister::NewStub(
        grpc::CreateChannel(appliance_->address(), grpc::InsecureChannelCredentials()));
    api::v1::SealedRequest call;
    call.set_session_id(std::string(session_id.begin(), session_id.end()));
    call.set_request_id(request_id);
    call.set_model_handle(model_handle);
    call.set_sequence(7);
    call.set_ciphertext(std::string(64, 'c'));
    auto context = [&](grpc::ClientContext& c) {
      c.AddMetadata("x-cloister-tenant", tenant);
      c.AddMetadata("authorization", "Bearer " + token);
    };
    auto line = [](const std::string& rpc, const grpc::Status& status) {
      return absl::StrCat(rpc, " -> ", status.error_code(), ": ", status.error_message());
    };
    std::vector<std::string> lines;
    // The three unary RPCs that take a SealedRequest.
    using Unary = grpc::Status (api::v1::Cloister::Stub::*)(
        grpc::ClientContext*, const api::v1::SealedRequest&, api::v1::SealedReply*);
    const std::pair<const char*, Unary> unary_rpcs[] = {
        {"Infer", &api::v1::Cloister::Stub::Infer},
        {"ListModels", &api::v1::Cloister::Stub::ListModels},
        {"DeleteModel", &api::v1::Cloister::Stub::DeleteModel}};
    for (const auto& [rpc, method] : unary_rpcs) {
      grpc::ClientContext c;
      context(c);
      api::v1::SealedReply reply;
      lines.push_back(line(rpc, ((*stub).*method)(&c, call, &reply)));
    }
    {
      grpc::ClientContext c;
      context(c);
      api::v1::UploadModelResponse response;
      auto writer = stub->UploadModel(&c, &response);
      api::v1::UploadModelRequest start;
      start.mutable_start()->set_session_id(call.session_id());
      start.mutable_start()->set_model_handle(model_handle);
      start.mutable_start()->set_ciphertext_size(1024);
      api::v1::UploadModelRequest data;
      data.set_data(std::string(1024, 'd'));
      api::v1::UploadModelRequest finish;
      *finish.mutable_finish() = call;
      if (writer->Write(start) && writer->Write(data)) writer->Write(finish);
      writer->WritesDone();
      lines.push_back(line("UploadModel", writer->Finish()));
    }
    return lines;
  }

  const std::string kAcmeToken = "acme-token-0123456789abcdef";
  const std::string kGlobexToken = "globex-token-0123456789abcdef";
  std::string work_;
  std::unique_ptr<testing::Appliance> appliance_;
  std::unique_ptr<sdk::Client> acme_, globex_;
  api::v1::Tensor input_;
};

TEST_F(IsolationTest, AnotherTenantsModelLooksExactlyLikeNoModel) {
  // The owner can use it.
  ASSERT_TRUE(acme_->Infer("acme-cls", {input_}).ok());

  // Infer: acme's model and a model nobody has give the same refusal.
  const absl::Status theirs = globex_->Infer("acme-cls", {input_}).status();
  const absl::Status nobodys = globex_->Infer("no-such-cls", {input_}).status();
  ASSERT_FALSE(theirs.ok());
  EXPECT_EQ(Shape(theirs, "acme-cls"), Shape(nobodys, "no-such-cls"));

  // Delete: the same, and the model survives.
  const absl::Status delete_theirs = globex_->DeleteModel("acme-cls");
  const absl::Status delete_nobodys = globex_->DeleteModel("no-such-cls");
  ASSERT_FALSE(delete_theirs.ok());
  EXPECT_EQ(Shape(delete_theirs, "acme-cls"), Shape(delete_nobodys, "no-such-cls"));
  EXPECT_TRUE(acme_->Infer("acme-cls", {input_}).ok());

  // List: globex sees none of acme's models.
  auto listed = globex_->ListModels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());

  // A model of the same name uploaded by globex is globex's own; acme's is untouched.
  ASSERT_TRUE(globex_->UploadModel(kClsModel, "acme-cls").ok());
  ASSERT_TRUE(globex_->DeleteModel("acme-cls").ok());
  EXPECT_TRUE(acme_->Infer("acme-cls", {input_}).ok());
}

TEST_F(IsolationTest, AnotherTenantsSessionLooksExactlyLikeNoSession) {
  // globex presents acme's (live) session id, then a session id that never existed.
  const grpc::Status theirs = RawListModels("globex", kGlobexToken, acme_->session_id());
  const grpc::Status nobodys = RawListModels("globex", kGlobexToken, Bytes(16, 0x5a));
  ASSERT_FALSE(theirs.ok());
  EXPECT_EQ(theirs.error_code(), nobodys.error_code());
  EXPECT_EQ(theirs.error_message(), nobodys.error_message());
  // acme's session still works afterwards.
  EXPECT_TRUE(acme_->ListModels().ok());
}

// The authorization matrix over every session-bearing RPC: globex calling with acme's live
// session, acme's model handle and a request id acme has used gets, RPC by RPC, exactly what it
// gets for a session, model and request id that never existed; and acme's session, model and
// uploads are untouched afterwards.
TEST_F(IsolationTest, EveryRpcWithAnotherTenantsIdsLooksExactlyLikeNonexistentIds) {
  ASSERT_TRUE(acme_->Infer("acme-cls", {input_}).ok());
  const std::string acme_handle = acme_->ListModels()->at(0).handle();
  const std::vector<std::string> theirs = EveryRpcOnSession(
      "globex", kGlobexToken, acme_->session_id(), "acme-request-1", acme_handle);
  const std::vector<std::string> nobodys =
      EveryRpcOnSession("globex", kGlobexToken, Bytes(16, 0x5a), "no-such-request",
                        "00000000000000000000000000000000");
  ASSERT_EQ(theirs.size(), 4u);
  for (size_t i = 0; i < theirs.size(); ++i) {
    std::cout << "  " << theirs[i] << "\n";
    EXPECT_EQ(theirs[i], nobodys[i]);
    EXPECT_EQ(theirs[i].find(" -> 0:"), std::string::npos) << theirs[i];  // refused
  }
  // Nothing of acme's changed.
  EXPECT_TRUE(acme_->Infer("acme-cls", {input_}).ok());
  auto listed = acme_->ListModels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 1u);
}

TEST_F(IsolationTest, AnotherTenantsTokenLooksExactlyLikeAWrongToken) {
  const Bytes session = globex_->session_id();
  // acme's real token presented for globex, and a token nobody has.
  const grpc::Status theirs = RawListModels("globex", kAcmeToken, session);
  const grpc::Status nobodys = RawListModels("globex", "no-such-token-0123456789", session);
  ASSERT_FALSE(theirs.ok());
  EXPECT_EQ(theirs.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(theirs.error_code(), nobodys.error_code());
  EXPECT_EQ(theirs.error_message(), nobodys.error_message());
  // And an unknown tenant gets the same answer as a wrong token for a known one.
  const grpc::Status unknown = RawListModels("initech", kAcmeToken, session);
  EXPECT_EQ(unknown.error_code(), theirs.error_code());
  EXPECT_EQ(unknown.error_message(), theirs.error_message());
}

}  // namespace
}  // namespace cloister
