import sys

from idempotent_jobs_tests.cluster.runner import main

sys.exit(main())
