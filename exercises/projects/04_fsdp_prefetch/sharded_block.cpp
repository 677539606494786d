// exercises/projects/04_fsdp_prefetch/sharded_block.cpp — see sharded_block.h.
#include "exercises/projects/04_fsdp_prefetch/sharded_block.h"

#include <chrono>
#include <thread>

#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace project04 {

using sl::parallel::WorkPtr;

static double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

UnitLog::UnitLog() : start_(now_seconds()) {}

void UnitLog::restart() {
  events_.clear();
  start_ = now_seconds();
}

void UnitLog::record(UnitEvent::Kind kind, int unit) { events_.push_back({kind, unit, now_seconds() - start_}); }

int UnitLog::position(UnitEvent::Kind kind, int unit) const {
  for (size_t i = 0; i < events_.size(); ++i)
    if (events_[i].kind == kind && events_[i].unit == unit) return static_cast<int>(i);
  return -1;
}

ShardedBlock::ShardedBlock(int index, sl::nn::Block& block, sl::parallel::ProcessGroupPtr group, UnitLog& log,
                           double compute_seconds)
    : index_(index), block_(block), group_(std::move(group)), log_(log), compute_seconds_(compute_seconds) {
  flat_ = std::make_unique<sl::parallel::FlatParams>(block_.parameters(), group_->size());
  {
    sl::MemoryScope scope(sl::MemoryCategory::weights);
    shard_ = sl::zeros({flat_->layout().shard_numel});
    shard_.copy_(flat_->shard(group_->rank()));
  }
  full_storage().release();
}

WorkPtr ShardedBlock::start_gather() {
  SL_CHECK(state_ == State::sharded, "unit ", index_, ": start_gather while ",
           state_ == State::gathered ? "gathered" : "its gather is in flight", " (gather each unit once per pass)");
  full_storage().reallocate();  // [P] charged to weights again
  WorkPtr work = group_->all_gather_async(flat_->buffer(), shard_);
  state_ = State::in_flight;
  log_.record(UnitEvent::Kind::gather_issued, index_);
  return work;
}

void ShardedBlock::finish_gather(const WorkPtr& work) {
  SL_CHECK(state_ == State::in_flight && work, "unit ", index_, ": finish_gather without a gather in flight");
  work->wait();
  state_ = State::gathered;
  log_.record(UnitEvent::Kind::gather_done, index_);
}

sl::Tensor ShardedBlock::forward(const sl::Tensor& x) {
  SL_CHECK(state_ == State::gathered, "unit ", index_, ": forward before its parameters were gathered ",
           "(start_gather, then finish_gather)");
  log_.record(UnitEvent::Kind::compute_begin, index_);
  sl::Tensor y = block_.forward(x);
  if (compute_seconds_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(compute_seconds_));
  log_.record(UnitEvent::Kind::compute_end, index_);
  return y;
}

void ShardedBlock::reshard() {
  if (state_ == State::sharded) return;
  SL_CHECK(state_ == State::gathered, "unit ", index_, ": reshard while its gather is in flight (finish it first)");
  full_storage().release();
  state_ = State::sharded;
  log_.record(UnitEvent::Kind::resharded, index_);
}

}  // namespace project04
