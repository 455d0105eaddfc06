"""Shared test setup. Tests use tiny models, for which one thread is fastest and avoids
thread oversubscription when the suite shares the machine (subprocesses inherit it too)."""
import os

import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
