// Distributed checkpoints (parallel/checkpoint/): SHA-256 against FIPS 180-4's vectors, regions and
// copy_overlap against element-by-element references, save under one cut and load under another
// exactly, the tiling errors, corruption and hostile metadata named, and crash safety: failures
// injected at every point of a save, and one real writer killed with SIGKILL.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/support/checkpoint.h"
#include "nn/safetensors.h"
#include "tests/support/test_util.h"

extern char** environ;

namespace sl::parallel::checkpoint {
namespace {

using namespace testing_util;

// ---- SHA-256 -------------------------------------------------------------------------------------

TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1'000'000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, StreamingInAnyPiecesAndFromAFile) {
  const std::string million(1'000'000, 'a');
  Sha256 hash;
  for (size_t at = 0, step = 1; at < million.size(); at += step, step = step * 3 % 1000 + 1)
    hash.update(million.data() + at, std::min(step, million.size() - at));
  EXPECT_EQ(hash.finish(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  const std::string path = ::testing::TempDir() + "sl_sha256_" + std::to_string(::getpid());
  write_file_bytes(path, "abc");
  EXPECT_EQ(sha256_file(path), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::remove(path.c_str());
  expect_error([&] { sha256_file(path); }, path);
}

// ---- regions and copy_overlap against brute force ------------------------------------------------

// A random shape of 0..4 dims (sizes 0..5) and a random well-formed region of it.
std::vector<int64_t> random_shape(std::mt19937& rng) {
  std::vector<int64_t> shape(rng() % 5);
  for (int64_t& size : shape) size = rng() % 6;
  return shape;
}
Region random_region(std::mt19937& rng, const std::vector<int64_t>& shape) {
  Region region;
  for (int64_t size : shape) {
    const int64_t a = size ? rng() % (size + 1) : 0, b = size ? rng() % (size + 1) : 0;
    region.offsets.push_back(std::min(a, b));
    region.lengths.push_back(std::max(a, b) - std::min(a, b));
  }
  const int64_t n = region.box_numel();
  const int64_t a = rng() % (n + 1), b = rng() % (n + 1);
  region.flat_begin = std::min(a, b), region.flat_end = std::max(a, b);
  return region;
}

TEST(CheckpointRegions, BoxesOverlapsAndSpansMatchBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::vector<int64_t> shape = random_shape(rng);
    const Region a = random_region(rng, shape), b = random_region(rng, shape);
    ASSERT_EQ(region_problem(a, shape), "");
    const std::vector<int64_t> ia = global_indices(a, shape), ib = global_indices(b, shape);
    std::vector<int64_t> from_boxes;  // boxes_of covers exactly a's elements
    for (const Box& box : boxes_of(a))
      for (int64_t index : global_indices(Region{box.lo, box.length, 0, numel_of(box.length)}, shape))
        from_boxes.push_back(index);
    std::vector<int64_t> sorted = ia;
    std::sort(sorted.begin(), sorted.end());
    std::sort(from_boxes.begin(), from_boxes.end());
    ASSERT_EQ(from_boxes, sorted) << describe(a);
    int64_t shared = 0, first = -1, last = -1;  // and the span of a's positions that b shares
    for (size_t k = 0; k < ia.size(); ++k)
      if (std::find(ib.begin(), ib.end(), ia[k]) != ib.end()) {
        ++shared;
        if (first < 0) first = a.flat_begin + static_cast<int64_t>(k);
        last = a.flat_begin + static_cast<int64_t>(k) + 1;
      }
    ASSERT_EQ(overlap_count(a, b), shared) << describe(a) << " / " << describe(b);
    const auto span = overlap_span(a, b);
    if (shared == 0)
      ASSERT_EQ(span.first, span.second);
    else
      ASSERT_EQ(span, std::make_pair(first, last)) << describe(a) << " / " << describe(b);
  }
}

TEST(CheckpointRegions, CopyOverlapMatchesAnElementByElementReference) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::vector<int64_t> shape = random_shape(rng);
    const Region dst = random_region(rng, shape), src = random_region(rng, shape);
    const std::vector<int64_t> id = global_indices(dst, shape), is = global_indices(src, shape);
    std::vector<int32_t> src_data(is.size()), dst_data(id.size(), -1), expected(id.size(), -1);
    for (size_t k = 0; k < is.size(); ++k) src_data[k] = static_cast<int32_t>(is[k]) * 3 + 1;
    int64_t expected_count = 0;
    for (size_t k = 0; k < id.size(); ++k)
      if (std::find(is.begin(), is.end(), id[k]) != is.end()) expected[k] = static_cast<int32_t>(id[k]) * 3 + 1, ++expected_count;
    const int64_t copied = copy_overlap(dst, dst_data.data(), src, src_data.data(), 4);
    ASSERT_EQ(copied, expected_count) << describe(dst) << " <- " << describe(src);
    ASSERT_EQ(dst_data, expected) << describe(dst) << " <- " << describe(src);
  }
}

// ---- the tiling check ----------------------------------------------------------------------------

std::string tiling_error(const std::vector<int64_t>& shape, const std::vector<Region>& regions) {
  return message_of([&] {
    check_tiling("w", shape, regions, [](size_t i) { return "piece " + std::to_string(i); });
  });
}

TEST(CheckpointTiling, ExactTilingsPass) {
  EXPECT_EQ(tiling_error({4, 6}, {{{0, 0}, {4, 6}, 0, 10}, {{0, 0}, {4, 6}, 10, 24}}), "(no error)");
  EXPECT_EQ(tiling_error({4, 6}, {{{0, 0}, {2, 6}, 0, 12}, {{2, 0}, {2, 3}, 0, 6}, {{2, 3}, {2, 3}, 0, 4},
                                  {{2, 3}, {2, 3}, 4, 6}}),
            "(no error)");
  EXPECT_EQ(tiling_error({}, {{{}, {}, 0, 1}}), "(no error)");
  EXPECT_EQ(tiling_error({0, 5}, {}), "(no error)");
}

TEST(CheckpointTiling, GapsOverlapsAndOutOfBoundsAreNamed) {
  std::string gap = tiling_error({4, 6}, {{{0, 0}, {4, 6}, 0, 10}, {{0, 0}, {4, 6}, 11, 24}});
  EXPECT_NE(gap.find("tensor 'w' [4, 6]: gap: the pieces cover 23 of its 24 elements"), std::string::npos) << gap;
  std::string overlap = tiling_error({4, 6}, {{{0, 0}, {4, 6}, 0, 13}, {{2, 0}, {2, 6}, 0, 12}});
  EXPECT_NE(overlap.find("tensor 'w' [4, 6]: overlap: piece 0 and piece 1 share 1 elements"), std::string::npos)
      << overlap;
  std::string out = tiling_error({4, 6}, {{{0, 0}, {4, 6}, 0, 24}, {{3, 0}, {2, 6}, 0, 12}});
  EXPECT_NE(out.find("piece 1: out of bounds: dimension 0 spans [3, 3 + 2)"), std::string::npos) << out;
  std::string negative = tiling_error({4, 6}, {{{-1, 0}, {4, 6}, 0, 24}});
  EXPECT_NE(negative.find("piece 0: out of bounds"), std::string::npos) << negative;
  std::string flat = tiling_error({4, 6}, {{{0, 0}, {4, 6}, 0, 25}});
  EXPECT_NE(flat.find("flat range [0, 25) is not inside the box's 24 elements"), std::string::npos) << flat;
  std::string dims = tiling_error({4, 6}, {{{0}, {4}, 0, 4}});
  EXPECT_NE(dims.find("do not have the 2 dimensions"), std::string::npos) << dims;
  std::string huge = tiling_error({int64_t{1} << 40, int64_t{1} << 40}, {});
  EXPECT_NE(huge.find("overflows int64"), std::string::npos) << huge;
}

TEST(CheckpointTiling, TwoOwnersOfOneRegionFailTheSaveNamingTheTensor) {
  const std::string dir = ::testing::TempDir() + "sl_ckpt_owners_" + std::to_string(::getpid());
  const std::string error = message_of([&] {
    launch(2, [&](RankContext& ctx) {
      std::vector<StatePiece> pieces = make_pieces(Cut::replicated, 2, ctx.rank, 1);
      for (StatePiece& piece : pieces) piece.owner = true;  // the bug: every replica saves
      save(dir, *ctx.world, pieces, {}, "ddp");
    });
  });
  EXPECT_NE(error.find("tensor 'b' [10]: overlap: piece 0 ('b@0' in shard-00000.safetensors"), std::string::npos)
      << error;
  EXPECT_FALSE(exists(dir + "/metadata.json"));
  std::filesystem::remove_all(dir);
}

// ---- round trips: saved under one cut, loaded under another --------------------------------------

struct Reshard {
  Cut save_cut;
  int save_world;
  Cut load_cut;
  int load_world;
};
std::string reshard_name(const ::testing::TestParamInfo<Reshard>& info) {
  const Reshard& p = info.param;
  return std::string(cut_name(p.save_cut)) + std::to_string(p.save_world) + "_to_" + cut_name(p.load_cut) +
         std::to_string(p.load_world);
}

void PrintTo(const Reshard& p, std::ostream* out) { *out << reshard_name({p, 0}); }

class CheckpointReshard : public CheckpointDirTest, public ::testing::WithParamInterface<Reshard> {};

TEST_P(CheckpointReshard, LoadsEveryByteUnderTheOtherCut) {
  const Reshard& p = GetParam();
  save_model(dir_, p.save_cut, p.save_world, 3);
  Reader reader(dir_);
  EXPECT_EQ(reader.layout(), std::string(cut_name(p.save_cut)) + " x" + std::to_string(p.save_world));
  EXPECT_EQ(reader.run_state()["version"], 3);
  EXPECT_EQ(reader.tensor_names().size(), model_tensors().size());
  EXPECT_NO_THROW(reader.verify());
  EXPECT_EQ(load_model(dir_, p.load_cut, p.load_world, 3), "");
  EXPECT_EQ(load_model(dir_, p.load_cut, p.load_world, 3, {.verify = false}), "");
  // The whole tensors, as consolidate reads them.
  std::vector<StatePiece> whole = make_pieces(Cut::replicated, 1, 0, 3, false);
  for (StatePiece& piece : whole) piece.data = reader.read_tensor(piece.tensor).reshape({piece.region.numel()});
  EXPECT_EQ(check_pieces(whole, 3), "");
}

INSTANTIATE_TEST_SUITE_P(Cuts, CheckpointReshard,
                         ::testing::Values(Reshard{Cut::flat, 3, Cut::rows, 2}, Reshard{Cut::rows, 2, Cut::flat, 3},
                                           Reshard{Cut::cols, 4, Cut::flat, 1}, Reshard{Cut::replicated, 2, Cut::cols, 3},
                                           Reshard{Cut::cols, 3, Cut::cols, 2}, Reshard{Cut::flat, 1, Cut::rows, 4},
                                           Reshard{Cut::flat, 4, Cut::replicated, 3}),
                         reshard_name);

TEST_F(CheckpointDirTest, ShardsAreSafetensorsFilesOfOneDimensionalPieces) {
  save_model(dir_, Cut::rows, 2, 1);
  const std::string shard = read_file_bytes(path("shard-00001.safetensors"));
  const nn::safetensors::Header header = parse_shard_header(shard, shard.size(), "");
  EXPECT_EQ(header.metadata.at("format"), "pt");
  std::vector<std::string> keys;
  uint64_t data_end = 0;
  for (const auto& record : header.tensors) {
    keys.push_back(record.name);
    EXPECT_EQ(record.shape.size(), 1u);
    data_end = std::max(data_end, record.end);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"exp_avg.w@0", "h.0.bf@0", "ids@0", "w@0"}));  // b, scalar: rank 0's
  EXPECT_EQ(header.data_start + data_end, shard.size());  // packed, no gap (the Rust reader's rule)
}

