"""``python -m tierd.cli`` (same as the ``tierd`` console script)."""

from tierd.cli import main

main()
