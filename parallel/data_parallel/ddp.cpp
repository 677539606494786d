// ddp.cpp — the reducer: buckets, gradient hooks, async all-reduces and the wait at the end of
// backward. (The picture and the cost are in ddp.h.)
#include "parallel/data_parallel/ddp.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "autograd/grad_mode.h"
#include "parallel/comm/flatten.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

using Clock = std::chrono::steady_clock;

struct Bucket {
  Tensor buffer;            // [numel] in grad_dtype: the gradients of its parameters, end to end
  std::vector<int> params;  // indices into State::params, in buffer order
  int pending = 0;          // gradients still to come in this backward
  WorkPtr work;             // its all-reduce, once launched
};

struct DistributedDataParallel::State {
  ProcessGroupPtr group;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<Tensor> views;   // views[i]: parameter i's slot in its bucket
  std::vector<int> bucket_of;  // parameter -> bucket
  std::vector<Bucket> buckets;
  bool sync_enabled = true;
  CommHook hook;  // DDPOptions::comm_hook's, built for this rank; empty: the async all-reduce

  // The synced backward in progress.
  bool in_pass = false;
  std::vector<char> got_gradient;
  size_t gradients_in = 0;
  size_t next_to_launch = 0;

  // The timeline; `finished` stamps come from the watcher thread, so under a mutex.
  mutable std::mutex mutex;
  std::condition_variable stamped;
  BackwardTimeline timeline;
  size_t finished_count = 0;
  uint64_t pass_number = 0;  // stamps of an abandoned pass (a failed backward) must not land in the next

  // The watcher: waits on each launched all-reduce in order and stamps when it completed.
  struct Watched {
    uint64_t pass;
    size_t event;
    WorkPtr work;
  };
  std::deque<Watched> to_watch;
  std::condition_variable watch_cv;
  bool stopping = false;
  std::thread watcher;

  ~State();
  void on_gradient(int i);
  void adopt_gradient(int i);
  void launch_ready_buckets();
  void finish();
  void watch_loop();
  std::string missing_gradients() const;
};

DistributedDataParallel::State::~State() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  watch_cv.notify_all();
  if (watcher.joinable()) watcher.join();
}

void DistributedDataParallel::State::watch_loop() {
  std::unique_lock lock(mutex);
  while (true) {
    watch_cv.wait(lock, [&] { return stopping || !to_watch.empty(); });
    if (to_watch.empty()) return;
    Watched watched = to_watch.front();
    to_watch.pop_front();
    lock.unlock();
    try {
      // Not the rank's blocked time; bounded by the group's timeout; a failure is rethrown to finish().
      watched.work->wait_in_background();
    } catch (...) {
    }
    Clock::time_point now = Clock::now();
    lock.lock();
    if (watched.pass != pass_number) continue;
    timeline.buckets[watched.event].finished = now;
    ++finished_count;
    stamped.notify_all();
  }
}

// AccumulateGrad added into whatever .grad was. If it was not the bucket view (the optimizer
// dropped it, so backward made a fresh tensor), the sum is copied into the bucket once.
void DistributedDataParallel::State::adopt_gradient(int i) {
  const Tensor grad = params[i].grad();
  const Tensor& view = views[i];
  if (grad.impl()->storage == view.impl()->storage && grad.impl()->storage_offset == view.impl()->storage_offset)
    return;
  NoGradGuard no_grad;
  view.copy_(grad);
  params[i].set_grad(view);
}

std::string DistributedDataParallel::State::missing_gradients() const {
  std::string missing;
  for (size_t i = 0; i < params.size(); ++i)
    if (!got_gradient[i]) missing += (missing.empty() ? "" : ", ") + names[i];
  return missing;
}

