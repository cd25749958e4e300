"""``python -m amp_demo [--framework ...] [--steps N] [--plot PNG]``: the demo, run directly."""
import sys

from .command import main

sys.exit(main())
