// mesh.cpp — the device mesh: coordinates on the grid arange(world).view(pp, dp_replicate, dp_shard,
// ep, cp, tp) and one process group per set of dimensions. The layout and its cost are drawn in mesh.h.
#include "parallel/comm/mesh.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <sstream>

#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// ParallelismConfig's fields in their declared order (Accelerate's), which is how it prints.
constexpr std::array<MeshDim, kGridDimCount> kFieldOrder = {MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::pp,
                                                            MeshDim::cp, MeshDim::tp, MeshDim::ep};
int field_value(const ParallelismConfig& c, MeshDim dim) {
  return c.degrees()[static_cast<size_t>(grid_index(dim))];
}

std::string known_names() {
  std::string out;
  for (MeshDim dim : kGridDims) out += (out.empty() ? "" : ", ") + std::string(name(dim));
  for (MeshDim dim : kProductDims) out += ", " + std::string(name(dim));
  return out;
}

// Coordinates on the grid of `degrees` (outermost first): tp innermost, it changes fastest with the rank.
std::array<int, DeviceMesh::kDims> grid_coordinates(const std::array<int, DeviceMesh::kDims>& degrees, int rank) {
  std::array<int, DeviceMesh::kDims> coords{};
  for (int d = DeviceMesh::kDims - 1; d >= 0; --d) {
    coords[d] = rank % degrees[d];
    rank /= degrees[d];
  }
  return coords;
}

// The ranks that agree with `rank` on every dimension outside `mask`, ascending.
std::vector<int> grid_members(const std::array<int, DeviceMesh::kDims>& degrees, unsigned mask, int rank) {
  int world = 1;
  for (int d : degrees) world *= d;
  const auto anchor = grid_coordinates(degrees, rank);
  std::vector<int> members;
  for (int other = 0; other < world; ++other) {
    const auto coords = grid_coordinates(degrees, other);
    bool same_elsewhere = true;
    for (int d = 0; d < DeviceMesh::kDims; ++d)
      if (!(mask & (1u << d)) && coords[d] != anchor[d]) same_elsewhere = false;
    if (same_elsewhere) members.push_back(other);
  }
  return members;
}

std::string braces(const std::vector<int>& ranks) {
  std::string out = "{";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out + "}";
}

}  // namespace

// ---- ParallelismConfig ----------------------------------------------------------------------------

std::string ParallelismConfig::str() const {
  std::ostringstream out;
  for (size_t f = 0; f < kFieldOrder.size(); ++f)
    if (kFieldOrder[f] != MeshDim::ep || ep > 1)  // most layouts have no experts: ep shows when it splits
      out << (f ? " x " : "") << name(kFieldOrder[f]) << " " << field_value(*this, kFieldOrder[f]);
  return out.str();
}

int ParallelismConfig::world_size() const {
  int64_t product = 1;
  for (MeshDim dim : kFieldOrder) {
    const int value = field_value(*this, dim);
    SL_CHECK(value >= 1, "ParallelismConfig: ", name(dim), " must be >= 1 (got ", value, ")");
    product *= value;  // each factor <= INT_MAX after the check below, so int64 cannot overflow first
    SL_CHECK(product <= INT_MAX, "ParallelismConfig: ", str(), " overflows int");
  }
  return static_cast<int>(product);
}

void ParallelismConfig::validate(int world) const {
  const int product = world_size();  // checks every degree first
  SL_CHECK(product == world, "ParallelismConfig: world size ", world, " != ", str());
}

// ---- construction: validate, agree, then every group in a fixed order --------------------------------

