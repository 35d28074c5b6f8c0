"""``python -m openclaw_cli`` runs the same CLI as the ``openclaw`` command."""

from openclaw_cli.cli import main

if __name__ == "__main__":
    main()
