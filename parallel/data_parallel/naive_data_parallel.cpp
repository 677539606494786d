// naive_data_parallel.cpp — the five exchanges of DataParallel, in the order they happen.
// (The picture and the cost are in naive_data_parallel.h.)
#include "parallel/data_parallel/naive_data_parallel.h"

#include <numeric>

#include "autograd/grad_mode.h"
#include "parallel/comm/flatten.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

const char* exchange_name(Exchange exchange) {
  switch (exchange) {
    case Exchange::scatter_batch:
      return "scatter_batch";
    case Exchange::replicate_model:
      return "replicate_model";
    case Exchange::gather_outputs:
      return "gather_outputs";
    case Exchange::scatter_loss_grad:
      return "scatter_loss_grad";
    case Exchange::gather_grads:
      return "gather_grads";
  }
  return "?";
}

NaiveDataParallel::NaiveDataParallel(nn::GPT& model, const ProcessGroupPtr& group, int64_t batch_rows,
                                     int64_t block_size)
    : model_(model),
      params_(model.parameters()),
      numel_(total_numel(params_)),
      batch_rows_(batch_rows),
      block_size_(block_size) {
  // Every check runs before any communication, so all ranks fail alike instead of hanging.
  SL_CHECK(group != nullptr, "NaiveDataParallel: the process group is null");
  SL_CHECK(block_size >= 1 && block_size <= model.config().block_size, "NaiveDataParallel: block_size ", block_size,
           " must be in [1, ", model.config().block_size, "] (the model's block_size)");
  rows_per_rank_ = data_parallel_rows(batch_rows, group->rank(), group->size()).rows();
  for (const Tensor& p : params_)
    SL_CHECK(p.dtype() == DType::f32, "NaiveDataParallel: parameters must be f32 (one is ", dtype_name(p.dtype()), ")");
  // One sub-group per exchange: five ledgers, one per arrow of the picture.
  std::vector<int> everyone(group->size());
  std::iota(everyone.begin(), everyone.end(), 0);
  for (ProcessGroupPtr& g : groups_) g = group->new_group(everyone);
}

void NaiveDataParallel::replicate() {
  ProcessGroup& g = group(Exchange::replicate_model);
  Tensor flat;
  {
    MemoryScope scope(MemoryCategory::comm);
    flat = Tensor::empty(Shape({numel_}), TensorOptions{DType::f32});
  }
  NoGradGuard no_grad;
  if (g.rank() == kRoot) flatten_into(flat, params_);
  g.broadcast(flat, kRoot);
  if (g.rank() != kRoot) unflatten_from(flat, params_);
}

double NaiveDataParallel::forward_backward(const nn::Batch& batch) {
  if (root()) {
    const Shape expected({batch_rows_, block_size_});
    SL_CHECK(batch.inputs.defined() && batch.targets.defined(),
             "NaiveDataParallel: rank 0 must pass the global batch (it holds the data)");
    SL_CHECK(batch.inputs.shape() == expected && batch.targets.shape() == expected,
             "NaiveDataParallel: the batch has inputs ", batch.inputs.shape(), " and targets ", batch.targets.shape(),
             " but ", expected, " was declared at construction");
  } else {
    model_.zero_grad();  // a worker's gradient is this batch's alone: it goes to rank 0, then is dropped
  }
  Tensor my_inputs = scatter_batch(batch);    // 1. [R, T]
  replicate();                                // 2. everyone runs rank 0's current weights
  Tensor logits = model_.forward(my_inputs);  // 3. forward on my rows: [R, T, V]
  float loss = 0;
  Tensor my_logits_grad = gather_outputs_scatter_loss_grad(logits, batch.targets, loss);  // 3, 4
  // Backward from the loss gradient: my rows' share of every parameter's gradient.
  logits.backward(my_logits_grad);
  gather_grads();  // 5.
  return loss;
}

// Rank 0 sends every request before it waits on any.
static void wait_all(std::vector<WorkPtr>& pending) {
  for (WorkPtr& work : pending) work->wait();
  pending.clear();
}

