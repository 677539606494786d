// metadata.cpp — metadata.json written and parsed (see metadata.h).
#include "parallel/checkpoint/metadata.h"

#include <cctype>
#include <cstdio>
#include <set>
#include <utility>

#include "parallel/checkpoint/regions.h"
#include "tensor/error.h"

namespace sl::parallel::checkpoint {
namespace {

using json = nlohmann::json;
using detail::concat;

// A JSON value in an error message, cut short (a hostile file may hold megabytes of it).
std::string brief(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() <= 40 ? text : text.substr(0, 40) + "...";
}

const json& field(const json& object, const char* key, const std::string& at) {
  SL_CHECK(object.is_object(), at, "expected a JSON object, got ", brief(object));
  auto found = object.find(key);
  SL_CHECK(found != object.end(), at, "missing \"", key, "\"");
  return *found;
}

int64_t as_int(const json& value, const std::string& what, const std::string& at) {
  SL_CHECK(value.is_number_integer() && (!value.is_number_unsigned() || value.get<uint64_t>() <= INT64_MAX), at,
           what, " must be an integer in int64, got ", brief(value));
  return value.get<int64_t>();
}

uint64_t as_count(const json& value, const std::string& what, const std::string& at) {
  const int64_t count = as_int(value, what, at);
  SL_CHECK(count >= 0, at, what, " must not be negative, got ", count);
  return static_cast<uint64_t>(count);
}

std::string as_string(const json& value, const std::string& what, const std::string& at) {
  SL_CHECK(value.is_string(), at, what, " must be a string, got ", brief(value));
  return value.get<std::string>();
}

std::vector<int64_t> as_int_list(const json& value, const std::string& what, const std::string& at) {
  SL_CHECK(value.is_array(), at, what, " must be an array of integers, got ", brief(value));
  SL_CHECK(value.size() <= kMaxDims, at, what, " has ", value.size(), " entries (at most ", kMaxDims, ")");
  std::vector<int64_t> list;
  for (const json& entry : value) list.push_back(as_int(entry, what + " entry", at));
  return list;
}

bool is_hex_digest(const std::string& text) {
  if (text.size() != 64) return false;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) return false;
  return true;
}

SavedPiece parse_piece(const json& entry, const std::string& at) {
  SavedPiece piece;
  piece.file = as_string(field(entry, "file", at), "\"file\"", at);
  piece.key = as_string(field(entry, "key", at), "\"key\"", at);
  piece.region.offsets = as_int_list(field(entry, "offsets", at), "\"offsets\"", at);
  piece.region.lengths = as_int_list(field(entry, "lengths", at), "\"lengths\"", at);
  piece.region.flat_begin = as_int(field(entry, "flat_begin", at), "\"flat_begin\"", at);
  piece.region.flat_end = as_int(field(entry, "flat_end", at), "\"flat_end\"", at);
  return piece;
}

// One tensor's entry: its shape and dtype, its pieces read and checked to tile it.
SavedTensor parse_tensor(const std::string& name, const json& entry, const Metadata& metadata,
                         std::set<std::pair<std::string, std::string>>& keys, const std::string& where) {
  const std::string at = concat(where, "tensor '", name, "': ");
  SavedTensor tensor;
  tensor.shape = as_int_list(field(entry, "shape", at), "\"shape\"", at);
  checked_numel(tensor.shape, at);
  tensor.dtype = parse_dtype_label(as_string(field(entry, "dtype", at), "\"dtype\"", at), at);
  const json& pieces = field(entry, "pieces", at);
  SL_CHECK(pieces.is_array(), at, "\"pieces\" must be an array, got ", brief(pieces));
  SL_CHECK(pieces.size() <= kMaxPiecesPerTensor, at, pieces.size(), " pieces (at most ", kMaxPiecesPerTensor, ")");
  for (size_t i = 0; i < pieces.size(); ++i) {
    SavedPiece piece = parse_piece(pieces[i], concat(at, "piece ", i, ": "));
    SL_CHECK(metadata.files.count(piece.file), at, "piece ", i, " names file '", piece.file,
             "', which \"files\" does not list");
    SL_CHECK(keys.emplace(piece.file, piece.key).second, at, "piece ", i, ": key '", piece.key, "' of '", piece.file,
             "' is used twice");
    tensor.pieces.push_back(std::move(piece));
  }
  std::vector<Region> regions;
  for (const SavedPiece& piece : tensor.pieces) regions.push_back(piece.region);
  check_tiling(name, tensor.shape, regions, [&](size_t i) {
    return concat("piece ", i, " ('", tensor.pieces[i].key, "' in ", tensor.pieces[i].file, ", ",
                  describe(tensor.pieces[i].region), ")");
  });
  return tensor;
}

// Every piece's bytes must fit in its file: a first bound on what a load may read from it.
void check_file_budgets(const Metadata& metadata, const std::string& where) {
  std::map<std::string, uint64_t> used;
  for (const auto& [name, tensor] : metadata.tensors)
    for (const SavedPiece& piece : tensor.pieces) {
      // numel < 2^63 and an element is at most 8 bytes: bound numel first so the product fits.
      SL_CHECK(piece.region.numel() <= INT64_MAX / 8, where, "tensor '", name, "': piece '", piece.key, "' is too large");
      const uint64_t bytes = static_cast<uint64_t>(piece.region.numel()) * dtype_size(tensor.dtype);
      uint64_t& total = used[piece.file];
      SL_CHECK(!__builtin_add_overflow(total, bytes, &total) && total <= metadata.files.at(piece.file).bytes, where,
               "file '", piece.file, "' is listed as ", metadata.files.at(piece.file).bytes,
               " bytes, too small for the pieces it holds (tensor '", name, "', key '", piece.key, "')");
    }
}

}  // namespace

