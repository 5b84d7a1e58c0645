"""``python -m tests.run_float64 MODULE ARGS...``: run MODULE as ``__main__`` with float64 as torch's default dtype.

The distributed tests launch the trainer through torchrun in float64 with it, so that one process
and several compare to float64 rounding (tests/test_distributed.py).
"""

import runpy
import sys

import torch

if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
