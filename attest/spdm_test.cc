#include "attest/spdm.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "attest/test_util.h"
#include "attest/x509.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using testing::ReadTestHex;
using testing::ReadTestText;

void AppendLe(Bytes& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}
void AppendTlv(Bytes& out, uint16_t type, const Bytes& value) {
  AppendLe(out, type, 2);
  AppendLe(out, value.size(), 2);
  Append(out, value);
}

// A small report written byte by byte from the layout in shared/specs section 3 (not with the
// encoder under test): two blocks (a SHA-384 digest and a 3-byte raw value) and five TLVs.
struct HandBuilt {
  Bytes bytes;
  size_t record_length_offset;
  size_t first_block_offset;
  size_t second_block_offset;
  size_t opaque_length_offset;
  size_t opaque_offset;
  size_t signature_offset;
};

HandBuilt BuildHandReport() {
  HandBuilt out;
  Bytes& r = out.bytes;
  r = {0x11, 0xE0, 0x01, 0xFF};
  r.insert(r.end(), 32, 0xA5);  // requester nonce
  r.push_back(0x00);            // slot
  r.insert(r.end(), {0x11, 0x60, 0x00, 0x00, 0x02});
  out.record_length_offset = r.size();
  AppendLe(r, (4 + 51) + (4 + 6), 3);
  out.first_block_offset = r.size();
  r.insert(r.end(), {0x01, 0x01, 51, 0x00, 0x01, 48, 0x00});
  r.insert(r.end(), 48, 0x11);
  out.second_block_offset = r.size();
  r.insert(r.end(), {0x02, 0x01, 6, 0x00, 0x81, 3, 0x00, 'x', 'y', 'z'});
  r.insert(r.end(), 32, 0x5A);  // responder nonce
  Bytes opaque;
  AppendTlv(opaque, 3, ToBytes(std::string("550.90.07") + '\0'));
  AppendTlv(opaque, 6, {0x00, 0x9f, 0x00, 0x96, 0x01, 0x00, 0x00, 0x00});
  AppendTlv(opaque, 20, Bytes(48, 0x77));
  AppendTlv(opaque, 34, {0x01});
  AppendTlv(opaque, 36, {0x02});
  out.opaque_length_offset = r.size();
  AppendLe(r, opaque.size(), 2);
  out.opaque_offset = r.size();
  Append(r, opaque);
  out.signature_offset = r.size();
  r.insert(r.end(), 96, 0xEE);
  return out;
}

TEST(SpdmTest, ParsesHandBuiltReport) {
  HandBuilt hand = BuildHandReport();
  auto report = ParseSpdmReport(hand.bytes);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->requester_nonce, Bytes(32, 0xA5));
  EXPECT_EQ(report->request_param2, 0xFF);
  ASSERT_EQ(report->blocks.size(), 2u);
  EXPECT_EQ(report->blocks[0].index, 1);
  EXPECT_EQ(report->blocks[0].value, Bytes(48, 0x11));
  EXPECT_EQ(report->blocks[1].value_type, 0x81);
  EXPECT_EQ(report->blocks[1].value, ToBytes("xyz"));
  EXPECT_EQ(report->responder_nonce, Bytes(32, 0x5A));
  EXPECT_EQ(report->driver_version, "550.90.07");
  EXPECT_EQ(report->vbios_version, "96.00.9F.00.01");
  ASSERT_TRUE(report->fwid.has_value());
  EXPECT_EQ(*report->fwid, Bytes(48, 0x77));
  EXPECT_EQ(report->opaque_data_version, 1u);
  EXPECT_EQ(report->feature_flag, 2u);
  EXPECT_EQ(report->opaque_field_order, (std::vector<uint16_t>{3, 6, 20, 34, 36}));
  EXPECT_EQ(report->signature, Bytes(96, 0xEE));
  EXPECT_EQ(report->signed_size, hand.signature_offset);
  EXPECT_NE(report->FindBlock(2), nullptr);
  EXPECT_EQ(report->FindBlock(3), nullptr);
  EXPECT_NE(report->FindOpaque(OpaqueType::kFwid), nullptr);
}

TEST(SpdmTest, EncoderReproducesHandBuiltBytes) {
  HandBuilt hand = BuildHandReport();
  auto report = ParseSpdmReport(hand.bytes);
  ASSERT_TRUE(report.ok());
  auto encoded = EncodeSpdmReportToSign(*report);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(*encoded, Bytes(hand.bytes.begin(), hand.bytes.begin() + hand.signature_offset));
}

