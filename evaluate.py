#!/usr/bin/env python
"""``python evaluate.py ...`` is ``minilm evaluate ...`` (and ``python -m minilm evaluate ...``), kept for
running from a clone: the command lives in minilm/cli/evaluate.py, where ``--help`` comes from."""

import sys

from minilm.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
