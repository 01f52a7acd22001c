import sys

from tools.rebase.cli import main

sys.exit(main())
