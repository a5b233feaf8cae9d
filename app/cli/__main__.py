"""``python -m app.cli``: the ``attache`` command."""

from app.cli import main

main()
