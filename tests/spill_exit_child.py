"""Run by test_spill: a script that ends right after a check whose tensors move to disk."""

import numpy as np
import torch

import nbdiff

torch.manual_seed(0)
base = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
raw = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
print(bool(nbdiff.auto_diff(base, raw, np.ones((512, 512), "float32"), spill_above_mib=0)), flush=True)
