#include "sdk/npy.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace cloister::sdk {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Builds the bytes of a .npy file by hand: magic, version, little-endian header length
// (2 bytes for 1.0, 4 bytes otherwise), the header text exactly as given, then the data.
Bytes BuildNpy(std::string_view header, ByteSpan data, uint8_t major = 1, uint8_t minor = 0) {
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', major, minor};
  size_t length_size = major == 1 ? 2 : 4;
  for (size_t i = 0; i < length_size; ++i) {
    out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  }
  Append(out, AsBytes(header));
  Append(out, data);
  return out;
}

Bytes Seq(size_t size) {
  Bytes data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  return data;
}

// Expects InvalidArgument with a one-line message naming the file and containing `problem`.
void ExpectInvalid(const absl::StatusOr<NpyArray>& result, std::string_view problem) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("in.npy: "));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr(problem));
  EXPECT_THAT(std::string(result.status().message()), Not(HasSubstr("\n")));
}

absl::StatusOr<NpyArray> ParseHeader(std::string_view header, ByteSpan data = {}) {
  return ParseNpy(BuildNpy(header, data), "in.npy");
}

TEST(NpyTest, ParsesNumpyWrittenFloat32) {
  // What numpy writes for np.arange(6, dtype='<f4').reshape(2, 3): the header is padded
  // with spaces so that magic + version + length + header is a multiple of 64 bytes (128).
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header.push_back('\n');
  Bytes data;
  for (float f : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) {
    uint8_t raw[4];
    std::memcpy(raw, &f, 4);
    data.insert(data.end(), raw, raw + 4);
  }
  Bytes file = BuildNpy(header, data);
  ASSERT_EQ(file.size(), 128u + 24u);
  auto array = ParseNpy(file, "in.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->datatype, "FP32");
  EXPECT_EQ(array->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(array->data, data);
  // Our writer produces exactly the same bytes.
  auto written = SerializeNpy(*array);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, file);
}

TEST(NpyTest, MapsEveryDtype) {
  struct Case {
    const char* descr;
    const char* datatype;
    size_t element_size;
  };
  const Case cases[] = {
      {"<f2", "FP16", 2},   {"<f4", "FP32", 4},   {"<f8", "FP64", 8},   {"<i8", "INT64", 8},
      {"<i4", "INT32", 4},  {"<i2", "INT16", 2},  {"|i1", "INT8", 1},   {"|u1", "UINT8", 1},
      {"<u2", "UINT16", 2}, {"<u4", "UINT32", 4}, {"<u8", "UINT64", 8}, {"|b1", "BOOL", 1},
      {"=f4", "FP32", 4},   {"=i8", "INT64", 8},  {"<u1", "UINT8", 1},  {">i1", "INT8", 1},
      {"=b1", "BOOL", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.descr);
    Bytes data = Seq(3 * c.element_size);
    auto array = ParseHeader(
        absl::StrCat("{'descr': '", c.descr, "', 'fortran_order': False, 'shape': (3,), }\n"),
        data);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->datatype, c.datatype);
    EXPECT_EQ(array->shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(array->data, data);
    auto size = DatatypeElementSize(c.datatype);
    ASSERT_TRUE(size.ok());
    EXPECT_EQ(*size, c.element_size);
  }
}

TEST(NpyTest, RoundTripsEveryDatatypeAndShape) {
  const char* datatypes[] = {"FP16",  "FP32",  "FP64",   "INT8",   "INT16",  "INT32",
                             "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL"};
  const std::vector<std::vector<int64_t>> shapes = {{}, {1}, {5}, {2, 3}, {0, 4}, {2, 1, 3, 1}};
  for (const char* datatype : datatypes) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(absl::StrCat(datatype, " rank ", shape.size()));
      NpyArray array;
      array.datatype = datatype;
      array.shape = shape;
      uint64_t count = *ShapeElementCount(shape);
      array.data = Seq(count * *DatatypeElementSize(datatype));
      auto bytes = SerializeNpy(array);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      size_t header_end = bytes->size() - array.data.size();
      EXPECT_EQ(header_end % 64, 0u);
      EXPECT_EQ((*bytes)[header_end - 1], '\n');
      auto parsed = ParseNpy(*bytes, "x.npy");
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->datatype, array.datatype);
      EXPECT_EQ(parsed->shape, array.shape);
      EXPECT_EQ(parsed->data, array.data);
    }
  }
}

TEST(NpyTest, ScalarAndEmptyArrays) {
  auto scalar = ParseHeader("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", Seq(8));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->data.size(), 8u);

  auto empty = ParseHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 7), }");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->shape, (std::vector<int64_t>{0, 7}));
  EXPECT_TRUE(empty->data.empty());
}

TEST(NpyTest, AcceptsFormatVersions2And3) {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n";
  for (uint8_t major : {2, 3}) {
    auto array = ParseNpy(BuildNpy(header, Seq(8), major), "in.npy");
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->datatype, "INT32");
    EXPECT_EQ(array->data, Seq(8));
  }
}

