#!/usr/bin/env python3
"""elementwise_torch.py -- PyTorch's side of bench/elementwise.cpp: the same ops on the same shapes,
f32, 1 thread, one JSON line per op with the best and the median of --reps runs.

  /usr/bin/python3 bench/elementwise_torch.py [--reps 50] [--warmup 5]

GELU is F.gelu(approximate="tanh") (the GPT-2 form shardlab computes), and also the exact erf form
as gelu_erf_* (the one ../shared/bench/gpt_torch.py runs in its step); softmax is over the last dim;
LayerNorm is F.layer_norm with a weight and a bias. A backward is y.backward(dy, retain_graph=True)
with the inputs' .grad cleared first, as bench/elementwise.cpp does.
"""
import argparse, json, statistics, time
import torch
import torch.nn.functional as F

B, T, C, NH = 8, 128, 256, 8


def time_it(body, reps, warmup):
    for _ in range(warmup):
        body()
    us = []
    for _ in range(reps):
        start = time.perf_counter()
        body()
        us.append((time.perf_counter() - start) * 1e6)
    return min(us), statistics.median(us)


def report(op, shape, timing):
    n = 1
    for d in shape:
        n *= d
    print(json.dumps({"bench": "elementwise", "impl": "torch", "op": op, "shape": str(list(shape)),
                      "min_us": round(timing[0], 1), "median_us": round(timing[1], 1),
                      "gelem_per_s": round(n / timing[0] / 1e3, 3)}), flush=True)


def time_backward(inputs, y, dy, reps, warmup):
    def body():
        for t in inputs:
            t.grad = None
        y.backward(dy, retain_graph=True)
    return time_it(body, reps, warmup)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    reps, warmup = args.reps, args.warmup

    hidden = (B * T, 4 * C)
    h = torch.randn(hidden, requires_grad=True)
    dh = torch.randn(hidden)
    gelu = lambda: F.gelu(h, approximate="tanh")
    report("gelu_forward", hidden, time_it(gelu, reps, warmup))
    report("gelu_backward", hidden, time_backward([h], gelu(), dh, reps, warmup))
    gelu_erf = lambda: F.gelu(h)
    report("gelu_erf_forward", hidden, time_it(gelu_erf, reps, warmup))
    report("gelu_erf_backward", hidden, time_backward([h], gelu_erf(), dh, reps, warmup))
    with torch.no_grad():
        report("exp_forward", hidden, time_it(lambda: torch.exp(h), reps, warmup))

    scores = (B * NH * T, T)
    s = torch.randn(scores, requires_grad=True)
    ds = torch.randn(scores)
    report("softmax_forward", scores, time_it(lambda: torch.softmax(s, dim=-1), reps, warmup))
    report("softmax_backward", scores, time_backward([s], torch.softmax(s, dim=-1), ds, reps, warmup))

    rows = (B * T, C)
    x = torch.randn(rows, requires_grad=True)
    weight = torch.ones(C, requires_grad=True)
    bias = torch.zeros(C, requires_grad=True)
    dx = torch.randn(rows)
    ln = lambda: F.layer_norm(x, (C,), weight, bias, 1e-5)
    report("layer_norm_forward", rows, time_it(ln, reps, warmup))
    report("layer_norm_backward", rows, time_backward([x, weight, bias], ln(), dx, reps, warmup))


if __name__ == "__main__":
    main()