void DistributedDataParallel::State::on_gradient(int i) {
  adopt_gradient(i);
  if (!sync_enabled) return;  // no_sync: accumulate only
  if (!in_pass) {             // the first gradient of a synced backward
    in_pass = true;
    std::fill(got_gradient.begin(), got_gradient.end(), 0);
    gradients_in = 0;
    next_to_launch = 0;
    for (Bucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    std::lock_guard lock(mutex);
    timeline = BackwardTimeline{};
    timeline.first_gradient = Clock::now();
    finished_count = 0;
    ++pass_number;
  }
  SL_CHECK(!got_gradient[i], "DistributedDataParallel: parameter '", names[i],
           "' got a second gradient before the others got their first (they got none in the last backward: ",
           missing_gradients(), "); every parameter must get a gradient in every synced backward");
  got_gradient[i] = 1;
  ++gradients_in;
  if (--buckets[bucket_of[i]].pending == 0) launch_ready_buckets();
  if (gradients_in == params.size()) {
    {
      std::lock_guard lock(mutex);
      timeline.last_gradient = Clock::now();
    }
    finish();
  }
}

// Launches, in bucket order, every bucket whose gradients are all in.
void DistributedDataParallel::State::launch_ready_buckets() {
  while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
    Bucket& b = buckets[next_to_launch];
    const Clock::time_point launched = Clock::now();  // before the call: the worker may finish it at once
    if (hook) hook(b.buffer);  // synchronously, on this thread: done when it returns
    else b.work = group->all_reduce_async(b.buffer, ReduceOp::avg);
    std::lock_guard lock(mutex);
    timeline.buckets.push_back({static_cast<int>(next_to_launch), b.buffer.nbytes(), launched, {}});
    if (hook) {
      timeline.buckets.back().finished = Clock::now(), ++finished_count;
    } else {
      to_watch.push_back({pass_number, timeline.buckets.size() - 1, b.work});
      if (!watcher.joinable()) watcher = std::thread([this] { watch_loop(); });
      watch_cv.notify_all();
    }
    ++next_to_launch;
  }
}