TEST_F(CheckpointDirTest, ALoadReadsOnlyTheRangesItsPiecesShare) {
  save_model(dir_, Cut::rows, 4, 2);
  Reader reader(dir_);
  const auto& shape = reader.shape("w");  // [6, 10] in rows [0, 1) [1, 3) [3, 4) [4, 6)
  std::vector<StatePiece> piece{make_pieces(Cut::flat, 1, 0, 2, false)[0]};
  piece[0].region = Region{{0, 0}, shape, 12, 18};  // row 1 [2, 10) and row 1 is rank 1's: 6 elements only
  piece[0].data = Tensor::empty({6}, {DType::f32, Device::cpu()});
  reader.load(piece, {.verify = false});
  EXPECT_EQ(reader.data_bytes_read(), 6u * 4);
  EXPECT_EQ(check_pieces(piece, 2), "");
}

// ---- refusals: another model, another dtype, a missing tensor ------------------------------------

TEST_F(CheckpointDirTest, LoadRefusesAnotherShapeDtypeOrAMissingTensorNamingBoth) {
  save_model(dir_, Cut::flat, 2, 1);
  Reader reader(dir_);
  std::vector<StatePiece> pieces = make_pieces(Cut::flat, 1, 0, 1, false);
  std::vector<StatePiece> wider{pieces[0]};
  wider[0].global_shape = {6, 12}, wider[0].region = Region{{0, 0}, {6, 12}, 0, 72};
  wider[0].data = Tensor::empty({72}, {DType::f32, Device::cpu()});
  expect_error([&] { reader.load(wider); }, "tensor 'w': the checkpoint's shape [6,10] differs from the model's [6,12]");
  std::vector<StatePiece> half{pieces[0]};
  half[0].data = Tensor::empty({60}, {DType::bf16, Device::cpu()});
  expect_error([&] { reader.load(half); }, "tensor 'w': the checkpoint holds F32 but the model's piece is BF16");
  std::vector<StatePiece> missing{pieces[0]};
  missing[0].tensor = "exp_avg_sq.w";
  expect_error([&] { reader.load(missing); }, "has no tensor 'exp_avg_sq.w'");
  std::vector<StatePiece> outside{pieces[0]};
  outside[0].region.flat_end = 61;
  expect_error([&] { reader.load(outside); }, "flat range [0, 61) is not inside the box's 60 elements");
  expect_error([] { Reader("/nonexistent/sl_checkpoint"); }, "no metadata.json");
}

