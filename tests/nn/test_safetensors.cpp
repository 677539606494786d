// safetensors: round trips of every dtype, byte-exact agreement with the reference writer, and a
// hand-made corrupt file for every check the loader makes (each must raise sl::Error, allocate nothing).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "nn/safetensors.h"
#include "tensor/ops.h"

namespace sl::nn {
namespace {

using ::testing::HasSubstr;

// Each test gets its own fresh directory under the GoogleTest temp dir, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::path(::testing::TempDir()) / "sl_safetensors_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern << ": " << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (std::filesystem::path(dir_) / name).string(); }

  static std::string read_bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    std::string file = path(name);
    std::ofstream(file, std::ios::binary) << bytes;
    return file;
  }

  std::string dir_;
};

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// The file a writer would make: 8-byte length of `header`, `header`, then `data_bytes` bytes of data.
std::string file_bytes(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x5a');
}

// The message of the sl::Error that `load` raises ("" and a test failure if it raises none).
template <typename Load>
std::string error_of(Load load) {
  try {
    load();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an sl::Error";
  return "";
}

// A tensor of the given dtype and shape whose bytes are an arbitrary pattern (NaNs and all).
Tensor patterned(DType dtype, const Shape& shape, int seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<unsigned char*>(t.raw_data());
  for (int64_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + seed * 17 + 7);
  return t;
}

// ---- round trips --------------------------------------------------------------------------------

class Safetensors : public TempDirTest {};

TEST_F(Safetensors, RoundTripsEveryDTypeByteForByte) {
  StateDict saved = {
      {"h.0.attn.weight", patterned(DType::f32, {2, 3}, 1)},
      {"h.0.attn.bias", patterned(DType::f64, {5}, 2)},
      {"ln_f.weight", patterned(DType::bf16, {3, 2}, 3)},
      {"ln_f.bias", patterned(DType::f16, {7}, 4)},
      {"ids", patterned(DType::i32, {4}, 5)},
      {"positions", patterned(DType::i64, {2, 2}, 6)},
      {"scalar", patterned(DType::f32, {}, 7)},
      {"empty", patterned(DType::f64, {3, 0}, 8)},
      {"empty_leading", patterned(DType::bf16, {0, 4}, 9)},
  };
  std::string file = path("model.safetensors");
  save_safetensors(file, saved);
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));

  StateDict loaded = load_safetensors(file);
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& [name, original] : saved) {
    SCOPED_TRACE(name);
    ASSERT_EQ(loaded.count(name), 1u);
    const Tensor& back = loaded.at(name);
    EXPECT_EQ(back.dtype(), original.dtype());
    EXPECT_EQ(back.shape(), original.shape());
    EXPECT_EQ(back.device(), Device::cpu());
    EXPECT_FALSE(back.requires_grad());
    ASSERT_EQ(back.nbytes(), original.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), original.raw_data(), original.nbytes()), 0);
  }
  EXPECT_EQ(loaded.at("scalar").dim(), 0);
  EXPECT_EQ(loaded.at("empty").numel(), 0);
  EXPECT_TRUE(load_safetensors_metadata(file).empty());
}

TEST_F(Safetensors, ValuesAndMetadataRoundTrip) {
  StateDict saved = {{"w", from_vector({1.5, -2.0, 0.25, 1e-3}, {2, 2})}};
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "1200"}, {"note", "ünïcode \"quoted\""}, {"empty", ""}};
  std::string file = path("with_metadata.safetensors");
  save_safetensors(file, saved, metadata);
  EXPECT_EQ(load_safetensors_metadata(file), metadata);
  EXPECT_EQ(load_safetensors(file).at("w").values<float>(), (std::vector<float>{1.5f, -2.0f, 0.25f, 1e-3f}));
}

TEST_F(Safetensors, LoadsOntoTheRequestedDevice) {
  std::string file = path("device.safetensors");
  save_safetensors(file, {{"w", from_vector({1, 2, 3}, {3})}});
  StateDict loaded = load_safetensors(file, Device::cpu(3));
  EXPECT_EQ(loaded.at("w").device(), Device::cpu(3));
  EXPECT_EQ(loaded.at("w").values<float>(), (std::vector<float>{1, 2, 3}));
}

TEST_F(Safetensors, OverwritesAnExistingFile) {
  std::string file = path("twice.safetensors");
  save_safetensors(file, {{"w", from_vector({1, 2}, {2})}});
  save_safetensors(file, {{"v", from_vector({3}, {1}, DType::i64)}});
  StateDict loaded = load_safetensors(file);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded.at("v").values<int64_t>(), (std::vector<int64_t>{3}));
}