// 1. scatter_batch: rank 0 sends rank r its rows of the inputs.
Tensor NaiveDataParallel::scatter_batch(const nn::Batch& batch) {
  const int n = group(Exchange::scatter_batch).size();
  const int64_t R = rows_per_rank_, T = block_size_;
  if (!root()) {
    Tensor my_inputs = Tensor::empty(Shape({R, T}), TensorOptions{DType::i64});
    group(Exchange::scatter_batch).recv(my_inputs, kRoot);
    return my_inputs;
  }
  std::vector<WorkPtr> pending;
  std::vector<Tensor> messages;
  for (int r = 1; r < n; ++r) {
    messages.push_back(batch.inputs.flat_view(r * R * T, Shape({R, T})).clone());
    pending.push_back(group(Exchange::scatter_batch).isend(messages.back(), r));
  }
  wait_all(pending);
  return batch.inputs.flat_view(0, Shape({R, T}));
}

// 3. gather_outputs: the logits go to rank 0; 4. scatter_loss_grad: rank r gets its rows of
// d loss / d logits, and the loss to report.
Tensor NaiveDataParallel::gather_outputs_scatter_loss_grad(const Tensor& logits, const Tensor& targets, float& loss) {
  const int n = group(Exchange::scatter_batch).size();
  const int64_t R = rows_per_rank_, T = block_size_, V = model_.config().vocab_size;
  if (!root()) {
    group(Exchange::gather_outputs).send(logits.detach(), kRoot);
    Tensor message = Tensor::empty(Shape({R * T * V + 1}), TensorOptions{DType::f32});
    group(Exchange::scatter_loss_grad).recv(message, kRoot);
    loss = message.data<float>()[R * T * V];
    return message.flat_view(0, Shape({R, T, V}));
  }
  std::vector<WorkPtr> pending;
  std::vector<Tensor> all_logits{logits.detach()};
  for (int r = 1; r < n; ++r) {
    all_logits.push_back(Tensor::empty(Shape({R, T, V}), TensorOptions{DType::f32}));
    pending.push_back(group(Exchange::gather_outputs).irecv(all_logits.back(), r));
  }
  wait_all(pending);
  // The loss of the whole batch, on rank 0 alone; its gradient w.r.t. the gathered logits.
  Tensor gathered = cat(all_logits, 0);  // [B, T, V], a fresh leaf
  gathered.set_requires_grad(true);
  Tensor whole_loss = cross_entropy(gathered, targets);
  whole_loss.backward();
  loss = static_cast<float>(whole_loss.item());
  Tensor logits_grad = gathered.grad();  // [B, T, V], already scaled by 1/(B·T)
  std::vector<Tensor> messages;
  for (int r = 1; r < n; ++r) {
    Tensor message = Tensor::empty(Shape({R * T * V + 1}), TensorOptions{DType::f32});
    message.flat_view(0, Shape({R, T, V})).copy_(logits_grad.flat_view(r * R * T * V, Shape({R, T, V})));
    message.flat_view(R * T * V, Shape({1})).fill_(loss);
    messages.push_back(message);
    pending.push_back(group(Exchange::scatter_loss_grad).isend(message, r));
  }
  wait_all(pending);
  return logits_grad.flat_view(0, Shape({R, T, V}));
}

// 5. gather_grads: the shares go to rank 0, which adds them to its own (in rank order).
void NaiveDataParallel::gather_grads() {
  const int n = group(Exchange::scatter_batch).size();
  if (!root()) {
    Tensor flat;
    {
      MemoryScope scope(MemoryCategory::comm);
      flat = Tensor::empty(Shape({numel_}), TensorOptions{DType::f32});
    }
    flatten_gradients_into(flat, params_);
    group(Exchange::gather_grads).send(flat, kRoot);
    model_.zero_grad();
    return;
  }
  std::vector<WorkPtr> pending;
  std::vector<Tensor> received;
  for (int r = 1; r < n; ++r) {
    MemoryScope scope(MemoryCategory::comm);
    received.push_back(Tensor::empty(Shape({numel_}), TensorOptions{DType::f32}));
    pending.push_back(group(Exchange::gather_grads).irecv(received.back(), r));
  }
  wait_all(pending);
  NoGradGuard no_grad;
  int64_t offset = 0;
  for (const Tensor& p : params_) {
    if (!p.grad().defined()) {
      MemoryScope scope(MemoryCategory::grads);
      p.set_grad(zeros(p.shape(), p.options()));
    }
    for (const Tensor& share : received) p.grad().add_(share.flat_view(offset, p.shape()));
    offset += p.numel();
  }
}

}  // namespace sl::parallel