// ---- corruption: flipped bytes, a missing shard, hostile metadata.json ---------------------------

TEST_F(CheckpointDirTest, AFlippedByteInAnyShardIsNamedByVerifyAndByLoad) {
  save_model(dir_, Cut::rows, 3, 5);
  const Reader clean(dir_);
  for (const auto& [file, record] : clean.metadata().files) {
    const std::string original = read_file_bytes(path(file));
    // A byte of the length, of the header, and of the data (first, middle, last).
    for (size_t at : {size_t{3}, size_t{20}, size_t{original.size() - 40}, original.size() / 2 + 5, original.size() - 1}) {
      std::string bad = original;
      bad[at] = static_cast<char>(bad[at] ^ 0x10);
      write_file_bytes(path(file), bad);
      const Reader reader(dir_);
      const std::string verify_error = message_of([&] { reader.verify(); });
      EXPECT_NE(verify_error.find(file + " (holding "), std::string::npos) << at << ": " << verify_error;
      EXPECT_NE(verify_error.find("(holding " + clean.metadata().tensors_in(file) + ")"), std::string::npos)
          << verify_error;
      const std::string load_error = message_of([&] { load_model(dir_, Cut::flat, 2, 5); });
      EXPECT_NE(load_error.find(file + " (holding "), std::string::npos) << at << ": " << load_error;
      EXPECT_NE(load_error.find("SHA-256 mismatch"), std::string::npos) << at << ": " << load_error;
    }
    write_file_bytes(path(file), original);
  }
  EXPECT_NO_THROW(Reader(dir_).verify());
}