std::string Metadata::tensors_in(const std::string& file) const {
  std::string names;
  for (const auto& [name, tensor] : tensors)
    for (const SavedPiece& piece : tensor.pieces)
      if (piece.file == file) {
        names += (names.empty() ? "" : ", ") + name;
        break;
      }
  return names.empty() ? "(no tensors)" : names;
}

std::string dtype_label(DType dtype) {
  std::string label = dtype_name(dtype);
  for (char& c : label) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return label;
}

DType parse_dtype_label(const std::string& label, const std::string& where) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64})
    if (dtype_label(dtype) == label) return dtype;
  throw Error(concat(where, "unknown dtype '", label.substr(0, 40), "' (F32, F64, BF16, F16, I32 or I64)"));
}

std::string shard_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05d.safetensors", rank);
  return name;
}

bool is_shard_file_name(const std::string& name) {
  const std::string prefix = "shard-", suffix = ".safetensors";
  if (name.size() != prefix.size() + 5 + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  for (size_t i = prefix.size(); i < prefix.size() + 5; ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  return true;
}

std::string metadata_text(const Metadata& metadata) {
  json files = json::object(), tensors = json::object();
  for (const auto& [name, file] : metadata.files) files[name] = {{"bytes", file.bytes}, {"sha256", file.sha256}};
  for (const auto& [name, tensor] : metadata.tensors) {
    json pieces = json::array();
    for (const SavedPiece& piece : tensor.pieces)
      pieces.push_back({{"file", piece.file}, {"key", piece.key}, {"offsets", piece.region.offsets},
                        {"lengths", piece.region.lengths}, {"flat_begin", piece.region.flat_begin},
                        {"flat_end", piece.region.flat_end}});
    tensors[name] = {{"shape", tensor.shape}, {"dtype", dtype_label(tensor.dtype)}, {"pieces", std::move(pieces)}};
  }
  const json document = {{"format", kFormatName},       {"version", metadata.version},
                         {"layout", metadata.layout},    {"world_size", metadata.world_size},
                         {"files", std::move(files)},    {"tensors", std::move(tensors)},
                         {"run_state", metadata.run_state}};
  return document.dump(1) + "\n";
}

Metadata parse_metadata(const std::string& text, const std::string& where) {
  SL_CHECK(text.size() <= kMaxMetadataBytes, where, text.size(), " bytes, over the limit of ", kMaxMetadataBytes);
  json document;
  try {  // nesting is bounded as it is parsed: printing and destroying a value recurse
    document = json::parse(text, [&](int depth, json::parse_event_t, json&) {
      SL_CHECK(depth <= kMaxJsonDepth, where, "JSON nested deeper than ", kMaxJsonDepth, " levels");
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(concat(where, "not valid JSON (", e.what(), ")"));
  }
  SL_CHECK(document.is_object(), where, "the document must be a JSON object, got ", document.type_name());
  SL_CHECK(as_string(field(document, "format", where), "\"format\"", where) == kFormatName, where,
           "\"format\" is not \"", kFormatName, "\"");
  Metadata metadata;
  const int64_t version = as_int(field(document, "version", where), "\"version\"", where);
  SL_CHECK(version == kFormatVersion, where, "format version ", version, ", but this reader reads version ",
           kFormatVersion);
  metadata.layout = as_string(field(document, "layout", where), "\"layout\"", where);
  metadata.world_size = as_int(field(document, "world_size", where), "\"world_size\"", where);
  SL_CHECK(metadata.world_size >= 1 && metadata.world_size <= kMaxWorldSize, where, "\"world_size\" ",
           metadata.world_size, " is not in [1, ", kMaxWorldSize, "]");
  const json& files = field(document, "files", where);
  SL_CHECK(files.is_object(), where, "\"files\" must be an object, got ", brief(files));
  for (const auto& [name, entry] : files.items()) {
    const std::string at = concat(where, "file '", name, "': ");
    SL_CHECK(is_shard_file_name(name), at, "not a shard name (shard-NNNNN.safetensors)");
    SavedFile file{as_count(field(entry, "bytes", at), "\"bytes\"", at),
                   as_string(field(entry, "sha256", at), "\"sha256\"", at)};
    SL_CHECK(is_hex_digest(file.sha256), at, "\"sha256\" is not 64 lowercase hex digits");
    metadata.files.emplace(name, std::move(file));
  }
  const json& tensors = field(document, "tensors", where);
  SL_CHECK(tensors.is_object(), where, "\"tensors\" must be an object, got ", brief(tensors));
  std::set<std::pair<std::string, std::string>> keys;
  for (const auto& [name, entry] : tensors.items())
    metadata.tensors.emplace(name, parse_tensor(name, entry, metadata, keys, where));
  check_file_budgets(metadata, where);
  field(document, "run_state", where);
  json& run_state = document["run_state"];
  SL_CHECK(run_state.is_object(), where, "\"run_state\" must be a JSON object, got ", brief(run_state));
  metadata.run_state = std::move(run_state);
  return metadata;
}

}  // namespace sl::parallel::checkpoint
