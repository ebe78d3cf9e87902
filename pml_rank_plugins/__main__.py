"""``python -m pml_rank_plugins ...`` is ``pml-rank ...``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