TEST_F(CheckpointDirTest, AMissingOrTruncatedShardIsNamed) {
  save_model(dir_, Cut::flat, 2, 1);
  const std::string shard = path("shard-00001.safetensors"), bytes = read_file_bytes(shard);
  write_file_bytes(shard, bytes.substr(0, bytes.size() - 4));
  expect_error([&] { Reader(dir_).verify(); }, "shard-00001.safetensors (holding b, exp_avg.w, h.0.bf, ids, scalar, w): "
                                               "the file is " + std::to_string(bytes.size() - 4) + " bytes but metadata.json says " +
                                               std::to_string(bytes.size()));
  expect_error([&] { load_model(dir_, Cut::rows, 1, 1, {.verify = false}); }, "truncated or replaced");
  std::remove(shard.c_str());
  expect_error([&] { Reader(dir_).verify(); }, "shard-00001.safetensors (holding b, exp_avg.w");
  expect_error([&] { load_model(dir_, Cut::rows, 2, 1); }, "shard-00001.safetensors (holding b, exp_avg.w, h.0.bf, ids, scalar, w): the file is missing");
  expect_error([&] { load_model(dir_, Cut::rows, 2, 1, {.verify = false}); }, "the file is missing");
}

struct MetadataCase {
  std::string name;
  std::function<void(nlohmann::json&)> edit;
  std::string expected;  // a substring of the error
};

void PrintTo(const MetadataCase& c, std::ostream* out) { *out << c.name; }

class CheckpointMetadata : public CheckpointDirTest, public ::testing::WithParamInterface<MetadataCase> {};

