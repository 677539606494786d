// comm_ledger.cpp — the names of ops, the per-group ledger of calls and bytes, and the fingerprint
// that debug mode compares across ranks (see process_group.h).
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "parallel/comm/process_group.h"

namespace sl::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::all_gather: return "all_gather";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::broadcast: return "broadcast";
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
    case CommOp::barrier: return "barrier";
    case CommOp::all_to_all: return "all_to_all";
    case CommOp::count_: break;
  }
  return "?";
}

// ---- CommLedger ------------------------------------------------------------------------------------

CommStats CommLedger::operator[](CommOp op) const {
  std::lock_guard lock(mutex_);
  return stats_[static_cast<int>(op)];
}

CommStats CommLedger::total() const {
  std::lock_guard lock(mutex_);
  CommStats sum;
  for (const CommStats& s : stats_) {
    sum.calls += s.calls;
    sum.bytes_sent += s.bytes_sent;
    sum.bytes_received += s.bytes_received;
    sum.link_s += s.link_s;
  }
  return sum;
}

void CommLedger::record_call(CommOp op) {
  std::lock_guard lock(mutex_);
  stats_[static_cast<int>(op)].calls += 1;
}

void CommLedger::record_bytes(CommOp op, int64_t bytes_sent, int64_t bytes_received) {
  std::lock_guard lock(mutex_);
  stats_[static_cast<int>(op)].bytes_sent += bytes_sent;
  stats_[static_cast<int>(op)].bytes_received += bytes_received;
}

void CommLedger::record_link(CommOp op, double seconds) {
  std::lock_guard lock(mutex_);
  stats_[static_cast<int>(op)].link_s += seconds;
}

void CommLedger::reset() {
  std::lock_guard lock(mutex_);
  stats_ = {};
  waited_ = std::chrono::nanoseconds(0);
}

void CommLedger::record_wait(std::chrono::nanoseconds blocked) {
  std::lock_guard lock(mutex_);
  waited_ += blocked;
}

double CommLedger::wait_seconds() const {
  std::lock_guard lock(mutex_);
  return std::chrono::duration<double>(waited_).count();
}

void CommLedger::set_collectives_modelled(bool modelled) {
  std::lock_guard lock(mutex_);
  collectives_modelled_ = modelled;
}

bool CommLedger::collectives_modelled() const {
  std::lock_guard lock(mutex_);
  return collectives_modelled_;
}

// What the byte counts of op are when the backend moved them its own way (see the header).
static const char* model_of(CommOp op) {
  switch (op) {
    case CommOp::all_reduce:
    case CommOp::all_gather:
    case CommOp::reduce_scatter: return "   (ring model)";
    case CommOp::broadcast: return "   (chain model)";
    default: return "";  // send, recv and all_to_all count the bytes they pass; a barrier moves none
  }
}

std::string CommLedger::report() const {
  std::ostringstream out;
  char line[180];
  const bool modelled = collectives_modelled();
  for (int i = 0; i < static_cast<int>(CommOp::count_); ++i) {
    const auto op = static_cast<CommOp>(i);
    CommStats s = (*this)[op];
    if (s.calls == 0) continue;
    std::snprintf(line, sizeof line, "%-15s %6lld calls   sent %10.3f MiB   received %10.3f MiB%s",
                  comm_op_name(op), static_cast<long long>(s.calls), s.bytes_sent / 1048576.0,
                  s.bytes_received / 1048576.0, modelled ? model_of(op) : "");
    out << line;
    if (s.link_s > 0) {
      std::snprintf(line, sizeof line, "   links %.3f ms", s.link_s * 1e3);
      out << line;
    }
    out << "\n";
  }
  return out.str();
}

// ---- Fingerprint -------------------------------------------------------------------------------------

std::string Fingerprint::str() const {
  std::ostringstream out;
  out << comm_op_name(op) << " #" << sequence;
  if (op != CommOp::barrier) {
    out << " " << dtype_name(dtype) << "[";
    for (int d = 0; d < std::min(ndim, 8); ++d) out << (d ? ", " : "") << shape[d];
    out << "]";
  }
  if (reduce >= 0) out << " " << reduce_op_name(static_cast<ReduceOp>(reduce));
  if (root >= 0) out << " root " << root;
  return out.str();
}

std::string Fingerprint::difference(const Fingerprint& other) const {
  std::vector<std::string> parts;
  auto differ = [&](bool same, const std::string& what) {
    if (!same) parts.push_back(what);
  };
  differ(op == other.op, std::string("op ") + comm_op_name(op) + " != " + comm_op_name(other.op));
  differ(sequence == other.sequence,
         "sequence number " + std::to_string(sequence) + " != " + std::to_string(other.sequence));
  differ(dtype == other.dtype, std::string("dtype ") + dtype_name(dtype) + " != " + dtype_name(other.dtype));
  differ(ndim == other.ndim && shape == other.shape, "shape");
  differ(root == other.root, "root " + std::to_string(root) + " != " + std::to_string(other.root));
  differ(reduce == other.reduce, "reduce op");
  std::string joined;
  for (const std::string& p : parts) joined += (joined.empty() ? "" : "; ") + p;
  return joined;
}

}  // namespace sl::parallel