TEST(NpyTest, AcceptsHeaderVariations) {
  const char* headers[] = {
      // Other key order, double quotes, no trailing comma, odd spacing.
      "{\"shape\": (2, 2), \"descr\": \"<u2\", \"fortran_order\": False}",
      "{ 'fortran_order' : False , 'shape' : ( 2 , 2 ) , 'descr' : '<u2' }   \n",
      // Python 2 era files wrote long integers with an L suffix.
      "{'descr': '<u2', 'fortran_order': False, 'shape': (2L, 2L), }",
      // Tabs and carriage returns as whitespace.
      "{'descr':'<u2',\t'fortran_order':False,\r\n'shape':(2,2)}",
  };
  for (const char* header : headers) {
    SCOPED_TRACE(header);
    auto array = ParseHeader(header, Seq(8));
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->datatype, "UINT16");
    EXPECT_EQ(array->shape, (std::vector<int64_t>{2, 2}));
  }
}

TEST(NpyTest, RejectsBadMagic) {
  ExpectInvalid(ParseNpy(Bytes{}, "in.npy"), "bad magic");
  ExpectInvalid(ParseNpy(ToBytes("PK\x03\x04 not numpy at all"), "in.npy"), "bad magic");
  Bytes file = BuildNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", Seq(4));
  file[0] = 0x92;
  ExpectInvalid(ParseNpy(file, "in.npy"), "bad magic");
}

TEST(NpyTest, RejectsTruncatedPreambleAndHeader) {
  Bytes magic_only = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  ExpectInvalid(ParseNpy(magic_only, "in.npy"), "truncated header");
  Bytes no_length = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0x40};
  ExpectInvalid(ParseNpy(no_length, "in.npy"), "truncated header");
  Bytes v2_short_length = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0x40, 0, 0};
  ExpectInvalid(ParseNpy(v2_short_length, "in.npy"), "truncated header");
  Bytes file = BuildNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", {});
  ExpectInvalid(ParseNpy(ByteSpan(file).first(file.size() - 5), "in.npy"), "truncated header");
  // A header cut in the middle of the dict.
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': Fal"), "malformed .npy header");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2,"),
                "unexpected end of header");
}

TEST(NpyTest, RejectsUnsupportedVersions) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (), }";
  ExpectInvalid(ParseNpy(BuildNpy(header, Seq(4), 4, 0), "in.npy"), "version 4.0");
  ExpectInvalid(ParseNpy(BuildNpy(header, Seq(4), 1, 1), "in.npy"), "version 1.1");
  ExpectInvalid(ParseNpy(BuildNpy(header, Seq(4), 0, 0), "in.npy"), "version 0.0");
}

TEST(NpyTest, RejectsOversizedHeaderLength) {
  Bytes file = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0x7f};
  ExpectInvalid(ParseNpy(file, "in.npy"), "too large");
}

TEST(NpyTest, RejectsHeaderThatIsNotADict) {
  ExpectInvalid(ParseHeader("['descr', '<f4']"), "a list, not a dict");
  ExpectInvalid(ParseHeader("('<f4', False, (2,))"), "a tuple, not a dict");
  ExpectInvalid(ParseHeader("'descr'"), "a string, not a dict");
  ExpectInvalid(ParseHeader(""), "unexpected end of header");
  ExpectInvalid(ParseHeader("   \n"), "unexpected end of header");
  ExpectInvalid(ParseHeader("descr: <f4"), "unexpected character");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (), } extra"),
                "unexpected text after the header dict");
  ExpectInvalid(ParseHeader("{1: '<f4'}"), "expected a string key");
  ExpectInvalid(ParseHeader("{'descr' '<f4'}"), "expected ':'");
  ExpectInvalid(ParseHeader("{'descr': '<f4' 'shape': ()}"), "expected ',' or '}'");
  ExpectInvalid(ParseHeader("{'descr': '<f4, 'shape': ()}"), "malformed .npy header");
  ExpectInvalid(ParseHeader(std::string_view("{'descr': '<f4'\0}", 17)), "NUL byte");
}

TEST(NpyTest, RejectsMissingExtraAndDuplicateKeys) {
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False}"), "missing key 'shape'");
  ExpectInvalid(ParseHeader("{'shape': (), 'fortran_order': False}"), "missing key 'descr'");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'shape': ()}"), "missing key 'fortran_order'");
  ExpectInvalid(
      ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", Seq(4)),
      "unexpected key 'extra'");
  ExpectInvalid(
      ParseHeader("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': ()}", Seq(4)),
      "duplicate key 'descr'");
}

TEST(NpyTest, RejectsUnsupportedDtypes) {
  for (const char* descr : {"<c8", "<c16", "<U3", "|S5", "|O", "O", "<f16", "<i3", "<V8", "f4",
                            "<f4 ", "|f4", "<b2", "<m8", ""}) {
    SCOPED_TRACE(descr);
    ExpectInvalid(
        ParseHeader(absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (1,)}"),
                    Seq(16)),
        "unsupported dtype");
  }
  ExpectInvalid(ParseHeader("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, "
                            "'shape': (1,)}",
                            Seq(8)),
                "structured arrays are not supported");
  ExpectInvalid(ParseHeader("{'descr': 4, 'fortran_order': False, 'shape': (1,)}", Seq(4)),
                "unsupported dtype");
}

