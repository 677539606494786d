// engine.cpp — see engine.h: walk the list, compute, exchange, record.
#include "parallel/pipeline/engine.h"

#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "autograd/deferred_grad.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

using Kind = Action::Kind;
using Clock = std::chrono::steady_clock;

namespace {
// What one (micro-batch, chunk) holds between its F and its B.
struct InFlight {
  Tensor input;                  // received activation [B, T, C] (a leaf), undefined on chunk 0
  Tensor output;                 // the chunk's output [B, T, C], or the weighted loss on the last chunk
  Tensor grad_out;               // received gradient of output [B, T, C]
  bool input_grad_done = false;  // its B has run and its input gradient has left (or there is none)
  DeferredGrads weight_grads;    // zero-bubble: the work its W does
  bool weights_done = false;     // its W has run (or the schedule has none)
};

// One step of one rank's action list: what it holds, and one method per kind of action.
class ScheduleRun {
 public:
  ScheduleRun(const Schedule& schedule, Stage& stage, ProcessGroup& pp,
              const std::vector<nn::TokenStream::MicroBatch>& micros, const std::vector<double>& weights,
              const std::vector<double>& loss_factor, const std::function<void(bool last)>& before_backward,
              const EngineOptions& options, const ChunkParallelizer& cut)
      : stage_(stage),
        pp_(pp),
        micros_(micros),
        weights_(weights),
        loss_factor_(loss_factor),
        before_backward_(before_backward),
        options_(options),
        cut_(cut),
        p_(schedule.stages),
        last_chunk_(schedule.chunks() - 1),
        list_(schedule.ranks[pp.rank()]),
        split_(schedule.split_backward()),
        start_(Clock::now()) {
    const Kind fills_grads = split_ ? Kind::weight : Kind::backward;  // the action that fills param .grad
    for (const Action& a : list_) backwards_left_ += a.kind == fills_grads;
    if (split_)  // whose gradients a split B leaves to W
      for (const auto& part : stage.parts)
        for (const Tensor& t : part->parameters()) parameters_.push_back(t);
  }

  StepResult run() {
    for (size_t i = 0; i < list_.size();) {
      const Action& a = list_[i];
      const double t0 = seconds();
      if (a.kind == Kind::forward)
        forward(a, t0);
      else if (a.kind == Kind::backward)
        backward(a, t0);
      else if (a.kind == Kind::weight)
        weight(a, t0);
      else {
        i = exchange(i, t0);  // every consecutive send/recv, posted together
        continue;
      }
      ++i;
    }
    SL_ASSERT(held_.empty());
    return std::move(result_);
  }

 private:
  using Key = std::pair<int, int>;  // (micro-batch, chunk)

  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // The stage's activations (and their gradients) have the model's dtype: 16-bit under mixed precision.
  TensorOptions activation_dtype() const { return TensorOptions(stage_.parts[0]->config().param_dtype); }
  Shape activation_shape(int micro) const {
    return cut_.activation_shape(micros_[micro].batch.inputs, stage_.parts[0]->config().n_embd);  // [B, T, C]
  }
  // A (micro, chunk) goes once nothing needs it: B done and its gradient sent, and W done.
  void retire(Key key) {
    const InFlight& f = held_.at(key);
    if (f.input_grad_done && (f.weights_done || !split_)) held_.erase(key);
  }
  void synthetic_cost(int micro, int chunk, double factor) const {
    if (options_.sleep_per_layer_row_seconds <= 0) return;
    const auto& spec = stage_.specs[chunk / p_];
    const double layers = static_cast<double>(spec.layer_end - spec.layer_begin);
    const double rows = static_cast<double>(micros_[micro].batch.inputs.size(0));
    std::this_thread::sleep_for(
        std::chrono::duration<double>(factor * options_.sleep_per_layer_row_seconds * layers * rows));
  }

  void forward(const Action& a, double t0) {
    nn::GPT& part = *stage_.parts[a.chunk / p_];
    InFlight& f = held_[{a.micro, a.chunk}];
    const nn::Batch& batch = micros_[a.micro].batch;
    Tensor x = cut_.forward(part, a.chunk == 0 ? batch.inputs : f.input);
    if (a.chunk == last_chunk_) {
      // This rank's tokens' mean, scaled to the micro-batch's: × counted_m · dp / C below gives
      // this rank's part of the serial loss.
      Tensor loss = scaled_to_micro_batch(cut_.loss(x, micros_[a.micro]), static_cast<double>(micros_[a.micro].counted));
      result_.loss_share += loss.item() * loss_factor_[a.micro];
      x = weights_[a.micro] == 1.0 ? loss : mul(loss, weights_[a.micro]);
    }
    f.output = x;
    synthetic_cost(a.micro, a.chunk, 1);
    result_.peak_in_flight = std::max(result_.peak_in_flight, static_cast<int>(held_.size()));
    result_.events.push_back({TimelineEvent::Kind::forward, a.micro, a.chunk, t0, seconds()});
  }

  void backward(const Action& a, double t0) {
    InFlight& f = held_.at({a.micro, a.chunk});
    if (before_backward_ && !split_) before_backward_(--backwards_left_ == 0);
    {
      std::optional<DeferGradsGuard> defer;
      if (split_) defer.emplace(f.weight_grads, parameters_);  // B: input gradients only
      if (a.chunk == last_chunk_)
        f.output.backward();
      else
        f.output.backward(f.grad_out);
    }
    f.output = Tensor();
    f.grad_out = Tensor();
    synthetic_cost(a.micro, a.chunk, split_ ? 1 : 2);
    result_.events.push_back({TimelineEvent::Kind::backward, a.micro, a.chunk, t0, seconds()});
    if (a.chunk == 0) {  // nothing to send back
      f.input_grad_done = true;
      retire({a.micro, a.chunk});
    }
  }

