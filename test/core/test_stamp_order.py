"""Header stamps of an input in order: out-of-order delivery dropped, a sender's clock reset followed."""

from __future__ import annotations

from vla_accel_ros.core.stamp_order import StampOrder


def test_newer_and_unset_stamps_pass_a_slightly_older_one_is_dropped_a_much_older_one_followed():
    order = StampOrder(tolerance_s=0.5)
    assert order.check("image", 10.0) == (True, "")
    assert order.check("image", 10.1) == (True, "")
    assert order.check("image", 0.0) == (True, "")  # unset
    assert order.check("joint state", 9.0) == (True, "")  # each input on its own
    take, problem = order.check("image", 9.9)
    assert not take and problem.startswith("image dropped: header stamp 9.900000 is 0.200 s older")
    take, problem = order.check("image", 3.0)
    assert take and problem == "image: header stamps went back by 7.100 s (sender clock reset?); following them"
    assert order.check("image", 3.05) == (True, "")  # followed from the reset
