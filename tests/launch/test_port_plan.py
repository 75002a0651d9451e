"""The loopback cluster's port plan: Ray refuses a node whose fixed ports fall in its worker-port range."""

from tests.launch.local_cluster import port_plan


def test_ranges_and_single_ports_never_overlap():
    for _ in range(200):
        ranges, singles = port_plan(nodes=2, singles=5, range_size=200)
        assert [len(r) for r in ranges] == [200, 200]
        assert len(set(singles)) == 5
        taken = [p for r in ranges for p in r] + singles
        assert len(taken) == len(set(taken)), "a port is planned twice"
