"""What the tests share beyond tests/helpers.py: tiny models of the families the registry does not hold,
the contract test's families and fields, the hostile zoo and a stand-in for the Hub. Test files import
from here and from helpers, never from each other."""
