"""``python -m prefillq``: the same as the ``prefillq`` command."""

from prefillq.cli import main

main()
