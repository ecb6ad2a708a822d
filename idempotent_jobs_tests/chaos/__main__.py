"""``python -m idempotent_jobs_tests.chaos``: run the chaos trials (see ``runner.py``)."""

import sys

from idempotent_jobs_tests.chaos.runner import main

sys.exit(main())
