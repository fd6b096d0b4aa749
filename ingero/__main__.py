import sys

from ingero.cli import main

sys.exit(main())
