"""``python -m tangram_opt`` runs the ``tangram-opt`` command line (tangram_opt.cli)."""

from tangram_opt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
