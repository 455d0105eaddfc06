"""Training: the loop (``loop``), optimisers and schedule (``optim``), the fused loss
(``losses``), exact resumption (``resume``), the run's out_dir (``outdir``), torchrun
process groups (``distributed``), DDP and FSDP2 (``parallel``), checkpoints whole or sharded
(``saving``) and a step's memory per process (``memory``)."""

from minilm.training.loop import train

__all__ = ["train"]
