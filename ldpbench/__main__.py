from ldpbench.cli import main

raise SystemExit(main())
