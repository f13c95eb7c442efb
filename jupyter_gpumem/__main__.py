"""``python -m jupyter_gpumem``: the command line (``cli.main``)."""

from jupyter_gpumem.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
