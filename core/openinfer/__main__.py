"""`python -m openinfer` is the `openinfer` command."""
import sys

from .cli import main

sys.exit(main())