TEST_P(CheckpointMetadata, IsRefusedNamingWhatIsWrong) {
  save_model(dir_, Cut::cols, 2, 1);
  nlohmann::json document = nlohmann::json::parse(read_file_bytes(path("metadata.json")));
  GetParam().edit(document);
  write_file_bytes(path("metadata.json"), document.is_string() ? document.get<std::string>() : document.dump());
  expect_error([&] { Reader reader(dir_); }, GetParam().expected);
  EXPECT_FALSE(newest_complete(dir_).has_value());
}

nlohmann::json& first_piece(nlohmann::json& d) { return d["tensors"]["w"]["pieces"][0]; }
std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

INSTANTIATE_TEST_SUITE_P(
    Hostile, CheckpointMetadata,
    ::testing::Values(
        MetadataCase{"bad_json", [](nlohmann::json& d) { d = d.dump().substr(0, 100); }, "metadata.json: not valid JSON"},
        MetadataCase{"not_an_object", [](nlohmann::json& d) { d = "[1, 2]"; }, "the document must be a JSON object, got array"},
        MetadataCase{"deep_nesting", [](nlohmann::json& d) { d = "{\"run_state\": " + nested(100000) + "}"; },
                     "JSON nested deeper than 64 levels"},
        MetadataCase{"wrong_format", [](nlohmann::json& d) { d["format"] = "zip"; }, "\"format\" is not"},
        MetadataCase{"newer_version", [](nlohmann::json& d) { d["version"] = 2; }, "format version 2, but this reader reads version 1"},
        MetadataCase{"version_string", [](nlohmann::json& d) { d["version"] = "1"; }, "\"version\" must be an integer"},
        MetadataCase{"world_zero", [](nlohmann::json& d) { d["world_size"] = 0; }, "\"world_size\" 0 is not in [1,"},
        MetadataCase{"shape_string", [](nlohmann::json& d) { d["tensors"]["w"]["shape"] = "6x10"; },
                     "tensor 'w': \"shape\" must be an array of integers"},
        MetadataCase{"shape_float", [](nlohmann::json& d) { d["tensors"]["w"]["shape"][0] = 6.5; }, "\"shape\" entry must be an integer"},
        MetadataCase{"huge_shape", [](nlohmann::json& d) { d["tensors"]["w"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40}; },
                     "tensor 'w': shape [1099511627776, 1099511627776] overflows int64"},
        MetadataCase{"huge_number", [](nlohmann::json& d) { d["tensors"]["w"]["shape"][0] = 1e300; }, "\"shape\" entry must be an integer"},
        MetadataCase{"uint64_max", [](nlohmann::json& d) { d["tensors"]["w"]["pieces"][0]["flat_end"] = UINT64_MAX; },
                     "\"flat_end\" must be an integer in int64, got 18446744073709551615"},
        MetadataCase{"negative_offset", [](nlohmann::json& d) { first_piece(d)["offsets"][0] = -1; }, "tensor 'w' [6, 10]: piece 0"},
        MetadataCase{"negative_bytes", [](nlohmann::json& d) { d["files"]["shard-00000.safetensors"]["bytes"] = -5; },
                     "\"bytes\" must not be negative, got -5"},
        MetadataCase{"small_file", [](nlohmann::json& d) { d["files"]["shard-00000.safetensors"]["bytes"] = 10; },
                     "file 'shard-00000.safetensors' is listed as 10 bytes, too small"},
        MetadataCase{"bad_sha", [](nlohmann::json& d) { d["files"]["shard-00000.safetensors"]["sha256"] = "abc"; },
                     "\"sha256\" is not 64 lowercase hex digits"},
        MetadataCase{"path_traversal", [](nlohmann::json& d) { d["files"]["../../etc/passwd"] = d["files"]["shard-00000.safetensors"]; },
                     "file '../../etc/passwd': not a shard name"},
        MetadataCase{"unlisted_file", [](nlohmann::json& d) { first_piece(d)["file"] = "shard-00007.safetensors"; },
                     "names file 'shard-00007.safetensors', which \"files\" does not list"},
        MetadataCase{"duplicate_key", [](nlohmann::json& d) { d["tensors"]["w"]["pieces"][1]["key"] = first_piece(d)["key"];
                                                    d["tensors"]["w"]["pieces"][1]["file"] = first_piece(d)["file"]; },
                     "is used twice"},
        MetadataCase{"unknown_dtype", [](nlohmann::json& d) { d["tensors"]["w"]["dtype"] = "F8"; }, "tensor 'w': unknown dtype 'F8'"},
        MetadataCase{"missing_pieces", [](nlohmann::json& d) { d["tensors"]["w"].erase("pieces"); }, "tensor 'w': missing \"pieces\""},
        MetadataCase{"gap", [](nlohmann::json& d) { d["tensors"]["w"]["pieces"].erase(1); }, "tensor 'w' [6, 10]: gap"},
        MetadataCase{"overlap", [](nlohmann::json& d) { first_piece(d)["flat_end"] = first_piece(d)["flat_end"].get<int>() + 1; },
                     "tensor 'w' [6, 10]: overlap: piece 0"},
        MetadataCase{"run_state_array", [](nlohmann::json& d) { d["run_state"] = {1, 2}; }, "\"run_state\" must be a JSON object"},
        MetadataCase{"missing_run_state", [](nlohmann::json& d) { d.erase("run_state"); }, "missing \"run_state\""}),
    [](const auto& info) { return info.param.name; });