DeviceMesh::DeviceMesh(ProcessGroupPtr world, const ParallelismConfig& config)
    : world_(std::move(world)), config_(config) {
  SL_CHECK(world_ != nullptr, "DeviceMesh: the world process group is null");
  config_.validate(world_->size());  // before any communication: a bad config fails on every rank alike
  degrees_ = config_.degrees();
  rank_ = world_->rank();
  coords_ = coordinates_of(rank_);
  for (int d = 0; d < kDims; ++d)
    if (degrees_[d] > 1) nontrivial_ |= 1u << d;

  check_ranks_agree();

  // One group per subset of the size>1 dimensions, in ascending mask order on every rank (split is
  // collective over the world). A size-1 dimension adds nobody, so {pp, tp} with pp == 1 is {tp}.
  for (Mask mask = 0; mask <= nontrivial_; ++mask) {
    if ((mask & ~nontrivial_) != 0) continue;
    if (mask == nontrivial_) {
      groups_[mask] = world_;  // varies every coordinate: the whole world
      continue;
    }
    // Same color = same coordinates outside the set: the row-major index over the other dimensions.
    int color = 0;
    for (int d = 0; d < kDims; ++d)
      if (!(mask & (1u << d))) color = color * degrees_[d] + coords_[d];
    groups_[mask] = world_->split(color, /*key=*/rank_);  // ordered by world rank
    SL_ASSERT(groups_[mask] != nullptr);
  }
  for (Mask mask = 0; mask <= nontrivial_; ++mask) {
    if ((mask & ~nontrivial_) != 0) continue;
    const std::vector<int> members = members_of(mask, rank_);  // what the split must have made
    SL_ASSERT(static_cast<int>(members.size()) == groups_[mask]->size());
    SL_ASSERT(members[static_cast<size_t>(groups_[mask]->rank())] == rank_);
  }
}

// Every rank shares its degrees (one all_gather of 6 ints): a rank built with a different config would
// otherwise split into groups nobody else makes. All ranks see the same table and throw the same error.
void DeviceMesh::check_ranks_agree() const {
  const int n = world_->size();
  if (n == 1) return;
  std::vector<double> mine(degrees_.begin(), degrees_.end());
  Tensor input = from_vector(mine, {kDims}, DType::i64);
  Tensor gathered = Tensor::empty({static_cast<int64_t>(n) * kDims}, DType::i64);
  world_->all_gather(gathered, input);
  const std::vector<double> all = gathered.to_vector();
  auto degrees_of = [&](int r) {
    std::array<int, kDims> degrees{};
    for (int d = 0; d < kDims; ++d)
      degrees[static_cast<size_t>(d)] = static_cast<int>(all[static_cast<size_t>(r * kDims + d)]);
    return degrees;
  };
  auto config_of = [&](int r) {
    const auto at = degrees_of(r);
    auto degree = [&](MeshDim dim) { return at[static_cast<size_t>(grid_index(dim))]; };
    return ParallelismConfig{.dp_replicate = degree(MeshDim::dp_replicate), .dp_shard = degree(MeshDim::dp_shard),
                             .pp = degree(MeshDim::pp), .cp = degree(MeshDim::cp), .tp = degree(MeshDim::tp)};
  };
  for (int r = 1; r < n; ++r)
    SL_CHECK(degrees_of(r) == degrees_of(0), "DeviceMesh: ranks disagree on the ParallelismConfig: rank 0 has ",
             config_of(0).str(), ", rank ", r, " has ", config_of(r).str());
}

// ---- names, coordinates, members -------------------------------------------------------------------

std::array<int, DeviceMesh::kDims> DeviceMesh::coordinates_of(int rank) const {
  return grid_coordinates(degrees_, rank);
}

int DeviceMesh::coordinate(MeshDim dim) const {
  const Mask mask = grid_mask(dim);
  int index = 0;
  for (int d = 0; d < kDims; ++d)
    if (mask & (1u << d)) index = index * degrees_[d] + coords_[d];
  return index;
}

int DeviceMesh::size(MeshDim dim) const {
  const Mask mask = grid_mask(dim);
  int product = 1;
  for (int d = 0; d < kDims; ++d)
    if (mask & (1u << d)) product *= degrees_[d];
  return product;
}

std::vector<int> DeviceMesh::members_of(Mask mask, int rank) const {
  return grid_members(degrees_, mask, rank);
}

std::vector<int> DeviceMesh::group_members(const ParallelismConfig& config, const MeshDims& dims, int rank) {
  const int world = config.world_size();
  SL_CHECK(rank >= 0 && rank < world, "DeviceMesh::group_members: rank ", rank, " is outside ", config.str());
  SL_CHECK(!dims.empty(), "DeviceMesh: group_members() needs at least one dimension (known: ", known_names(), ")");
  return grid_members(config.degrees(), grid_mask(dims), rank);
}

std::vector<std::vector<int>> DeviceMesh::partition_of(Mask mask) const {
  std::vector<std::vector<int>> groups;
  std::vector<bool> placed(static_cast<size_t>(world_size()), false);
  for (int r = 0; r < world_size(); ++r) {
    if (placed[static_cast<size_t>(r)]) continue;
    groups.push_back(members_of(mask, r));
    for (int member : groups.back()) placed[static_cast<size_t>(member)] = true;
  }
  return groups;
}

