#!/usr/bin/env python
"""``python train.py ...`` is ``minilm train ...`` (and ``python -m minilm train ...``), kept for
running from a clone: the command lives in minilm/cli/train.py, where ``--help`` comes from."""

import sys

from minilm.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
