"""``python -m tiergate``."""

from tiergate.cli import main

raise SystemExit(main())
