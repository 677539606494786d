// save.cpp — one checkpoint written by every rank, metadata.json last (see save.h).
#include "parallel/checkpoint/save.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "parallel/checkpoint/file_io.h"
#include "parallel/checkpoint/metadata.h"
#include "parallel/checkpoint/regions.h"
#include "parallel/checkpoint/shard_file.h"

namespace sl::parallel::checkpoint {
namespace {

using json = nlohmann::json;
using detail::concat;

FaultHook& fault_hook() {
  static FaultHook hook;
  return hook;
}

// Rank 0, before anyone writes: dir exists and is no checkpoint (its metadata.json is gone, on
// disk), and no shard of an earlier save is left to be mistaken for one of this save.
void prepare_directory(const std::string& dir, const std::string& where) {
  make_directory(dir, where);
  remove_file(dir + "/" + kMetadataName);
  sync_directory(dir, where);
  for (const std::string& name : list_directory(dir, where))
    if (name == std::string(kMetadataName) + ".tmp" || name.rfind("shard-", 0) == 0) remove_file(dir + "/" + name);
  sync_directory(dir, where);
}

// This rank's owner pieces, checked, as shard tensors named tensor@k; and their report for rank 0.
std::vector<ShardTensor> local_pieces(const std::vector<StatePiece>& pieces, json& report, const std::string& where) {
  std::vector<ShardTensor> shard;
  std::map<std::string, int> count;  // pieces of each tensor so far
  for (const StatePiece& piece : pieces) {
    if (!piece.owner) continue;
    const std::string at = concat(where, "tensor '", piece.tensor, "' piece ", describe(piece.region), ": ");
    checked_numel(piece.global_shape, at);
    const std::string problem = region_problem(piece.region, piece.global_shape);
    SL_CHECK(problem.empty(), at, problem);
    SL_CHECK(piece.data.defined() && piece.data.numel() == piece.region.numel(), at, "data holds ",
             piece.data.defined() ? piece.data.numel() : 0, " elements, the region ", piece.region.numel());
    const std::string key = concat(piece.tensor, "@", count[piece.tensor]++);
    shard.push_back({key, piece.data.reshape({piece.data.numel()})});
    report["pieces"].push_back({{"tensor", piece.tensor}, {"shape", piece.global_shape},
                                {"dtype", dtype_label(piece.data.dtype())}, {"key", key},
                                {"offsets", piece.region.offsets}, {"lengths", piece.region.lengths},
                                {"flat_begin", piece.region.flat_begin}, {"flat_end", piece.region.flat_end}});
  }
  return shard;
}

// Every rank's string, on every rank: lengths first, then the bytes padded to the longest.
std::vector<std::string> gather_strings(ProcessGroup& world, const std::string& mine) {
  const int n = world.size();
  const Device device = current_device();
  Tensor length = Tensor::empty({1}, {DType::i64, Device::cpu()});
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  Tensor lengths = Tensor::empty({n}, {DType::i64, device});
  world.all_gather(lengths, length.to(device));
  lengths = lengths.to(Device::cpu());
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths.data<int64_t>()[r]);
  const int64_t words = (longest + 7) / 8;  // i64 words: any dtype moves bytes unchanged
  Tensor bytes = Tensor::empty({words}, {DType::i64, Device::cpu()});
  std::memset(bytes.raw_data(), 0, static_cast<size_t>(words * 8));
  std::memcpy(bytes.raw_data(), mine.data(), mine.size());
  Tensor all = Tensor::empty({n * words}, {DType::i64, device});
  world.all_gather(all, bytes.to(device));
  all = all.to(Device::cpu());
  std::vector<std::string> strings;
  for (int r = 0; r < n; ++r)
    strings.emplace_back(static_cast<const char*>(all.raw_data()) + r * words * 8,
                         static_cast<size_t>(lengths.data<int64_t>()[r]));
  return strings;
}

// Rank 0: the reports merged into metadata, checked as a reader would check them, then written last.
void write_metadata(const std::string& dir, const std::vector<std::string>& reports, const json& run_state,
                    const std::string& layout, const std::function<void(const char*)>& fault,
                    const std::string& where) {
  Metadata metadata;
  metadata.layout = layout;
  metadata.world_size = static_cast<int64_t>(reports.size());
  SL_CHECK(run_state.is_object() || run_state.is_null(), where, "run_state must be a JSON object, got ",
           run_state.type_name());
  if (!run_state.is_null()) metadata.run_state = run_state;
  std::map<std::string, int> first_rank;  // who first described each tensor
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    const json report = json::parse(reports[rank]);
    if (report.contains("file"))
      metadata.files[report["file"].get<std::string>()] = {report["bytes"].get<uint64_t>(),
                                                           report["sha256"].get<std::string>()};
    for (const json& entry : report["pieces"]) {
      const auto tensor = entry["tensor"].get<std::string>();
      SavedTensor& saved = metadata.tensors[tensor];
      const auto shape = entry["shape"].get<std::vector<int64_t>>();
      const DType dtype = parse_dtype_label(entry["dtype"].get<std::string>(), where);
      if (saved.pieces.empty()) {
        saved.shape = shape, saved.dtype = dtype, first_rank[tensor] = static_cast<int>(rank);
      } else {
        SL_CHECK(saved.shape == shape && saved.dtype == dtype, where, "tensor '", tensor, "': rank ",
                 first_rank[tensor], " saves it as ", json(saved.shape).dump(), " ", dtype_label(saved.dtype),
                 " but rank ", rank, " as ", json(shape).dump(), " ", dtype_label(dtype));
      }
      Region region{entry["offsets"].get<std::vector<int64_t>>(), entry["lengths"].get<std::vector<int64_t>>(),
                    entry["flat_begin"].get<int64_t>(), entry["flat_end"].get<int64_t>()};
      saved.pieces.push_back({report["file"].get<std::string>(), entry["key"].get<std::string>(), std::move(region)});
    }
  }
  const std::string text = metadata_text(metadata);
  parse_metadata(text, where);  // the tiling check: every tensor covered once, nothing outside it
  const std::string path = dir + "/" + kMetadataName, temp = path + ".tmp";
  File file = File::create(temp, where);
  file.write_all(text.data(), text.size(), where);
  file.sync(where);
  file.close(where);
  fault("metadata.before_rename");
  rename_path(temp, path, where);
  sync_directory(dir, where);
  fault("metadata.after_rename");
}

}  // namespace

void set_fault_hook(FaultHook hook) { fault_hook() = std::move(hook); }
void fault_point(const std::string& point, int rank) {
  if (fault_hook()) fault_hook()(point, rank);
}

void save(const std::string& dir, ProcessGroup& world, const std::vector<StatePiece>& pieces,
          const nlohmann::json& run_state, const std::string& layout) {
  const int rank = world.rank();
  const std::string where = concat("checkpoint::save '", dir, "' (rank ", rank, "): ");
  auto fault = [&](const char* point) { fault_point(point, rank); };
  if (rank == 0) prepare_directory(dir, where);
  world.barrier();
  json report = {{"pieces", json::array()}};
  const std::vector<ShardTensor> shard = local_pieces(pieces, report, where);
  if (!shard.empty()) {
    const std::string name = shard_file_name(rank);
    const WrittenShard written = write_shard(dir, name, shard, fault);
    report["file"] = name, report["bytes"] = written.bytes, report["sha256"] = written.sha256;
  }
  const std::vector<std::string> reports = gather_strings(world, report.dump());
  if (rank == 0) write_metadata(dir, reports, run_state, layout, fault, where);
  world.barrier();
}

}  // namespace sl::parallel::checkpoint
