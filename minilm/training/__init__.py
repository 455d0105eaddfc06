"""Training: the loop (``loop``), optimisers and schedule (``optim``), the fused loss
(``losses``), exact resumption (``resume``), the run's out_dir (``outdir``) and torchrun
process groups (``distributed``)."""
from minilm.training.loop import train

__all__ = ["train"]
