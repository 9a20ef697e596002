"""examples/ as written (Monarch imports) and with xmesh imports: second half."""
from examples_runner import EXPECTED, make_tests

test_example, test_example_with_xmesh_imports = make_tests(sorted(EXPECTED)[5:])