TEST_F(CheckpointDirTest, AShardWhoseHeaderDisagreesWithMetadataIsNamed) {
  save_model(dir_, Cut::flat, 1, 1);
  nlohmann::json document = nlohmann::json::parse(read_file_bytes(path("metadata.json")));
  document["tensors"]["w"]["pieces"][0]["key"] = "b@0";  // b's bytes for w: the wrong size
  document["tensors"]["b"]["pieces"][0]["key"] = "w@0";
  write_file_bytes(path("metadata.json"), document.dump());
  {
    nlohmann::json unknown = document;
    unknown["tensors"]["b"]["pieces"][0]["key"] = "w@7";
    write_file_bytes(path("metadata.json"), unknown.dump());
    expect_error([&] { Reader(dir_).verify(); }, "shard-00000.safetensors (holding b, exp_avg.w, h.0.bf, ids, scalar, w): "
                                                 "holds no tensor 'w@7'");
    write_file_bytes(path("metadata.json"), document.dump());
  }
  expect_error([&] { Reader(dir_).verify(); }, "tensor 'b': key 'w@0' is F32 [60] but metadata.json says F32 [10]");
  expect_error([&] { load_model(dir_, Cut::flat, 1, 1, {.verify = false}); }, "tensor 'w': key 'b@0' is F32 [10]");
}

// ---- crash safety: failures injected at every point of a save ------------------------------------

struct KillPoint {
  std::string point;
  int rank;
};
std::string kill_name(const ::testing::TestParamInfo<KillPoint>& info) {
  std::string name = info.param.point + "_rank" + std::to_string(info.param.rank);
  for (char& c : name)
    if (c == '.') c = '_';
  return name;
}

void PrintTo(const KillPoint& p, std::ostream* out) { *out << p.point << " on rank " << p.rank; }

// Throws at `point` on `rank` while `save` runs; returns the error.
std::string fail_at(const KillPoint& kill, const std::function<void()>& save) {
  set_fault_hook([&](const std::string& point, int rank) {
    if (point == kill.point && rank == kill.rank) throw Error("injected failure at " + point);
  });
  const std::string error = message_of(save);
  set_fault_hook({});
  return error;
}

const std::vector<KillPoint> kSavePoints = {
    {"shard.begin", 0},         {"shard.begin", 1},           {"shard.mid", 0},
    {"shard.mid", 1},           {"shard.before_rename", 0},   {"shard.before_rename", 1},
    {"metadata.before_rename", 0}, {"metadata.after_rename", 0}};
const std::vector<KillPoint> kStepPoints = {{"step.before_rename", 0}, {"step.after_rename", 0}};

class CheckpointKill : public CheckpointDirTest, public ::testing::WithParamInterface<KillPoint> {};

TEST_P(CheckpointKill, ThePreviousStepSurvivesAndAPartialOneIsNeverReturned) {
  save_model(dir_, Cut::flat, 2, 1, 10);
  const std::string error = fail_at(GetParam(), [&] { save_model(dir_, Cut::rows, 2, 2, 20); });
  EXPECT_NE(error.find("injected failure at " + GetParam().point), std::string::npos) << error;
  const bool complete = GetParam().point == "step.after_rename";  // the rename was the commit
  const std::optional<std::string> newest = newest_complete(dir_);
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(*newest, path(step_directory_name(complete ? 20 : 10)));
  EXPECT_EQ(exists(path("step-00000020")), complete);
  EXPECT_NO_THROW(Reader(*newest).verify());
  EXPECT_EQ(load_model(*newest, Cut::cols, 3, complete ? 2 : 1), "");
  // The next save completes; keep_last(1) then leaves it alone: older steps and the partial one are gone.
  save_model(dir_, Cut::flat, 3, 3, 30, 1);
  EXPECT_EQ(list_directory(dir_, ""), std::vector<std::string>{"step-00000030"});
  EXPECT_EQ(load_model(*newest_complete(dir_), Cut::rows, 2, 3), "");
}

