"""The pure parts of the hosts' network (warmpool.harness.netns, warmpool.harness.hosts):
which names are a run's, which addresses are taken, which are handed out, a URL re-pointed.
Making namespaces needs root and runs in tests/integration/test_many_hosts.py."""

from __future__ import annotations

import ipaddress

import pytest

from warmpool.harness.hosts import via
from warmpool.harness.netns import (
    TEST_RANGE,
    NetnsUnavailable,
    free_networks,
    owned_names,
    used_networks,
)

NETNS_LIST = """wpn4242-0 (id: 3)
wpn4242-1
other-ns (id: 1)
wpnx-1
"""

LINK_LIST = """1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN
7: wpn77-3@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP
8: eth0: <BROADCAST> mtu 1500
"""


def test_only_names_of_the_runs_form_are_owned() -> None:
    assert owned_names(NETNS_LIST) == [("wpn4242-0", 4242), ("wpn4242-1", 4242)]
    assert owned_names(LINK_LIST) == [("wpn77-3", 77)]


def test_addresses_in_use_are_taken_by_their_slash_30_and_only_from_the_test_range() -> None:
    listing = ("4: eth0    inet 10.1.2.3/24 brd 10.1.2.255 scope global eth0\n"
               "9: wpn1-0    inet 198.18.0.1/30 scope global wpn1-0\n"
               "9: wpn1-1    inet 198.18.0.6/30 scope global wpn1-1\n")
    assert used_networks(listing) == {ipaddress.IPv4Network("198.18.0.0/30"),
                                      ipaddress.IPv4Network("198.18.0.4/30")}


def test_free_networks_skip_the_used_and_stay_in_the_test_range() -> None:
    used = {ipaddress.IPv4Network("198.18.0.0/30"), ipaddress.IPv4Network("198.18.0.8/30")}
    nets = free_networks(used, 3)
    assert [str(n) for n in nets] == ["198.18.0.4/30", "198.18.0.12/30", "198.18.0.16/30"]
    assert all(n.subnet_of(TEST_RANGE) for n in nets)
    with pytest.raises(NetnsUnavailable):
        free_networks(set(TEST_RANGE.subnets(new_prefix=30)), 1)


def test_a_url_is_pointed_at_a_hosts_link_keeping_its_credentials_and_db() -> None:
    assert via("redis://127.0.0.1:6379/3", "198.18.0.1", 4000) == "redis://198.18.0.1:4000/3"
    assert via("redis://:s3cret@127.0.0.1:6379/0", "198.18.0.1", 4000) == \
        "redis://:s3cret@198.18.0.1:4000/0"
