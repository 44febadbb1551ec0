// Test support: plays the enclave's usage ledger (enclave/accounting/) with a fresh Ed25519 key,
// numbering receipts from 1 and keeping each tenant's cumulative counters, so tests can write
// receipt logs that verify and then break them on purpose. Not for production code.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "base/bytes.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "crypto/keys.h"
#include "crypto/receipt.h"

namespace cloister::host::testing {

class ReceiptSigner {
 public:
  ReceiptSigner() : key_(crypto::GenerateEd25519()) {}

  // The next receipt: one batch of `requests` requests of `tenant` on `model_handle`, with
  // `input_size` input bytes, 8 output bytes and 1 µs of execution per request.
  boundary::v1::SignedUsageReceipt Next(const std::string& tenant, uint64_t requests,
                                        uint64_t input_size,
                                        const std::string& model_handle = std::string(32, 'a')) {
    boundary::v1::UsageCounters batch;
    batch.set_batches(1);
    batch.set_requests(requests);
    batch.set_input_size(input_size);
    batch.set_output_size(requests * 8);
    batch.set_execution_ns(1000 * requests);
    boundary::v1::UsageCounters& total = totals_[{tenant, model_handle}];
    total.set_batches(total.batches() + 1);
    total.set_requests(total.requests() + requests);
    total.set_input_size(total.input_size() + input_size);
    total.set_output_size(total.output_size() + requests * 8);
    total.set_execution_ns(total.execution_ns() + 1000 * requests);
    boundary::v1::UsageReceipt receipt;
    receipt.set_enclave_signing_public_key(ToString(key_.public_key));
    receipt.set_sequence(++sequence_);
    receipt.set_tenant_id(tenant);
    receipt.set_model_handle(model_handle);
    receipt.set_pcie_mode("emulated");
    *receipt.mutable_batch() = batch;
    *receipt.mutable_cumulative() = total;
    return Sign(receipt);
  }

  boundary::v1::SignedUsageReceipt Sign(const boundary::v1::UsageReceipt& receipt) {
    boundary::v1::SignedUsageReceipt signed_receipt;
    signed_receipt.set_receipt(receipt.SerializeAsString());
    signed_receipt.set_signature(
        ToString(*crypto::SignUsageReceipt(key_.seed.span(), AsBytes(signed_receipt.receipt()))));
    return signed_receipt;
  }

  const Bytes& public_key() const { return key_.public_key; }

 private:
  crypto::Ed25519KeyPair key_;
  uint64_t sequence_ = 0;
  std::map<std::pair<std::string, std::string>, boundary::v1::UsageCounters> totals_;
};

}  // namespace cloister::host::testing