std::vector<KillPoint> every_point() {
  std::vector<KillPoint> points = kSavePoints;
  points.insert(points.end(), kStepPoints.begin(), kStepPoints.end());
  return points;
}
INSTANTIATE_TEST_SUITE_P(Points, CheckpointKill, ::testing::ValuesIn(every_point()), kill_name);

// save() into one directory, without step directories: the metadata-last rule alone.
class CheckpointKillInPlace : public CheckpointDirTest, public ::testing::WithParamInterface<KillPoint> {};

TEST_P(CheckpointKillInPlace, ADirectoryIsACheckpointOnlyOnceItsMetadataIsRenamedIn) {
  save_model(dir_, Cut::flat, 2, 1);
  const std::string error = fail_at(GetParam(), [&] { save_model(dir_, Cut::cols, 2, 2); });
  EXPECT_NE(error.find("injected failure at " + GetParam().point), std::string::npos) << error;
  if (GetParam().point == "metadata.after_rename") {
    EXPECT_EQ(newest_complete(dir_), std::optional<std::string>(dir_));
    EXPECT_NO_THROW(Reader(dir_).verify());
    EXPECT_EQ(load_model(dir_, Cut::rows, 3, 2), "");
  } else {
    EXPECT_FALSE(newest_complete(dir_).has_value());
    expect_error([&] { Reader reader(dir_); }, "no metadata.json");
  }
}
INSTANTIATE_TEST_SUITE_P(Points, CheckpointKillInPlace, ::testing::ValuesIn(kSavePoints), kill_name);

TEST_F(CheckpointDirTest, SavingAStepAgainReplacesItWhole) {
  save_model(dir_, Cut::flat, 2, 1, 10);
  save_model(dir_, Cut::rows, 3, 2, 10);
  EXPECT_EQ(list_directory(dir_, ""), std::vector<std::string>{"step-00000010"});
  EXPECT_EQ(load_model(path("step-00000010"), Cut::flat, 1, 2), "");
  expect_error([&] { keep_last(dir_, 0); }, "keep 0 must be at least 1");
  EXPECT_FALSE(newest_complete(path("nothing")).has_value());
}

// ---- crash safety: a real writer killed with SIGKILL ---------------------------------------------

// A megabyte of weights beside the model's tensors, so that a save takes a while to write.
std::vector<GlobalTensor> kill_tensors() {
  std::vector<GlobalTensor> tensors = model_tensors();
  tensors.push_back({"big", {512, 512}, DType::f32});
  return tensors;
}

// The writer the SIGKILL test starts (disabled: it runs only when that test asks for it). It saves
// step after step into $SL_CHECKPOINT_KILL_ROOT, each save's bytes its step's, until it is killed.
// With $SL_CHECKPOINT_KILL_PARK=POINT it stops for good at fault point POINT (rank 0) of its first
// save, after creating the file $SL_CHECKPOINT_KILL_PARKED: the test then kills it there, inside a
// save, however slow or loaded the machine is.
TEST(CheckpointKillChild, DISABLED_SavesUntilKilled) {
  const char* root = std::getenv("SL_CHECKPOINT_KILL_ROOT");
  if (root == nullptr) return;
  const char *park = std::getenv("SL_CHECKPOINT_KILL_PARK"), *parked = std::getenv("SL_CHECKPOINT_KILL_PARKED");
  set_fault_hook([&](const std::string& point, int rank) {
    if (point == "shard.mid") std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (park != nullptr && parked != nullptr && point == park && rank == 0) {
      std::ofstream(parked) << point;
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // until the SIGKILL
    }
  });
  const std::vector<std::pair<int64_t, std::string>> done = complete_steps(root);
  for (int64_t step = done.empty() ? 1 : done.front().first + 1; step < 100000; ++step)
    launch(2, [&](RankContext& ctx) {
      const int version = static_cast<int>(step % 1000);
      const Cut cut = step % 2 ? Cut::flat : Cut::rows;
      save_step(root, step, *ctx.world, make_pieces(cut, 2, ctx.rank, version, true, kill_tensors()),
                {{"version", version}}, "kill test", 2);
    });
}

