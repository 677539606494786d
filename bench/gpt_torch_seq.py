#!/usr/bin/env python3
"""gpt_torch_seq.py -- ../shared/bench/gpt_torch.py at another sequence length, the PyTorch side of
`bench/gpt_step --config B --seq-len T`: the config's model at seq T with batch B*T0/T (at least 1),
the same tokens per step, so only attention's share of the step grows.

  /usr/bin/python3 bench/gpt_torch_seq.py --config B --seq-len 512 --threads 1   (other flags: gpt_torch.py's)

Prints gpt_torch.py's JSON line; its "seq" and "batch" fields give the shape run.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench"))
import gpt_torch  # noqa: E402


def main():
    args = sys.argv[1:]
    if "--seq-len" in args:
        at = args.index("--seq-len")
        seq = int(args[at + 1])
        del args[at:at + 2]
        config = args[args.index("--config") + 1] if "--config" in args else "A"
        c = gpt_torch.CONFIGS[config]
        c["batch"] = max(1, c["batch"] * c["seq"] // seq)
        c["seq"] = seq
    sys.argv = [sys.argv[0]] + args
    gpt_torch.main()


if __name__ == "__main__":
    main()
