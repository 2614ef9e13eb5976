"""`python -m tandemrl ...` — what torchrun launches: `torchrun --nproc-per-node N -m tandemrl train ...`."""

import sys

from tandemrl.cli import main

sys.exit(main())
