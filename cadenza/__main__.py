import sys

from cadenza.cli import main

sys.exit(main())