TEST(NpyTest, RejectsBigEndian) {
  for (const char* descr : {">f4", ">i8", ">u2", "!f8"}) {
    SCOPED_TRACE(descr);
    ExpectInvalid(
        ParseHeader(absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (1,)}"),
                    Seq(8)),
        "big-endian");
  }
}

TEST(NpyTest, RejectsFortranOrder) {
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}", Seq(16)),
                "Fortran-order");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 2)}", Seq(16)),
                "'fortran_order' is an integer, not a boolean");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': None, 'shape': (2, 2)}", Seq(16)),
                "'fortran_order' is None, not a boolean");
}

TEST(NpyTest, RejectsBadShapes) {
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 2]}", Seq(16)),
                "'shape' is a list, not a tuple");
  // "(4)" is the integer 4 in Python, not a tuple.
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (4)}", Seq(16)),
                "'shape' is an integer, not a tuple");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1)}"),
                "negative dimension");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': ('2',)}"),
                "a shape dimension is a string, not an integer");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}"),
                "expected an integer");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, "
                            "'shape': (99999999999999999999,)}"),
                "integer out of range");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, "
                            "'shape': (4294967296, 4294967296)}"),
                "too many elements");
  // Overflow is refused even when a later dimension is zero.
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, "
                            "'shape': (4294967296, 4294967296, 0)}"),
                "too many elements");
  // The element count fits but the byte size does not.
  ExpectInvalid(ParseHeader("{'descr': '<f8', 'fortran_order': False, "
                            "'shape': (4611686018427387904,)}"),
                "too large");
  std::string many_dims = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < 65; ++i) many_dims += "1,";
  many_dims += ")}";
  ExpectInvalid(ParseHeader(many_dims, Seq(4)), "65 dimensions");
}

TEST(NpyTest, RejectsDataSizeMismatch) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ExpectInvalid(ParseHeader(header, Seq(23)), "data is 23 bytes but shape (2, 3) of FP32 needs 24");
  ExpectInvalid(ParseHeader(header, Seq(25)), "data is 25 bytes");
  ExpectInvalid(ParseHeader(header), "data is 0 bytes");
  ExpectInvalid(ParseHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", Seq(4)),
                "shape (5,) of FP32 needs 20");
}

TEST(NpyTest, SerializeRejectsInconsistentArrays) {
  NpyArray array{"FP32", {2, 2}, Seq(15)};
  EXPECT_EQ(SerializeNpy(array).status().code(), absl::StatusCode::kInvalidArgument);
  array = NpyArray{"BF16", {1}, Seq(2)};
  EXPECT_EQ(SerializeNpy(array).status().code(), absl::StatusCode::kInvalidArgument);
  array = NpyArray{"INT8", {-1}, {}};
  EXPECT_EQ(SerializeNpy(array).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DatatypeElementSize("BYTES").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NpyTest, TensorConversions) {
  NpyArray array{"INT16", {3, 1}, Seq(6)};
  cloister::api::v1::Tensor tensor = ToTensor("input_ids", array);
  EXPECT_EQ(tensor.name(), "input_ids");
  EXPECT_EQ(tensor.datatype(), "INT16");
  ASSERT_EQ(tensor.shape_size(), 2);
  EXPECT_EQ(tensor.shape(0), 3);
  EXPECT_EQ(tensor.raw(), ToString(array.data));
  auto back = FromTensor(tensor);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, array.data);
  EXPECT_EQ(back->shape, array.shape);

  tensor.set_raw("12345");
  EXPECT_THAT(std::string(FromTensor(tensor).status().message()),
              HasSubstr("tensor 'input_ids' of shape (3, 1) and type INT16 has 5 bytes"));
  tensor.set_datatype("BYTES");
  EXPECT_EQ(FromTensor(tensor).status().code(), absl::StatusCode::kInvalidArgument);
}

class NpyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("npy-test");
    ASSERT_FALSE(dir_.empty());
  }
  std::string dir_;
};

TEST_F(NpyFileTest, WritesAndReadsFiles) {
  NpyArray array{"FP64", {2, 2}, Seq(32)};
  std::string path = dir_ + "/out.npy";
  ASSERT_TRUE(WriteNpyFile(path, array).ok());
  auto read = ReadNpyFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->data, array.data);
  EXPECT_EQ(read->shape, array.shape);
}

TEST_F(NpyFileTest, ReportsMissingAndMalformedFiles) {
  auto missing = ReadNpyFile(dir_ + "/missing.npy");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing.npy"));

  std::string path = dir_ + "/text.npy";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("1,2,3\n", f);
  std::fclose(f);
  auto malformed = ReadNpyFile(path);
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(malformed.status().message()), HasSubstr(path + ": not a .npy file"));
}

}  // namespace
}  // namespace cloister::sdk
