"""pytest-benchmark 5.1.0 beside pytest 9.2: the fixture reads ``node._nodeid``, which pytest 9.2
no longer has (ionelmc/pytest-benchmark#321, open). Give each item the old private name for
its public node id, as others do until pytest-benchmark reads ``node.nodeid``; a no-op on a
pytest that still has it.
"""


def pytest_collection_modifyitems(items):
    for item in items:
        if not hasattr(item, "_nodeid"):
            item._nodeid = item.nodeid