struct Mutation {
  std::string name;
  std::function<void(HandBuilt&)> apply;
  std::string expected_message;
};

TEST(SpdmTest, RefusesMutatedReports) {
  const std::vector<Mutation> mutations = {
      {"request version", [](HandBuilt& h) { h.bytes[0] = 0x12; }, "request SPDM version"},
      {"request code", [](HandBuilt& h) { h.bytes[1] = 0xE1; }, "request code"},
      {"unsigned request", [](HandBuilt& h) { h.bytes[2] = 0x00; }, "signed response"},
      {"response version", [](HandBuilt& h) { h.bytes[37] = 0x10; }, "response SPDM version"},
      {"response code", [](HandBuilt& h) { h.bytes[38] = 0x61; }, "response code"},
      {"no blocks", [](HandBuilt& h) { h.bytes[41] = 0; }, "no measurement blocks"},
      {"block count above record", [](HandBuilt& h) { h.bytes[41] = 3; }, "block index"},
      {"block count below record", [](HandBuilt& h) { h.bytes[41] = 1; }, "leaves"},
      {"record too long", [](HandBuilt& h) { h.bytes[h.record_length_offset + 2] = 0x10; },
       "measurement record"},
      {"index zero", [](HandBuilt& h) { h.bytes[h.first_block_offset] = 0; }, "index 0"},
      {"duplicate index", [](HandBuilt& h) { h.bytes[h.second_block_offset] = 1; }, "twice"},
      {"not DMTF", [](HandBuilt& h) { h.bytes[h.first_block_offset + 1] = 2; }, "specification"},
      {"value size mismatch", [](HandBuilt& h) { h.bytes[h.first_block_offset + 5] = 47; },
       "value size"},
      {"opaque overruns", [](HandBuilt& h) { h.bytes[h.opaque_length_offset + 1] = 0x40; },
       "opaque data"},
      {"opaque empty",
       [](HandBuilt& h) {
         size_t size = h.bytes[h.opaque_length_offset] | h.bytes[h.opaque_length_offset + 1] << 8;
         h.bytes.erase(h.bytes.begin() + h.opaque_offset, h.bytes.begin() + h.opaque_offset + size);
         h.bytes[h.opaque_length_offset] = 0;
         h.bytes[h.opaque_length_offset + 1] = 0;
       },
       "opaque data is empty"},
      {"TLV overruns", [](HandBuilt& h) { h.bytes[h.opaque_offset + 2] = 0xFF; },
       "opaque field value"},
      {"TLV type 0", [](HandBuilt& h) { h.bytes[h.opaque_offset] = 0; },
       "unknown opaque field type 0"},
      {"TLV type 37", [](HandBuilt& h) { h.bytes[h.opaque_offset] = 37; },
       "unknown opaque field type 37"},
      {"duplicate TLV",
       [](HandBuilt& h) { h.bytes[h.opaque_offset + 4 + 10] = 3; },  // VBIOS tag -> DRIVER_VERSION
       "appears twice"},
      {"driver version not text", [](HandBuilt& h) { h.bytes[h.opaque_offset + 4] = 0x01; },
       "non-printable"},
      {"bytes after NUL", [](HandBuilt& h) { h.bytes[h.opaque_offset + 4 + 4] = 0; },
       "after its terminating NUL"},
      {"FWID too short",
       [](HandBuilt& h) {
         // Shrink the FWID TLV (third TLV) from 48 to 47 bytes and fix the opaque length.
         size_t fwid_tlv = h.opaque_offset + (4 + 10) + (4 + 8);
         h.bytes[fwid_tlv + 2] = 47;
         h.bytes.erase(h.bytes.begin() + fwid_tlv + 4);
         h.bytes[h.opaque_length_offset] -= 1;
       },
       "FWID is 47 bytes"},
      {"trailing byte", [](HandBuilt& h) { h.bytes.push_back(0); }, "trailing"},
      {"short signature", [](HandBuilt& h) { h.bytes.pop_back(); }, "signature"},
  };
  for (const Mutation& mutation : mutations) {
    HandBuilt hand = BuildHandReport();
    mutation.apply(hand);
    auto report = ParseSpdmReport(hand.bytes);
    ASSERT_FALSE(report.ok()) << mutation.name;
    EXPECT_TRUE(absl::StrContains(report.status().message(), mutation.expected_message))
        << mutation.name << ": " << report.status();
  }
}

