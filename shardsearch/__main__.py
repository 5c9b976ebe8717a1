"""`python -m shardsearch` runs the command line."""

from ._cli import main_entry

main_entry()