// Starts the writer above on root (parking at `park` when it is not empty, and saying so in `parked`).
pid_t start_writer(const std::string& root, const std::string& park = "", const std::string& parked = "") {
  std::vector<std::string> env_strings{"SL_CHECKPOINT_KILL_ROOT=" + root};
  if (!park.empty())
    env_strings.insert(env_strings.end(), {"SL_CHECKPOINT_KILL_PARK=" + park, "SL_CHECKPOINT_KILL_PARKED=" + parked});
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  std::vector<char*> env;
  for (std::string& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=CheckpointKillChild.DISABLED_SavesUntilKilled",
              disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {exe.data(), filter.data(), disabled.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int result = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, env.data());
  posix_spawn_file_actions_destroy(&actions);
  return result == 0 ? pid : -1;
}

// A step-N.partial in dir: a save is under way (or was, when its writer died).
bool save_under_way(const std::string& dir) {
  for (const std::string& name : list_directory(dir, ""))
    if (name.ends_with(".partial")) return true;
  return false;
}

// Kills the writer with SIGKILL (it must not have ended by itself), then checks what it left: the
// newest complete checkpoint verifies and loads exactly. Returns whether the kill landed inside a save.
bool kill_and_check(const std::string& dir, pid_t writer) {
  EXPECT_EQ(::kill(writer, SIGKILL), 0);
  int status = 0;
  EXPECT_EQ(::waitpid(writer, &status, 0), writer);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer ended by itself: " << status;
  const bool saving = save_under_way(dir);
  const std::optional<std::string> newest = newest_complete(dir);
  EXPECT_TRUE(newest.has_value());
  if (!newest) return saving;
  const Reader reader(*newest);
  EXPECT_NO_THROW(reader.verify()) << *newest;
  const int version = reader.run_state()["version"];
  std::vector<StatePiece> pieces = make_pieces(Cut::cols, 1, 0, version, false, kill_tensors());
  reader.load(pieces);
  EXPECT_EQ(check_pieces(pieces, version, kill_tensors()), "") << *newest;
  return saving;
}

// Three kills at moments chosen by the clock (1, 10 and 19 ms after a save was seen to start: where
// they land depends on the machine's speed and load, so only what they leave is checked), then one
// at each of four points inside a save, where the writer waits to be killed (these land inside a
// save on any machine: each is required to), on top of the checkpoints the first three left. Every
// kill leaves the newest complete checkpoint intact.
TEST_F(CheckpointDirTest, AWriterKilledWithSigkillLeavesTheNewestCompleteCheckpointIntact) {
  // How long one writer may take to reach its kill: only a broken one takes anywhere near that.
  auto give_up_at = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(60); };
  int timed_inside = 0;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("kill " + std::to_string(1 + 9 * round) + " ms into a save");
    const auto give_up = give_up_at();
    const int64_t before = complete_steps(dir_).empty() ? 0 : complete_steps(dir_).front().first;
    const pid_t writer = start_writer(dir_);
    ASSERT_GT(writer, 0);
    while ((complete_steps(dir_).empty() || complete_steps(dir_).front().first < before + 2) &&
           std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    while (!save_under_way(dir_) && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + 9 * round));  // somewhere inside that save
    timed_inside += kill_and_check(dir_, writer);
  }
  std::printf("[          ] %d of 3 kills timed by the clock landed inside a save\n", timed_inside);
  ASSERT_FALSE(complete_steps(dir_).empty());
  const std::string parked = dir_ + ".parked";  // beside the root: not a name in it
  for (const std::string point : {"shard.mid", "shard.before_rename", "metadata.before_rename", "step.before_rename"}) {
    SCOPED_TRACE("kill at " + point);
    std::remove(parked.c_str());
    // The partial save an earlier kill left (the library sweeps those after a complete save, which
    // these writers never reach) goes first, so that a step-N.partial after the kill is this writer's.
    for (const std::string& name : list_directory(dir_, ""))
      if (name.ends_with(".partial")) std::filesystem::remove_all(path(name));
    const auto give_up = give_up_at();
    const pid_t writer = start_writer(dir_, point, parked);
    ASSERT_GT(writer, 0);
    while (!std::filesystem::exists(parked) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_TRUE(std::filesystem::exists(parked)) << "the writer never reached " << point;
    EXPECT_TRUE(kill_and_check(dir_, writer)) << "the kill at " << point << " did not land inside a save";
  }
  std::remove(parked.c_str());
}

}  // namespace
}  // namespace sl::parallel::checkpoint