TEST(SpdmTest, EveryTruncationIsRefused) {
  HandBuilt hand = BuildHandReport();
  for (size_t size = 0; size < hand.bytes.size(); ++size) {
    EXPECT_FALSE(ParseSpdmReport(ByteSpan(hand.bytes).first(size)).ok()) << size;
  }
}

TEST(SpdmTest, SingleByteChangesNeverCrash) {
  Bytes real = ReadTestHex("nvidia-cc/hopper-550.90.07-nras/attestation_report.hex");
  ASSERT_FALSE(real.empty());
  for (size_t i = 0; i < real.size(); ++i) {
    Bytes mutated = real;
    mutated[i] ^= 0xFF;
    (void)ParseSpdmReport(mutated);  // may pass or fail; must stay in bounds (ASan builds)
  }
}

TEST(SpdmTest, VbiosVersionCoding) {
  Bytes coded = {0x00, 0x9f, 0x00, 0x96, 0x01, 0x00, 0x00, 0x00};
  auto text = DecodeVbiosVersion(coded);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "96.00.9F.00.01");
  auto back = EncodeVbiosVersion("96.00.9f.00.01");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, coded);
  EXPECT_FALSE(DecodeVbiosVersion(Bytes(7, 0)).ok());
  for (const char* bad :
       {"96.00.9F.00", "96.00.9F.00.01.02", "96.00.9G.00.01", "960.0.9F.00.01", ""}) {
    EXPECT_FALSE(EncodeVbiosVersion(bad).ok()) << bad;
  }
}

// ---- real NVIDIA reports (shared/testdata/nvidia-cc) ----

TEST(SpdmRealTest, Hopper550) {
  Bytes bytes = ReadTestHex("nvidia-cc/hopper-550.90.07-nras/attestation_report.hex");
  auto report = ParseSpdmReport(bytes);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(bytes.size(), 4117u);
  EXPECT_EQ(HexEncode(report->requester_nonce),
            "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb");
  EXPECT_EQ(HexEncode(report->responder_nonce),
            "b4b8a06aaaa35542839388e159d447a5d6f6194998fd86513e2d591ccf640985");
  EXPECT_EQ(report->blocks.size(), 64u);
  EXPECT_EQ(report->signed_size, 4021u);
  EXPECT_EQ(report->driver_version, "550.90.07");
  EXPECT_EQ(report->vbios_version, "96.00.9F.00.01");
  EXPECT_EQ(report->project, "1010");
  EXPECT_EQ(report->project_sku, "0200");
  EXPECT_EQ(report->chip_sku, "882");
  EXPECT_EQ(report->chip_sku_mod, "0");
  EXPECT_EQ(report->project_sku_mod, "");
  EXPECT_EQ(report->board_id, 945u);
  EXPECT_EQ(report->nvdec0_status, 0x55);
  EXPECT_EQ(report->protected_pcie_status, 0x55);
  ASSERT_TRUE(report->fwid.has_value());
  EXPECT_EQ(HexEncode(*report->fwid),
            "f5c384aebb579217a2c66b17ed0f28e6a9b8d639041acd7b4721cec004f7275494ba94bb5cdfdb3055ee05"
            "1762b1f75d");
  EXPECT_EQ(report->opaque_field_order,
            (std::vector<uint16_t>{6, 14, 15, 16, 17, 18, 19, 3, 4, 12, 13, 11, 20, 21}));
  std::vector<int> nonzero;
  for (const SpdmMeasurementBlock& block : report->blocks) {
    EXPECT_EQ(block.value.size(), 48u);
    bool zero = true;
    for (uint8_t b : block.value) zero = zero && b == 0;
    if (!zero) nonzero.push_back(block.index);
  }
  EXPECT_EQ(nonzero, (std::vector<int>{2,  3,  4,  5,  6,  7,  8,  10, 12, 22, 23, 26, 27,
                                       28, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41}));

  // The report signature verifies with the leaf of the chain NVML returned, and the leaf's
  // DICE FWID equals the report's.
  auto chain = ParsePemChain(ReadTestText("nvidia-cc/hopper-550.90.07-nras/cert_chain.pem"));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_TRUE(VerifyP1363WithCertificate((*chain)[0], crypto::HashAlg::kSha384,
                                         ByteSpan(bytes).first(report->signed_size),
                                         report->signature)
                  .ok());
  auto fwid = DiceFwid((*chain)[0]);
  ASSERT_TRUE(fwid.ok());
  EXPECT_EQ(*fwid, *report->fwid);
}

