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


def test_a_stamp_from_the_future_is_refused_and_does_not_hide_the_good_ones_after_it():
    order = StampOrder(tolerance_s=0.5, future_tolerance_s=0.05)
    assert order.check("joint state", 100.0, now=100.001) == (True, "")
    assert order.check("joint state", 100.03, now=100.0) == (True, "")  # ahead, within the tolerance
    take, problem = order.check("joint state", 100.46, now=100.01)
    assert not take and problem == ("joint state refused: header stamp 100.460000 is 0.450 s ahead of the node's "
                                    "clock (future_stamp_tolerance_s = 0.05)")
    for k in range(1, 20):  # the good samples after it are all taken: it did not move "now"
        assert order.check("joint state", 100.03 + 0.01 * k, now=100.03 + 0.01 * k) == (True, "")
    assert order.check("joint state", 5.0, now=0.0)[0]  # the node's clock has not started: nothing to judge
