import sys

from fastbert.cli import main

sys.exit(main())
