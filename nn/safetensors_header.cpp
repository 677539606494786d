// safetensors_header.cpp — parsing and checking the JSON header, and writing it (see safetensors_header.h).
#include "nn/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "tensor/error.h"

namespace sl::nn::safetensors {
namespace {

using json = nlohmann::json;
using detail::concat;

constexpr int kMaxHeaderDepth = 64;  // deeper nesting is an attack: brief() would recurse that deep

// rank is the reference writer's dtype order: tensors are written widest (highest rank) first.
struct DTypeInfo {
  DType dtype;
  const char* name;
  int rank;
};
constexpr DTypeInfo kDTypes[] = {{DType::f16, "F16", 0}, {DType::bf16, "BF16", 1}, {DType::i32, "I32", 2},
                                 {DType::f32, "F32", 3}, {DType::f64, "F64", 4},   {DType::i64, "I64", 5}};

const DTypeInfo& info_of(DType dtype) {
  for (const DTypeInfo& info : kDTypes)
    if (info.dtype == dtype) return info;
  detail::throw_internal("every DType has a safetensors name", __FILE__, __LINE__);
}

// A JSON value shown in an error message, cut short: a hostile header may hold megabytes of it.
std::string brief(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() <= 40 ? text : text.substr(0, 40) + "...";
}

// A JSON non-negative integer, or nothing (negative, fractional, string, bool, ...).
std::optional<uint64_t> as_count(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  return std::nullopt;
}

// ---- reading ------------------------------------------------------------------------------------

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& where) {
  SL_CHECK(value.is_object(), where, "\"__metadata__\" must be an object of string to string, got ", brief(value));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    SL_CHECK(text.is_string(), where, "\"__metadata__\" must map strings to strings, but key '", key, "' holds ",
             brief(text));
    metadata[key] = text.get<std::string>();
  }
  return metadata;
}

TensorRecord parse_entry(const std::string& name, const json& entry, uint64_t data_bytes, const std::string& where) {
  std::string at = concat(where, "tensor '", name, "': ");
  SL_CHECK(entry.is_object(), at, "the entry must be a JSON object, got ", brief(entry));
  for (const char* key : {"dtype", "shape", "data_offsets"}) SL_CHECK(entry.contains(key), at, "missing \"", key, "\"");
  TensorRecord record;
  record.name = name;

  const json& dtype = entry["dtype"];
  SL_CHECK(dtype.is_string(), at, "\"dtype\" must be a string, got ", brief(dtype));
  const DTypeInfo* info = nullptr;
  for (const DTypeInfo& candidate : kDTypes)
    if (dtype.get<std::string>() == candidate.name) info = &candidate;
  SL_CHECK(info != nullptr, at, "unknown dtype ", brief(dtype), " (shardlab reads F32, F64, BF16, F16, I32, I64)");
  record.dtype = info->dtype;

  // numel and bytes with overflow-checked products: a hostile shape must not wrap around to a small size.
  const json& shape = entry["shape"];
  SL_CHECK(shape.is_array(), at, "\"shape\" must be an array, got ", brief(shape));
  int64_t numel = 1;
  for (const json& size : shape) {
    std::optional<uint64_t> count = as_count(size);
    SL_CHECK(count && *count <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), at, "shape entry ",
             brief(size), " is not a non-negative integer (shape ", brief(shape), ")");
    SL_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(*count), &numel), at, "shape ", brief(shape),
             " overflows int64 (its element count)");
    record.shape.push_back(static_cast<int64_t>(*count));
  }
  int64_t nbytes = 0;
  SL_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(record.dtype)), &nbytes), at, "shape ",
           record.shape, " of ", info->name, " overflows int64 in bytes");

  const json& offsets = entry["data_offsets"];
  SL_CHECK(offsets.is_array() && offsets.size() == 2, at, "\"data_offsets\" must be [begin, end], got ",
           brief(offsets));
  std::optional<uint64_t> begin = as_count(offsets[0]), end = as_count(offsets[1]);
  SL_CHECK(begin && end, at, "\"data_offsets\" ", brief(offsets), " must be non-negative integers [begin, end]");
  SL_CHECK(*begin <= *end, at, "data_offsets [", *begin, ", ", *end, "]: begin ", *begin, " > end ", *end);
  SL_CHECK(*end <= data_bytes, at, "data_offsets [", *begin, ", ", *end, "] run past the end of the data buffer (",
           data_bytes, " bytes)");
  SL_CHECK(*end - *begin == static_cast<uint64_t>(nbytes), at, "data_offsets [", *begin, ", ", *end, "] hold ",
           *end - *begin, " bytes but shape ", record.shape, " of ", info->name, " needs ", nbytes);
  record.begin = *begin;
  record.end = *end;
  return record;
}

// Two tensors may not share bytes. Sorted by begin, it is enough that each starts at or after the
// previous one's end. Empty tensors own no bytes and cannot overlap anything.
void check_no_overlap(const std::vector<TensorRecord>& tensors, const std::string& where) {
  std::vector<const TensorRecord*> by_begin;
  for (const TensorRecord& record : tensors)
    if (record.end > record.begin) by_begin.push_back(&record);
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorRecord* a, const TensorRecord* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const TensorRecord& previous = *by_begin[i - 1];
    const TensorRecord& current = *by_begin[i];
    SL_CHECK(current.begin >= previous.end, where, "tensors '", previous.name, "' (data_offsets [", previous.begin,
             ", ", previous.end, "]) and '", current.name, "' (data_offsets [", current.begin, ", ", current.end,
             "]) overlap");
  }
}

}  // namespace

Header parse_header(const std::string& text, uint64_t file_size, const std::string& where) {
  json parsed;
  try {  // a header is 3 levels deep; a deeper one is refused as it is read (printing one recurses)
    parsed = json::parse(text, [&](int depth, json::parse_event_t, json&) {
      SL_CHECK(depth <= kMaxHeaderDepth, where, "the header nests JSON deeper than ", kMaxHeaderDepth, " levels");
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(concat(where, "the header is not valid JSON (", e.what(), ")"));
  }
  SL_CHECK(parsed.is_object(), where, "the header is not a JSON object (it is ", parsed.type_name(), ")");

  Header header;
  header.data_start = 8 + text.size();
  uint64_t data_bytes = file_size - header.data_start;
  for (const auto& [name, entry] : parsed.items()) {
    if (name == "__metadata__")
      header.metadata = parse_metadata(entry, where);
    else
      header.tensors.push_back(parse_entry(name, entry, data_bytes, where));
  }
  check_no_overlap(header.tensors, where);
  return header;
}

// ---- writing ------------------------------------------------------------------------------------

int write_rank(DType dtype) { return info_of(dtype).rank; }

std::string format_header(const std::vector<TensorRecord>& tensors, const std::map<std::string, std::string>& metadata,
                          const std::string& where) {
  // ordered_json keeps insertion order: __metadata__ first, then the tensors in data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const TensorRecord& record : tensors)
    header[record.name] = {{"dtype", info_of(record.dtype).name},
                           {"shape", static_cast<const std::vector<int64_t>&>(record.shape)},
                           {"data_offsets", nlohmann::ordered_json::array({record.begin, record.end})}};
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(concat(where, "a tensor name or metadata string is not valid UTF-8 (", e.what(), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned
  return text;
}

}  // namespace sl::nn::safetensors
