import sys

from tools.rebase.launch import main

sys.exit(main())
