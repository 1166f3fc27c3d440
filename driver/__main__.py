"""``python -m hccc ...`` is the ``hccc`` command."""
from hccc.cli import entry

entry()
