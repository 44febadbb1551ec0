// The two NVIDIA trust anchors a verifier pins (shared/specs/attestation-formats.md sections 4
// and 5): the self-signed "NVIDIA Device Identity CA" under which every GPU and NVSwitch device
// chain ends, and the self-signed "NVIDIA CoRIM signing Root CA" under which every RIM signing
// chain ends. They are public certificates, published by NVIDIA in its verifiers; they are
// compiled in so that a default NvidiaPolicy works offline, and a policy may replace them.
// Their SHA-256 fingerprints are checked by a test against the copies in shared/testdata.
// Thread-safe: constants.
#pragma once

#include <string_view>

namespace cloister::attest {

// CN=NVIDIA Device Identity CA, O=NVIDIA; P-384; valid 2021-11-05 to 9999-12-31;
// SHA-256 fingerprint 10:2B:F6:59:...:0B:16:7B:48.
extern const std::string_view kNvidiaDeviceIdentityCaPem;

// CN=NVIDIA CoRIM signing Root CA, O=NVIDIA, C=US; P-384; valid 2023-03-16 to 2053-03-08;
// SHA-256 fingerprint 12:97:7B:51:...:1D:F5:D1.
extern const std::string_view kNvidiaCorimRootCaPem;

}  // namespace cloister::attest
