import sys
from fa4verify.cli import main
sys.exit(main())
