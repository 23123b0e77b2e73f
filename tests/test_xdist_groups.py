"""The test command's workers keep a group together (``--dist loadgroup``):
the zoo's models and ExecuTorch's LFM2 recipes are exported once per group
and shared by its tests (``xdist_group``), so a group split over the two
workers exports them twice. pytest 9.2.0 broke pytest-xdist 3.8.0's grouping
(xdist renames ``item._nodeid``, which pytest 9.2 no longer reads): every
test ran as its own unit, and the recipes' three tests exported four times."""

import pytest


@pytest.mark.xdist_group("xdist-check")
def test_loadgroup_gives_a_marked_test_its_group(request):
    # A worker's own config says "loadgroup" here (its "dist" reads "no").
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run with --dist loadgroup (scripts/test.sh runs it so)")
    assert request.node.nodeid.endswith("@xdist-check"), (
        f"{request.node.nodeid}: xdist did not put this test in its group; "
        "check the pytest and pytest-xdist pins (requirements.txt, requirements-zoo.txt)"
    )
