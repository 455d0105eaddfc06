#!/usr/bin/env python
"""``python generate.py ...`` is ``minilm generate ...`` (and ``python -m minilm generate ...``), kept for
running from a clone: the command lives in minilm/cli/generate.py, where ``--help`` comes from."""

import sys

from minilm.cli.generate import main

if __name__ == "__main__":
    sys.exit(main())