TEST(SpdmRealTest, Hopper545WithoutFwid) {
  Bytes bytes = ReadTestHex("nvidia-cc/hopper-545.00-e2e/attestation_report.hex");
  auto report = ParseSpdmReport(bytes);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(bytes.size(), 4049u);
  EXPECT_EQ(HexEncode(report->requester_nonce),
            "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e");
  EXPECT_EQ(report->driver_version, "545.00");
  EXPECT_EQ(report->vbios_version, "96.00.5E.00.01");
  EXPECT_FALSE(report->fwid.has_value());
  EXPECT_EQ(report->signed_size, 3953u);
  auto chain = ParsePemChain(ReadTestText("nvidia-cc/hopper-545.00-e2e/cert_chain.pem"));
  ASSERT_TRUE(chain.ok());
  EXPECT_TRUE(VerifyP1363WithCertificate((*chain)[0], crypto::HashAlg::kSha384,
                                         ByteSpan(bytes).first(report->signed_size),
                                         report->signature)
                  .ok());
}

TEST(SpdmRealTest, OtherSamplesParse) {
  struct Sample {
    std::string path;
    size_t size;
    std::string driver;
    std::string vbios;
  };
  const Sample samples[] = {
      {"nvidia-cc/attestation-sdk-samples/hopper-535.86.09/attestation_report.hex", 4052,
       "535.86.09", "96.00.5E.00.01"},
      {"nvidia-cc/attestation-sdk-samples/hopper-570.124.03/attestation_report.hex", 4118,
       "570.124.03", "96.00.5E.00.04"},
      {"nvidia-cc/attestation-sdk-samples/hopper-invalid-signature/"
       "attestation_report_BAD_SIGNATURE.hex",
       4262, "560.00", "96.00.A5.00.01"},
  };
  for (const Sample& sample : samples) {
    Bytes bytes = ReadTestHex(sample.path);
    auto report = ParseSpdmReport(bytes);
    ASSERT_TRUE(report.ok()) << sample.path << ": " << report.status();
    EXPECT_EQ(bytes.size(), sample.size) << sample.path;
    EXPECT_EQ(report->driver_version, sample.driver) << sample.path;
    EXPECT_EQ(report->vbios_version, sample.vbios) << sample.path;
  }
}

TEST(SpdmRealTest, InvalidSignatureSampleFailsVerification) {
  std::string dir = "nvidia-cc/attestation-sdk-samples/hopper-invalid-signature/";
  Bytes bytes = ReadTestHex(dir + "attestation_report_BAD_SIGNATURE.hex");
  auto report = ParseSpdmReport(bytes);
  ASSERT_TRUE(report.ok());
  auto chain = ParsePemChain(ReadTestText(dir + "cert_chain.pem"));
  ASSERT_TRUE(chain.ok());
  absl::Status status =
      VerifyP1363WithCertificate((*chain)[0], crypto::HashAlg::kSha384,
                                 ByteSpan(bytes).first(report->signed_size), report->signature);
  EXPECT_FALSE(status.ok());
}

TEST(SpdmRealTest, NvSwitchReport) {
  Bytes bytes =
      ReadTestHex("nvidia-cc/attestation-sdk-samples/nvswitch-ls10/attestation_report.hex");
  auto report = ParseSpdmReport(bytes);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(bytes.size(), 2168u);
  EXPECT_EQ(report->blocks.size(), 31u);
  EXPECT_EQ(HexEncode(report->requester_nonce),
            "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb");
  EXPECT_TRUE(absl::StartsWith(report->vbios_version, "96.10."));  // switch BIOS as text
  auto chain =
      ParsePemChain(ReadTestText("nvidia-cc/attestation-sdk-samples/nvswitch-ls10/cert_chain.pem"));
  ASSERT_TRUE(chain.ok());
  EXPECT_TRUE(VerifyP1363WithCertificate((*chain)[0], crypto::HashAlg::kSha384,
                                         ByteSpan(bytes).first(report->signed_size),
                                         report->signature)
                  .ok());
}

}  // namespace
}  // namespace cloister::attest
