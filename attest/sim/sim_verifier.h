// Verifiers for the simulated TEE and GPU (attest/sim/sim_tee.h), behind EvidenceVerifier.
// They check the same things the SEV-SNP and NVIDIA verifiers check on real evidence, with
// the trust anchors taken from the policy's `sim` section (a development policy):
//   CVM: cvm.report.parse, cvm.certs.chain, cvm.certs.tcb (the VCEK matches CHIP_ID and the
//        reported TCB), cvm.report.signature, cvm.policy (DEBUG bit, VMPL 0),
//        cvm.measurement; claims cvm.* including cvm.report_data for the binding check.
//   GPU, for each report i: gpu<i>.report.parse, gpu<i>.certs.chain, gpu<i>.report.signature,
//        gpu<i>.certs.fwid, gpu<i>.nonce, gpu<i>.measurements (against the simulated
//        firmware's reference values), gpu<i>.versions; claims gpu<i>.*.
// Thread-safe: stateless.
#pragma once

#include "attest/verifier.h"

namespace cloister::attest {

class SimCvmVerifier : public EvidenceVerifier {
 public:
  Verdict Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce, const Policy& policy,
                 absl::Time at) const override;
};

class SimGpuVerifier : public EvidenceVerifier {
 public:
  Verdict Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce, const Policy& policy,
                 absl::Time at) const override;
};

}  // namespace cloister::attest