std::vector<int> DeviceMesh::members(MeshDim dim) const { return members_of(grid_mask(dim), rank_); }
std::vector<std::vector<int>> DeviceMesh::partition(MeshDim dim) const { return partition_of(grid_mask(dim)); }

// ---- groups ------------------------------------------------------------------------------------------

ProcessGroupPtr DeviceMesh::group_of(Mask mask) const {
  const ProcessGroupPtr& group = groups_[mask & nontrivial_];
  SL_ASSERT(group != nullptr);
  return group;
}

ProcessGroupPtr DeviceMesh::group(MeshDim dim) const { return group_of(grid_mask(dim)); }

ProcessGroupPtr DeviceMesh::group(const MeshDims& dims) const {
  SL_CHECK(!dims.empty(), "DeviceMesh: group() needs at least one dimension (known: ", known_names(), ")");
  return group_of(grid_mask(dims));
}

// ---- drawing -------------------------------------------------------------------------------------------

std::string DeviceMesh::str() const {
  std::ostringstream out;
  out << "DeviceMesh: world " << world_size() << " = " << config_.str() << "   (this is rank " << rank_
      << ", marked *)\n";

  // The grid: one row per (pp, dp_replicate, dp_shard, cp), one column per tp; size-1 labels left out.
  const int tp = size(MeshDim::tp);
  const int rows = world_size() / tp;
  std::vector<std::string> labels;
  for (int row = 0; row < rows; ++row) {
    const auto coords = coordinates_of(row * tp);
    std::string label;
    for (int d = 0; d < kDims; ++d)
      if (kGridDims[d] != MeshDim::tp && degrees_[d] > 1)
        label += (label.empty() ? "" : "  ") + std::string(name(kGridDims[d])) + " " + std::to_string(coords[d]);
    labels.push_back(label);
  }
  size_t label_width = 0;
  for (const auto& label : labels) label_width = std::max(label_width, label.size());
  const size_t cell = std::max(std::to_string(world_size() - 1).size(), ("tp " + std::to_string(tp - 1)).size());
  auto pad_left = [](const std::string& s, size_t width) {
    return std::string(width - std::min(width, s.size()), ' ') + s;
  };

  auto end_line = [&out](std::string line) {  // no trailing blanks (the unmarked cells leave some)
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << "\n";
  };
  std::string header = "  " + std::string(label_width, ' ');
  for (int t = 0; t < tp; ++t) header += "  " + pad_left("tp " + std::to_string(t), cell) + " ";
  end_line(header);
  for (int row = 0; row < rows; ++row) {
    const std::string& label = labels[static_cast<size_t>(row)];
    std::string line = "  " + label + std::string(label_width - label.size(), ' ');
    for (int t = 0; t < tp; ++t) {
      const int r = row * tp + t;
      line += "  " + pad_left(std::to_string(r), cell) + (r == rank_ ? "*" : " ");
    }
    end_line(line);
  }

  // The groups, as world ranks: every name of size > 1; a product equal to a line above says so.
  std::vector<MeshDim> lines(kGridDims.begin(), kGridDims.end());
  lines.insert(lines.end(), kProductDims.begin(), kProductDims.end());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view label = name(lines[i]);
    const Mask mask = grid_mask(lines[i]);
    if (size(lines[i]) == 1) continue;
    const bool expert = lines[i] == MeshDim::expert_dp_cp || lines[i] == MeshDim::expert_dp_shard_cp;
    if (expert && config_.ep == 1) continue;  // without ep they are dp_cp and dp_shard_cp
    out << "  " << label << std::string(label.size() < 12 ? 12 - label.size() : 0, ' ') << ":";
    std::string_view same_as;
    for (size_t j = 0; j < i && same_as.empty(); ++j)
      if ((grid_mask(lines[j]) & nontrivial_) == (mask & nontrivial_)) same_as = name(lines[j]);
    if (!same_as.empty()) {
      out << " same as " << same_as << "\n";
      continue;
    }
    for (const auto& members : partition_of(mask)) out << " " << braces(members);
    out << "\n";
  }
  if (nontrivial_ == 0) out << "  (every degree is 1: one rank, every group is this rank alone)\n";
  return out.str();
}

}  // namespace sl::parallel
