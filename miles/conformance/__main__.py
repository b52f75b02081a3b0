import sys

from miles.conformance.report import main

sys.exit(main())
