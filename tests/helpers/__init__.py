"""Helpers shared by the tests: fakes for the fast tier, real parts for the testbed tier."""
