"""The registry's command line moved: ``python -m minilm positions list|plot ...``."""

import sys

if __name__ == "__main__":
    print("error: this command moved: use python -m minilm positions ...", file=sys.stderr)
    sys.exit(2)
