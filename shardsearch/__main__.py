"""`python -m shardsearch` runs the command line."""

from .cli.main import main_entry

main_entry()
