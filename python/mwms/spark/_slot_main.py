"""Entry point of a slot process: ``python -m mwms.spark._slot_main PAYLOAD RESULT`` (_slot.py).

A module of its own, so that _slot's classes and its strategy are those of ``mwms.spark._slot``
(not of ``__main__``): the Outcome it pickles unpickles in the parent, and
``mwms.spark.get_strategy()`` sees the strategy it made."""
import sys

from mwms.spark import _slot

if __name__ == "__main__":
    sys.exit(_slot.main(sys.argv[1:]))
