from cacheon.cli import main

raise SystemExit(main())
