"""`python -m study.cli` (what `loopstudy submit` runs on the cluster)."""

import sys

from study.cli import main

sys.exit(main())
