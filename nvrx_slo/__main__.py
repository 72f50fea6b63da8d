from nvrx_slo.cli import main

raise SystemExit(main())
