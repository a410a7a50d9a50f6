"""`python -m instrument ...` is the `instrument` command."""
import sys

from .cli import main

sys.exit(main())
