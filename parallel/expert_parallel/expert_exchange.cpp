// expert_exchange.cpp — see expert_exchange.h.
#include "parallel/expert_parallel/expert_exchange.h"

#include <numeric>

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "tensor/ledger.h"

namespace sl::parallel {

namespace {

Tensor exchanged(const Tensor& x, const ProcessGroupPtr& group, const std::vector<int64_t>& receive,
                 const std::vector<int64_t>& send) {
  Shape shape = x.shape();
  shape[0] = std::accumulate(receive.begin(), receive.end(), int64_t{0});
  Tensor out;
  {
    MemoryScope scope(MemoryCategory::comm);
    out = Tensor::empty(shape, x.options());
  }
  group->all_to_all(out, x, receive, send);
  return out;
}

struct ExchangeRowsFn : Function<ExchangeRowsFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ProcessGroupPtr& group,
                        const std::vector<int64_t>& receive, const std::vector<int64_t>& send) {
    ctx.set("group", group);
    ctx.set("receive", receive);
    ctx.set("send", send);
    return exchanged(x, group, receive, send);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // the rows go back where they came from
    return {exchanged(grads[0], ctx.get<ProcessGroupPtr>("group"), ctx.get<std::vector<int64_t>>("send"),
                      ctx.get<std::vector<int64_t>>("receive"))};
  }
};

struct ScaleGradientFn : Function<ScaleGradientFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, double scale) {
    ctx.set("scale", scale);
    return x;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {mul(grads[0], ctx.get<double>("scale"))};
  }
};

struct AttachLossFn : Function<AttachLossFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& y, const Tensor& loss, double weight) {
    ctx.set("weight", weight);
    ctx.set("loss_shape", loss.shape());
    ctx.set("loss_options", loss.options().with_requires_grad(false));
    return y;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // d(weight · loss)/d loss = weight
    return {grads[0], full(ctx.get<Shape>("loss_shape"), ctx.get<double>("weight"), ctx.get<TensorOptions>("loss_options"))};
  }
};

}  // namespace

Tensor exchange_rows(const Tensor& x, const ProcessGroupPtr& group, const std::vector<int64_t>& receive,
                     const std::vector<int64_t>& send) {
  SL_CHECK(group && static_cast<int>(receive.size()) == group->size() && static_cast<int>(send.size()) == group->size(),
           "exchange_rows: ", receive.size(), " receive and ", send.size(), " send counts for a group of ",
           group ? group->size() : 0);
  // The reverse exchange is collective: under grad mode it must run on every rank of the group, so an
  // input that needs no gradient here (a rank whose experts received no rows, while its peers' did)
  // enters as a leaf that does; its gradient is dropped.
  if (GradMode::is_enabled() && !x.requires_grad()) {
    Tensor anchored = x.detach();
    anchored.set_requires_grad(true);
    return ExchangeRowsFn::apply(anchored, group, receive, send);
  }
  return ExchangeRowsFn::apply(x, group, receive, send);
}

Tensor scale_gradient(const Tensor& x, double scale) { return ScaleGradientFn::apply(x, scale); }

Tensor attach_loss(const Tensor& y, const Tensor& loss, double weight) {
  SL_CHECK(loss.numel() == 1, "attach_loss: the loss must be a scalar, got ", loss.shape());
  return AttachLossFn::apply(y, loss, weight);
}

}  // namespace sl::parallel
