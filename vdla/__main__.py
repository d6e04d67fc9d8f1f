import sys

from vdla.cli import main

sys.exit(main())
