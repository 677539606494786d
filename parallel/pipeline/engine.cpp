// engine.cpp — see engine.h: walk the list, compute, exchange, record.
#include "parallel/pipeline/engine.h"

#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "autograd/deferred_grad.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel::pipeline {

using Kind = Action::Kind;
using Clock = std::chrono::steady_clock;

namespace {
// What one (micro-batch, chunk) holds between its F and its B.
struct InFlight {
  Tensor input;     // received activation [B, T, C] (a leaf), undefined on chunk 0
  Tensor output;    // the chunk's output [B, T, C], or the weighted loss on the last chunk
  Tensor grad_out;  // received gradient of output [B, T, C]
  bool input_grad_done = false;  // its B has run and its input gradient has left (or there is none)
  DeferredGrads weight_grads;    // zero-bubble: the work its W does
  bool weights_done = false;     // its W has run (or the schedule has none)
};
}  // namespace

StepResult run_schedule(const Schedule& schedule, Stage& stage, ProcessGroup& pp,
                        const std::vector<nn::TokenStream::MicroBatch>& micros, const std::vector<double>& weights,
                        const std::vector<double>& loss_factor, const std::function<void(bool last)>& before_backward,
                        const EngineOptions& options, const ChunkCut* cut) {
  const ChunkCut plain;
  if (cut == nullptr) cut = &plain;
  const int p = schedule.stages, rank = pp.rank(), last_chunk = schedule.chunks() - 1;
  SL_CHECK(pp.size() == p && stage.stages == p && stage.rank == rank && stage.virtual_stages == schedule.virtual_stages,
           "pipeline engine: schedule for ", p, " stages x ", schedule.virtual_stages, " virtual, but the pp group has ",
           pp.size(), " ranks and this is stage ", stage.rank, " of ", stage.stages, " x ", stage.virtual_stages);
  SL_CHECK(static_cast<int>(micros.size()) == schedule.micro_batches, "pipeline engine: the schedule is for ",
           schedule.micro_batches, " micro-batches, got ", micros.size());
  const auto& list = schedule.ranks[rank];
  const bool split = schedule.split_backward();
  const Kind fills_grads = split ? Kind::weight : Kind::backward;  // the action that fills param .grad
  int backwards_left = 0;
  for (const Action& a : list) backwards_left += a.kind == fills_grads;
  TensorList parameters;  // whose gradients a split B leaves to W
  if (split)
    for (const auto& part : stage.parts)
      for (const Tensor& t : part->parameters()) parameters.push_back(t);

  StepResult result;
  std::map<std::pair<int, int>, InFlight> held;  // (micro, chunk) -> its tensors
  const auto start = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  auto activation_shape = [&](int micro) {
    return cut->activation_shape(micros[micro].batch.inputs, stage.parts[0]->config().n_embd);  // [B, T, C]
  };
  // A (micro, chunk) goes once nothing needs it: B done and its gradient sent, and W done.
  auto retire = [&](std::pair<int, int> key) {
    const InFlight& f = held.at(key);
    if (f.input_grad_done && (f.weights_done || !split)) held.erase(key);
  };
  auto synthetic_cost = [&](int micro, int chunk, double factor) {
    if (options.sleep_per_layer_row_seconds <= 0) return;
    const auto& spec = stage.specs[chunk / p];
    const double layers = static_cast<double>(spec.layer_end - spec.layer_begin);
    const double rows = static_cast<double>(micros[micro].batch.inputs.size(0));
    std::this_thread::sleep_for(std::chrono::duration<double>(factor * options.sleep_per_layer_row_seconds * layers * rows));
  };

  for (size_t i = 0; i < list.size();) {
    const Action& a = list[i];
    const double t0 = seconds();
    if (a.kind == Kind::forward) {
      nn::GPT& part = *stage.parts[a.chunk / p];
      InFlight& f = held[{a.micro, a.chunk}];
      const nn::Batch& batch = micros[a.micro].batch;
      Tensor x = cut->forward(part, a.chunk == 0 ? batch.inputs : f.input);
      if (a.chunk == last_chunk) {
        Tensor loss = cut->loss(x, micros[a.micro]);  // the micro-batch's mean (this rank's part of it)
        result.loss_share += loss.item() * loss_factor[a.micro];
        x = weights[a.micro] == 1.0 ? loss : mul(loss, weights[a.micro]);
      }
      f.output = x;
      synthetic_cost(a.micro, a.chunk, 1);
      result.peak_in_flight = std::max(result.peak_in_flight, static_cast<int>(held.size()));
      result.events.push_back({TimelineEvent::Kind::forward, a.micro, a.chunk, t0, seconds()});
      ++i;
      continue;
    }
    if (a.kind == Kind::backward) {
      InFlight& f = held.at({a.micro, a.chunk});
      if (before_backward && !split) before_backward(--backwards_left == 0);
      {
        std::optional<DeferGradsGuard> defer;
        if (split) defer.emplace(f.weight_grads, parameters);  // B: input gradients only
        if (a.chunk == last_chunk) f.output.backward();
        else f.output.backward(f.grad_out);
      }
      f.output = Tensor();
      f.grad_out = Tensor();
      synthetic_cost(a.micro, a.chunk, split ? 1 : 2);
      result.events.push_back({TimelineEvent::Kind::backward, a.micro, a.chunk, t0, seconds()});
      if (a.chunk == 0) {  // nothing to send back
        f.input_grad_done = true;
        retire({a.micro, a.chunk});
      }
      ++i;
      continue;
    }
    if (a.kind == Kind::weight) {
      InFlight& f = held.at({a.micro, a.chunk});
      if (before_backward) before_backward(--backwards_left == 0);
      f.weight_grads.run();  // W: the weight gradients B queued
      f.weights_done = true;
      synthetic_cost(a.micro, a.chunk, 1);
      result.events.push_back({TimelineEvent::Kind::weight, a.micro, a.chunk, t0, seconds()});
      retire({a.micro, a.chunk});
      ++i;
      continue;
    }
    // A batch: every consecutive send/recv, posted together.
    std::vector<ProcessGroup::P2POp> ops;
    std::vector<std::pair<int, int>> sent_grads;  // entries to drop once their gradient has gone
    std::vector<std::pair<int, int>> sent_outputs;  // outputs whose bytes can go once sent
    for (; i < list.size() && !list[i].is_compute(); ++i) {
      const Action& c = list[i];
      MemoryScope scope(MemoryCategory::activations);
      switch (c.kind) {
        case Kind::send_activation:
          ops.push_back({ProcessGroup::P2POp::Kind::send, held.at({c.micro, c.chunk}).output, c.peer, c.tag()});
          sent_outputs.push_back({c.micro, c.chunk});
          break;
        case Kind::send_grad:
          ops.push_back({ProcessGroup::P2POp::Kind::send, held.at({c.micro, c.chunk}).input.grad(), c.peer, c.tag()});
          sent_grads.push_back({c.micro, c.chunk});
          break;
        case Kind::recv_activation: {
          Tensor buffer = Tensor::empty(activation_shape(c.micro));
          held[{c.micro, c.chunk + 1}].input = buffer;
          ops.push_back({ProcessGroup::P2POp::Kind::recv, buffer, c.peer, c.tag()});
          break;
        }
        case Kind::recv_grad: {
          Tensor buffer = Tensor::empty(activation_shape(c.micro));
          held[{c.micro, c.chunk - 1}].grad_out = buffer;  // posted ahead: may precede its F
          ops.push_back({ProcessGroup::P2POp::Kind::recv, buffer, c.peer, c.tag()});
          break;
        }
        default: SL_ASSERT(false);
      }
    }
    for (const WorkPtr& work : pp.batch_isend_irecv(ops)) work->wait();
    for (const Action& c : std::vector<Action>(list.begin() + static_cast<long>(i - ops.size()), list.begin() + static_cast<long>(i)))
      if (c.kind == Kind::recv_activation) held[{c.micro, c.chunk + 1}].input.set_requires_grad(true);
    for (const auto& key : sent_grads) {  // its B is done and its gradient has left
      held.at(key).input_grad_done = true;
      retire(key);
    }
    // The next stage has its own copy of a sent output; backward needs only its node (the block's
    // last op, a residual add, saves nothing), so its bytes go now (Megatron's deallocate_output_tensor).
    // Were anything to read them, it would throw ("released"), not read garbage.
    if (options.free_sent_outputs)
      for (const auto& key : sent_outputs) held.at(key).output.impl_ptr()->storage->release();
    result.events.push_back({TimelineEvent::Kind::comm, -1, -1, t0, seconds()});
  }
  SL_ASSERT(held.empty());
  return result;
}

}  // namespace sl::parallel::pipeline