void DistributedDataParallel::State::finish() {
  SL_ASSERT(next_to_launch == buckets.size());
  for (Bucket& b : buckets) {
    if (!b.work) continue;  // reduced by the comm hook
    b.work->wait();         // rethrows what the all-reduce failed with
    b.work.reset();
  }
  std::unique_lock lock(mutex);
  stamped.wait(lock, [&] { return finished_count == timeline.buckets.size(); });
  timeline.synchronized = Clock::now();
  in_pass = false;
}

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroupPtr group, DDPOptions options)
    : state_(std::make_shared<State>()) {
  SL_CHECK(group != nullptr, "DistributedDataParallel: the process group is null");
  SL_CHECK(options.bucket_bytes > 0, "DistributedDataParallel: bucket_bytes must be positive (got ",
           options.bucket_bytes, ")");
  State& s = *state_;
  s.group = std::move(group);
  const auto placements = module.named_placements();
  size_t index = 0;
  for (auto& [name, param] : module.named_parameters()) {
    if (options.include && !options.include(placements[index++].second)) continue;
    SL_CHECK(is_floating(param.dtype()) && (s.params.empty() || param.dtype() == s.params[0].dtype()),
             "DistributedDataParallel: parameter '", name, "' is ", dtype_name(param.dtype()), "; every parameter ",
             "must have one floating dtype (the first is ", s.params.empty() ? "-" : dtype_name(s.params[0].dtype()),
             ")");
    s.names.push_back(name);
    s.params.push_back(param);
  }
  SL_CHECK(!s.params.empty(), "DistributedDataParallel: the module has no parameters");
  const DType param_dtype = s.params[0].dtype(), grad_dtype = options.grad_dtype.value_or(param_dtype);
  SL_CHECK(is_floating(grad_dtype), "DistributedDataParallel: grad_dtype must be floating, got ", dtype_name(grad_dtype));
  const int n = static_cast<int>(s.params.size());

  // Every replica starts from rank 0's weights: one broadcast of all of them, end to end.
  {
    Tensor flat;
    {
      MemoryScope scope(MemoryCategory::comm);
      flat = Tensor::empty(Shape({total_numel(s.params)}), TensorOptions{param_dtype});
    }
    NoGradGuard no_grad;
    if (s.group->rank() == 0) flatten_into(flat, s.params);
    s.group->broadcast(flat, 0);
    if (s.group->rank() != 0) unflatten_from(flat, s.params);
  }

  // Buckets in reverse parameter order: a bucket closes once it holds bucket_bytes or more.
  std::vector<int64_t> bytes;
  for (const Tensor& p : s.params) bytes.push_back(p.numel() * static_cast<int64_t>(dtype_size(grad_dtype)));
  std::vector<std::vector<int>> members;
  for (const std::vector<size_t>& bucket : reverse_order_buckets(bytes, options.bucket_bytes))
    members.emplace_back(bucket.begin(), bucket.end());
  s.views.resize(n);
  s.bucket_of.resize(n);
  s.got_gradient.assign(n, 0);
  MemoryScope scope(MemoryCategory::grads);
  for (const std::vector<int>& indices : members) {
    Bucket bucket;
    bucket.params = indices;
    int64_t numel = 0;
    for (int i : indices) numel += s.params[i].numel();
    bucket.buffer = zeros(Shape({numel}), TensorOptions{grad_dtype});
    int64_t offset = 0;
    for (int i : indices) {
      s.views[i] = bucket.buffer.flat_view(offset, s.params[i].shape());
      s.bucket_of[i] = static_cast<int>(s.buckets.size());
      offset += s.params[i].numel();
      if (s.params[i].grad().defined()) s.views[i].copy_(s.params[i].grad());  // keep what was accumulated
      s.params[i].set_grad(s.views[i]);
    }
    s.buckets.push_back(std::move(bucket));
  }
  if (options.comm_hook) s.hook = options.comm_hook(s.group);  // collective: it may split the group
  // The hooks hold the state weakly: once this object is gone they do nothing.
  std::weak_ptr<State> weak = state_;
  for (int i = 0; i < n; ++i)
    s.params[i].register_post_accumulate_grad_hook([weak, i](Tensor&) {
      if (std::shared_ptr<State> state = weak.lock()) state->on_gradient(i);
    });
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::zero_grad() {
  synchronize();
  for (Bucket& b : state_->buckets) b.buffer.zero_();
  for (size_t i = 0; i < state_->params.size(); ++i) state_->params[i].set_grad(state_->views[i]);
}

void DistributedDataParallel::synchronize() {
  State& s = *state_;
  if (!s.in_pass) return;
  SL_CHECK(false, "DistributedDataParallel: the last backward left ", s.buckets.size() - s.next_to_launch, " of ",
           s.buckets.size(), " buckets unreduced (", s.next_to_launch,
           " in flight or done): these parameters got no gradient: ", s.missing_gradients(),
           ". Every parameter must get a gradient in every synced backward (unused parameters are not supported)");
}

void DistributedDataParallel::step(nn::Optimizer& optimizer) { synchronize(), optimizer.step(); }

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.state_->sync_enabled) {
  SL_CHECK(!ddp.state_->in_pass, "DistributedDataParallel::no_sync: a synced backward is still in progress");
  ddp.state_->sync_enabled = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.state_->sync_enabled = previous_; }
int DistributedDataParallel::num_buckets() const { return static_cast<int>(state_->buckets.size()); }

std::vector<BucketLayout> DistributedDataParallel::bucket_layout() const {
  std::vector<BucketLayout> layout;
  for (const Bucket& b : state_->buckets) {
    BucketLayout entry{b.buffer.numel(), {}};
    for (int i : b.params) entry.names.push_back(state_->names[i]);
    layout.push_back(std::move(entry));
  }
  return layout;
}

BackwardTimeline DistributedDataParallel::timeline() const {
  std::lock_guard lock(state_->mutex);
  return state_->timeline;
}

ProcessGroup& DistributedDataParallel::group() { return *state_->group; }
const std::vector<Tensor>& DistributedDataParallel::parameters() const { return state_->params; }

}  // namespace sl::parallel