// ---- the reference implementation's bytes --------------------------------------------------------

// {"a": F32 [1, 2]} as Python's safetensors.torch.save_file writes it: 54 header bytes padded to 56.
std::string reference_a_file() {
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string data("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);  // 1.0f, 2.0f little-endian
  return le64(56) + header + "  " + data;
}

TEST_F(Safetensors, LoadsAFileInTheReferenceLayout) {
  StateDict loaded = load_safetensors(write_bytes("reference.safetensors", reference_a_file()));
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded.at("a").dtype(), DType::f32);
  EXPECT_EQ(loaded.at("a").shape(), Shape({2}));
  EXPECT_EQ(loaded.at("a").values<float>(), (std::vector<float>{1.0f, 2.0f}));
  // Older writers did not pad the header; those files load too.
  std::string unpadded = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string data("\0\0\x80\x3f\0\0\0\x40", 8);
  std::string file = write_bytes("unpadded.safetensors", le64(54) + unpadded + data);
  EXPECT_EQ(load_safetensors(file).at("a").values<float>(), (std::vector<float>{1.0f, 2.0f}));
}

TEST_F(Safetensors, WritesTheReferenceBytes) {
  std::string file = path("a.safetensors");
  save_safetensors(file, {{"a", from_vector({1, 2}, {2})}});
  EXPECT_EQ(read_bytes(file), reference_a_file());

  // The reference's own test vectors: a 64-byte header needs no padding; "{}" is padded to 8.
  save_safetensors(file, {{"attn.0", from_vector({0, 1, 2, 3, 4, 5}, {1, 2, 3})}});
  std::string attn = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(attn.size(), 64u);
  std::string attn_data("\0\0\0\0\0\0\x80\x3f\0\0\0\x40\0\0\x40\x40\0\0\x80\x40\0\0\xa0\x40", 24);
  EXPECT_EQ(read_bytes(file), le64(64) + attn + attn_data);

  save_safetensors(file, {});
  EXPECT_EQ(read_bytes(file), le64(8) + "{}      ");
  save_safetensors(file, {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(file), le64(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
}

TEST_F(Safetensors, PacksWidestDTypesFirstSoDataIsAligned) {
  std::string file = path("order.safetensors");
  save_safetensors(file, {{"a_half", zeros({3}, DType::f16)},
                          {"b_long", zeros({1}, DType::i64)},
                          {"c_float", zeros({1}, DType::f32)},
                          {"d_brain", zeros({1}, DType::bf16)}});
  std::string bytes = read_bytes(file);
  auto header = nlohmann::ordered_json::parse(bytes.substr(8, bytes.size() - 8 - 20));
  std::vector<std::string> order;
  for (const auto& [name, entry] : header.items()) order.push_back(name);
  EXPECT_EQ(order, (std::vector<std::string>{"b_long", "c_float", "d_brain", "a_half"}));  // I64 F32 BF16 F16
  EXPECT_EQ(header["b_long"]["data_offsets"], nlohmann::ordered_json::array({0, 8}));
  EXPECT_EQ(header["c_float"]["data_offsets"], nlohmann::ordered_json::array({8, 12}));
  EXPECT_EQ(header["d_brain"]["data_offsets"], nlohmann::ordered_json::array({12, 14}));
  EXPECT_EQ(header["a_half"]["data_offsets"], nlohmann::ordered_json::array({14, 20}));
  EXPECT_EQ((bytes.size() - 20) % 8, 0u);
}

// ---- errors while saving and opening ------------------------------------------------------------

TEST_F(Safetensors, SavingIntoAMissingDirectoryRaises) {
  std::string file = path("no/such/dir/model.safetensors");
  std::string message = error_of([&] { save_safetensors(file, {{"w", zeros({2})}}); });
  EXPECT_THAT(message, HasSubstr(file + ".tmp"));
  EXPECT_THAT(message, HasSubstr("cannot open for writing: No such file or directory"));
}

TEST_F(Safetensors, SavingRejectsBadNamesAndTensors) {
  std::string file = path("bad.safetensors");
  EXPECT_THAT(error_of([&] { save_safetensors(file, {{"__metadata__", zeros({2})}}); }), HasSubstr("reserved"));
  EXPECT_THAT(error_of([&] { save_safetensors(file, {{"w", Tensor()}}); }), HasSubstr("tensor 'w' is undefined"));
  EXPECT_THAT(error_of([&] { save_safetensors(file, {{"bad\xff", zeros({2})}}); }), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(error_of([&] { save_safetensors(file, {}, {{"k", "\xc3"}}); }), HasSubstr("not valid UTF-8"));
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));
}

TEST_F(Safetensors, OpeningSomethingThatIsNotAFileRaises) {
  std::string missing = path("missing.safetensors");
  EXPECT_THAT(error_of([&] { load_safetensors(missing); }),
              HasSubstr("'" + missing + "': cannot open for reading: No such file or directory"));
  EXPECT_THAT(error_of([&] { load_safetensors_metadata(dir_); }), HasSubstr("not a regular file"));
}

// ---- lengths the loader must refuse before reading the header -----------------------------------

TEST_F(Safetensors, RejectsAFileShorterThanTheLength) {
  for (std::string bytes : {std::string(), std::string("\x10\0\0\0\0", 5)}) {
    std::string file = write_bytes("short.safetensors", bytes);
    std::string size = std::to_string(bytes.size());
    EXPECT_THAT(error_of([&] { load_safetensors(file); }),
                HasSubstr("the file is " + size + " bytes, shorter than the 8-byte header length"));
  }
}

TEST_F(Safetensors, RejectsAHeaderLengthPastTheEnd) {
  std::string file = write_bytes("long.safetensors", le64(1000) + "{}        ");
  EXPECT_THAT(error_of([&] { load_safetensors(file); }),
              HasSubstr("header length 1000 runs past the end of the file (18 bytes)"));
  file = write_bytes("absurd.safetensors", le64(UINT64_MAX) + "{}");
  EXPECT_THAT(error_of([&] { load_safetensors_metadata(file); }),
              HasSubstr("header length 18446744073709551615 runs past the end of the file (10 bytes)"));
}

TEST_F(Safetensors, RejectsAHeaderOverTheSizeLimit) {
  // A sparse file: 100 MB + 1 of header that is never read, so the test writes almost nothing.
  std::string file = write_bytes("huge.safetensors", le64(100'000'001));
  std::filesystem::resize_file(file, 8 + 100'000'001);
  EXPECT_THAT(error_of([&] { load_safetensors(file); }),
              HasSubstr("header length 100000001 is over the limit of 100000000 bytes"));
}

// ---- corrupt headers: one case per check --------------------------------------------------------

struct CorruptCase {
  std::string name;
  std::string header;
  size_t data_bytes;
  std::string phrase;  // the error must contain this
};

class SafetensorsCorrupt : public TempDirTest, public ::testing::WithParamInterface<CorruptCase> {};

// Every corrupt file is refused by both loaders with a message naming the file, and the load
// allocates nothing (it runs on a device of its own and checks that device's peak).
TEST_P(SafetensorsCorrupt, IsRejectedBeforeAllocating) {
  const CorruptCase& c = GetParam();
  std::string file = write_bytes(c.name + ".safetensors", file_bytes(c.header, c.data_bytes));
  Device untouched = Device::cpu(211);
  std::string message = error_of([&] { load_safetensors(file, untouched); });
  EXPECT_THAT(message, HasSubstr(c.phrase));
  EXPECT_THAT(message, HasSubstr("load_safetensors: '" + file + "': "));
  EXPECT_THAT(error_of([&] { load_safetensors_metadata(file); }), HasSubstr(c.phrase));
  EXPECT_EQ(MemoryLedger::instance().peak(untouched), 0);
}

const std::string kF32Pair = R"("dtype":"F32","shape":[2])";  // 8 bytes of data

INSTANTIATE_TEST_SUITE_P(
    Safetensors, SafetensorsCorrupt,
    ::testing::Values(
        CorruptCase{"invalid_json", "{not json", 0, "the header is not valid JSON"},
        CorruptCase{"empty_header", "", 0, "the header is not valid JSON"},
        CorruptCase{"invalid_utf8", "{\"\xff\":1}", 0, "the header is not valid JSON"},
        CorruptCase{"header_is_array", "[1, 2]", 0, "the header is not a JSON object (it is array)"},
        CorruptCase{"entry_not_object", R"({"w":3})", 0, "tensor 'w': the entry must be a JSON object, got 3"},
        CorruptCase{"missing_dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'w': missing \"dtype\""},
        CorruptCase{"missing_shape", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8,
                    "tensor 'w': missing \"shape\""},
        CorruptCase{"missing_offsets", "{\"w\":{" + kF32Pair + "}}", 8, "tensor 'w': missing \"data_offsets\""},
        CorruptCase{"dtype_not_string", R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8,
                    "\"dtype\" must be a string, got 4"},
        CorruptCase{"unknown_dtype", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2,
                    "tensor 'w': unknown dtype \"U8\""},
        CorruptCase{"shape_not_array", R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8,
                    "\"shape\" must be an array, got 2"},
        CorruptCase{"negative_shape", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
                    "shape entry -2 is not a non-negative integer"},
        CorruptCase{"fractional_shape", R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8,
                    "shape entry 2.5 is not a non-negative integer"},
        CorruptCase{"string_shape", R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8,
                    "shape entry \"2\" is not a non-negative integer"},
        CorruptCase{"shape_past_int64", R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})",
                    8, "shape entry 9223372036854775808 is not a non-negative integer"},
        CorruptCase{"numel_overflow", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                    8, "shape [4294967296,4294967296] overflows int64 (its element count)"},
        CorruptCase{"bytes_overflow", R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
                    "shape [4611686018427387904] of F32 overflows int64 in bytes"},
        CorruptCase{"offsets_one_number", "{\"w\":{" + kF32Pair + ",\"data_offsets\":[8]}}", 8,
                    "\"data_offsets\" must be [begin, end], got [8]"},
        CorruptCase{"offsets_three_numbers", "{\"w\":{" + kF32Pair + ",\"data_offsets\":[0,4,8]}}", 8,
                    "\"data_offsets\" must be [begin, end]"},
        CorruptCase{"offsets_object", "{\"w\":{" + kF32Pair + ",\"data_offsets\":{\"begin\":0}}}", 8,
                    "\"data_offsets\" must be [begin, end]"},
        CorruptCase{"offsets_negative", "{\"w\":{" + kF32Pair + ",\"data_offsets\":[-8,0]}}", 8,
                    "\"data_offsets\" [-8,0] must be non-negative integers"},
        CorruptCase{"offsets_fractional", "{\"w\":{" + kF32Pair + ",\"data_offsets\":[0,8.0]}}", 8,
                    "must be non-negative integers"},
        CorruptCase{"offsets_reversed", "{\"w\":{" + kF32Pair + ",\"data_offsets\":[8,0]}}", 8,
                    "tensor 'w': data_offsets [8, 0]: begin 8 > end 0"},
        CorruptCase{"offsets_past_data", "{\"w\":{" + kF32Pair + ",\"data_offsets\":[0,16]}}", 8,
                    "tensor 'w': data_offsets [0, 16] run past the end of the data buffer (8 bytes)"},
        CorruptCase{"offsets_far_past_data",
                    "{\"w\":{" + kF32Pair + ",\"data_offsets\":[18446744073709551608,18446744073709551615]}}", 8,
                    "run past the end of the data buffer (8 bytes)"},
        CorruptCase{
            "overlap",
            "{\"a\":{" + kF32Pair + ",\"data_offsets\":[0,8]},\"b\":{" + kF32Pair + ",\"data_offsets\":[4,12]}}", 12,
            "tensors 'a' (data_offsets [0, 8]) and 'b' (data_offsets [4, 12]) overlap"},
        CorruptCase{"same_range_twice",
                    "{\"a\":{" + kF32Pair + ",\"data_offsets\":[0,8]},\"b\":{" + kF32Pair + ",\"data_offsets\":[0,8]}}",
                    8, "overlap"},
        CorruptCase{"byte_count", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
                    "tensor 'w': data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12"},
        CorruptCase{"metadata_not_object", R"({"__metadata__":5})", 0,
                    "\"__metadata__\" must be an object of string to string, got 5"},
        CorruptCase{"metadata_value_number", R"({"__metadata__":{"epoch":3}})", 0,
                    "\"__metadata__\" must map strings to strings, but key 'epoch' holds 3"}),
    [](const ::testing::TestParamInfo<CorruptCase>& info) { return info.param.name; });

TEST_F(Safetensors, EmptyTensorsOwnNoBytesAndOverlapNothing) {
  // [4, 4] sits inside a's range but holds no bytes, so it is no overlap.
  std::string header =
      "{\"a\":{" + kF32Pair + R"(,"data_offsets":[0,8]},"e":{"dtype":"I64","shape":[0,3],"data_offsets":[4,4]}})";
  StateDict loaded = load_safetensors(write_bytes("empty_inside.safetensors", file_bytes(header, 8)));
  EXPECT_EQ(loaded.at("e").shape(), Shape({0, 3}));
  EXPECT_EQ(loaded.at("a").numel(), 2);
}

}  // namespace
}  // namespace sl::nn