  void weight(const Action& a, double t0) {
    InFlight& f = held_.at({a.micro, a.chunk});
    if (before_backward_) before_backward_(--backwards_left_ == 0);
    f.weight_grads.run();  // W: the weight gradients B queued
    f.weights_done = true;
    synthetic_cost(a.micro, a.chunk, 1);
    result_.events.push_back({TimelineEvent::Kind::weight, a.micro, a.chunk, t0, seconds()});
    retire({a.micro, a.chunk});
  }

  // Posts the batch of send/recv actions that starts at list_[i]; returns the index after it.
  size_t exchange(size_t i, double t0) {
    const size_t first = i;
    const double link0 = pp_.ledger().link_seconds();  // simulated links: this batch's charge, for the trace
    std::vector<ProcessGroup::P2POp> ops;
    std::vector<Key> sent_grads;    // entries to drop once their gradient has gone
    std::vector<Key> sent_outputs;  // outputs whose bytes can go once sent
    for (; i < list_.size() && !list_[i].is_compute(); ++i) {
      const Action& c = list_[i];
      MemoryScope scope(MemoryCategory::activations);
      switch (c.kind) {
        case Kind::send_activation:
          ops.push_back({ProcessGroup::P2POp::Kind::send, held_.at({c.micro, c.chunk}).output, c.peer, c.tag()});
          sent_outputs.push_back({c.micro, c.chunk});
          break;
        case Kind::send_grad:
          ops.push_back({ProcessGroup::P2POp::Kind::send, held_.at({c.micro, c.chunk}).input.grad(), c.peer, c.tag()});
          sent_grads.push_back({c.micro, c.chunk});
          break;
        case Kind::recv_activation: {
          Tensor buffer = Tensor::empty(activation_shape(c.micro), activation_dtype());
          held_[{c.micro, c.chunk + 1}].input = buffer;
          ops.push_back({ProcessGroup::P2POp::Kind::recv, buffer, c.peer, c.tag()});
          break;
        }
        case Kind::recv_grad: {
          Tensor buffer = Tensor::empty(activation_shape(c.micro), activation_dtype());
          held_[{c.micro, c.chunk - 1}].grad_out = buffer;  // posted ahead: may precede its F
          ops.push_back({ProcessGroup::P2POp::Kind::recv, buffer, c.peer, c.tag()});
          break;
        }
        default:
          SL_ASSERT(false);
      }
    }
    for (const WorkPtr& work : pp_.batch_isend_irecv(ops)) work->wait();
    for (size_t k = first; k < i; ++k)
      if (list_[k].kind == Kind::recv_activation)
        held_[{list_[k].micro, list_[k].chunk + 1}].input.set_requires_grad(true);
    for (const Key& key : sent_grads) {  // its B is done and its gradient has left
      held_.at(key).input_grad_done = true;
      retire(key);
    }
    // The next stage has its own copy of a sent output; backward needs only its node (the block's
    // last op, a residual add, saves nothing), so its bytes go now (Megatron's deallocate_output_tensor).
    // Were anything to read them, it would throw ("released"), not read garbage.
    if (options_.free_sent_outputs)
      for (const Key& key : sent_outputs) held_.at(key).output.impl_ptr()->storage->release();
    result_.events.push_back({TimelineEvent::Kind::comm, -1, -1, t0, seconds(), pp_.ledger().link_seconds() - link0});
    return i;
  }

  Stage& stage_;
  ProcessGroup& pp_;
  const std::vector<nn::TokenStream::MicroBatch>& micros_;
  const std::vector<double>& weights_;
  const std::vector<double>& loss_factor_;
  const std::function<void(bool last)>& before_backward_;
  const EngineOptions& options_;
  const ChunkParallelizer& cut_;
  const int p_, last_chunk_;
  const std::vector<Action>& list_;
  const bool split_;
  const Clock::time_point start_;
  int backwards_left_ = 0;
  TensorList parameters_;  // whose gradients a split B leaves to W
  StepResult result_;
  std::map<Key, InFlight> held_;  // (micro, chunk) -> its tensors
};
}  // namespace

StepResult run_schedule(const Schedule& schedule, Stage& stage, ProcessGroup& pp,
                        const std::vector<nn::TokenStream::MicroBatch>& micros, const std::vector<double>& weights,
                        const std::vector<double>& loss_factor, const std::function<void(bool last)>& before_backward,
                        const EngineOptions& options, const ChunkParallelizer* cut) {
  const ChunkParallelizer plain;
  const int p = schedule.stages, rank = pp.rank();
  SL_CHECK(pp.size() == p && stage.stages == p && stage.rank == rank && stage.virtual_stages == schedule.virtual_stages,
           "pipeline engine: schedule for ", p, " stages x ", schedule.virtual_stages,
           " virtual, but the pp group has ", pp.size(), " ranks and this is stage ", stage.rank, " of ", stage.stages,
           " x ", stage.virtual_stages);
  SL_CHECK(static_cast<int>(micros.size()) == schedule.micro_batches, "pipeline engine: the schedule is for ",
           schedule.micro_batches, " micro-batches, got ", micros.size());
  return ScheduleRun(schedule, stage, pp, micros, weights, loss_factor, before_backward, options, cut ? *cut : plain)
      .run();
}

}  // namespace sl::parallel
