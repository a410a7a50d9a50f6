import sys

from . import run_demo

sys.exit(run_demo())
