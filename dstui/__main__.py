from dstui.cli import main

raise SystemExit(main())
